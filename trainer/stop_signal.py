"""A graceful stop: SIGTERM / SIGINT / SIGHUP end the run at a step boundary, with a checkpoint."""

from __future__ import annotations

import os
import signal
import time
from typing import Any


class StopSignal:
    """While active, SIGTERM / SIGINT / SIGHUP only set a flag: the loop finishes the step, all
    ranks agree to stop, save a checkpoint and exit with 128 + signal (so a supervisor knows the
    run is not finished). SIGHUP is what a run started over ssh gets when the connection (or
    `monitor_process.py --remote`) goes away. The flag is read after each step, so a very
    long step delays the stop: a second signal ends the process at once, by the signal's
    default action (the newest checkpoint is intact; `monitor_process.py` sends it, or
    SIGKILL, after `--kill_grace`). A repeat within REPEAT_GRACE_S is the same request, not a
    second one: under torchrun a supervisor's SIGTERM reaches each rank twice, directly and
    forwarded by the agent. The previous handlers come back on exit."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    REPEAT_GRACE_S = 1.0

    def __enter__(self) -> StopSignal:
        self.received: int | None = None
        self._received_at = 0.0
        self._previous = {signum: signal.signal(signum, self._handle) for signum in self.SIGNALS}
        return self

    def __exit__(self, *exc_info: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received is None:
            self.received, self._received_at = signum, time.monotonic()
        elif time.monotonic() - self._received_at > self.REPEAT_GRACE_S:
            signal.signal(signum, signal.SIG_DFL)  # asked again: stop now, mid-step
            os.kill(os.getpid(), signum)

    def exit_code(self) -> int:
        """128 + the signal, as a shell reports a process ended by it."""
        return 128 + (self.received or signal.SIGTERM)

    def name(self) -> str:
        return signal.Signals(self.received or signal.SIGTERM).name
