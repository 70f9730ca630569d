"""How far a training run is and when it will end: `step N/M`, tokens/s, loss and time left.

Two faces, one estimate:
- on a terminal, a tqdm bar that the trainer's other lines are printed above (`write`);
- otherwise (the monitor's log, CI, `> file`), a plain line every `every_s` seconds and at the
  last step, which a log keeps readably (a bar would be thousands of carriage returns):

      [progress] step 120/300 (40.0%)  tokens/s 12.3k  loss 2.4100  elapsed 1:02  left 1:33

Time left = (seconds spent stepping since the start or the resume) / (steps done since then)
x (steps left). Evaluation, sample generation and checkpoints run inside `paused()` and are not
stepping: early in a run one evaluation can take as long as many steps, and counting it made
the estimate 2-3x too long. (So the estimate is the remaining steps' time; evaluations and
checkpoints still to come add theirs.) A resumed run counts from the resume point: the steps a
previous process ran, and the time it took, say nothing about this process's speed (tqdm's
`initial` does the same for the bar).
Only rank 0 shows progress; `enabled=False` gives an object that does nothing.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO


def format_duration(seconds: float) -> str:
    """61 -> "1:01", 3725 -> "1:02:05" (as tqdm writes times)."""
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def format_rate(tokens_per_s: float) -> str:
    """12345 -> "12.3k" (3 significant figures are all a reader takes in)."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if tokens_per_s >= scale:
            return f"{tokens_per_s / scale:.1f}{suffix}"
    return f"{tokens_per_s:.0f}"


class TrainingProgress:
    """Call `update(step, ...)` after each optimizer step; `write(line)` for any other output;
    `close()` at the end."""

    def __init__(self, total_steps: int, start_step: int = 0, enabled: bool = True,
                 every_s: float = 30.0, stream: TextIO | None = None,
                 use_bar: bool | None = None, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.total_steps, self.start_step, self.enabled = total_steps, start_step, enabled
        self.every_s, self.clock = every_s, clock
        self.stream = stream or sys.stdout
        self.started = clock()
        self.paused_s = 0.0  # time inside `paused()`: not stepping
        self.last_line_at = -float("inf")
        self._bar: Any = None
        if enabled and (self.stream.isatty() if use_bar is None else use_bar):
            from tqdm import tqdm
            self._bar = tqdm(total=total_steps, initial=start_step, unit="step",
                             file=self.stream, dynamic_ncols=True)

    def seconds_left(self, step: int) -> float | None:
        """The estimate from this process's own pace; None before its first step."""
        done = step - self.start_step
        if done <= 0:
            return None
        stepping_s = self.clock() - self.started - self.paused_s
        return stepping_s / done * (self.total_steps - step)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Time spent inside (an evaluation, a checkpoint) does not count toward the step rate,
        here or on the bar."""
        began = self.clock()
        try:
            yield
        finally:
            self.paused_s += self.clock() - began
            if self._bar is not None:
                self._bar.unpause()

    def line(self, step: int, tokens_per_s: float, loss: float) -> str:
        left = self.seconds_left(step)
        return (f"[progress] step {step}/{self.total_steps} "
                f"({100 * step / max(self.total_steps, 1):.1f}%)  "
                f"tokens/s {format_rate(tokens_per_s)}  loss {loss:.4f}  "
                f"elapsed {format_duration(self.clock() - self.started)}  "
                f"left {'?' if left is None else format_duration(left)}")

    def update(self, step: int, tokens_per_s: float, loss: float) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_postfix({"tok/s": format_rate(tokens_per_s), "loss": f"{loss:.4f}"},
                                  refresh=False)  # shown by the update
            self._bar.update(step - self._bar.n)
            return
        now = self.clock()
        if now - self.last_line_at >= self.every_s or step >= self.total_steps:
            self.last_line_at = now
            print(self.line(step, tokens_per_s, loss), file=self.stream, flush=True)

    def write(self, text: str) -> None:
        """Print a line of other output (above the bar on a terminal)."""
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
