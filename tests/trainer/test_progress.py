"""Training progress: the ETA from this process's own pace (counted from a resume), plain lines
off a terminal, tqdm's bar on one."""

from __future__ import annotations

import io
import random
import re

import pytest

from trainer.progress import TrainingProgress, format_duration, format_rate


class FakeClock:
    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def test_format_duration_and_rate():
    assert [format_duration(s) for s in (0, 59.6, 61, 3725)] == ["0:00", "1:00", "1:01",
                                                                   "1:02:05"]
    assert [format_rate(r) for r in (999, 12345, 2.5e6)] == ["999", "12.3k", "2.5M"]


@pytest.mark.parametrize("start_step", [0, 137])
def test_plain_lines_give_the_eta_from_this_process_pace(start_step):
    rng = random.Random(start_step)
    total, clock, out = 400, FakeClock(rng.uniform(0, 1e5)), io.StringIO()
    progress = TrainingProgress(total, start_step=start_step, every_s=10.0, stream=out,
                                use_bar=False, clock=clock)
    began, shown = clock.now, []
    for step in range(start_step + 1, total + 1):
        clock.now += rng.uniform(0.5, 1.5)  # seconds per step
        loss = rng.uniform(1, 5)
        progress.update(step, tokens_per_s=2048 / 0.9, loss=loss)
        if clock.now - (shown[-1][1] if shown else -1e9) >= 10.0 or step == total:
            expected_left = (clock.now - began) / (step - start_step) * (total - step)
            shown.append((step, clock.now, loss, expected_left))
    lines = out.getvalue().splitlines()
    assert len(lines) == len(shown)
    for line, (step, now, loss, left) in zip(lines, shown):
        match = re.fullmatch(r"\[progress\] step (\d+)/400 \((\S+)%\)  tokens/s 2\.3k  "
                             r"loss (\S+)  elapsed (\S+)  left (\S+)", line)
        assert match, line
        assert int(match[1]) == step and float(match[2]) == pytest.approx(100 * step / total,
                                                                         abs=0.051)
        assert float(match[3]) == pytest.approx(loss, abs=5e-5)
        assert match[4] == format_duration(now - began) and match[5] == format_duration(left)
    assert lines[-1].startswith("[progress] step 400/400") and lines[-1].endswith("left 0:00")


def test_no_estimate_before_the_first_step_of_this_process():
    progress = TrainingProgress(50, start_step=20, stream=io.StringIO(), use_bar=False,
                                clock=FakeClock(5.0))
    assert progress.seconds_left(20) is None and progress.line(20, 1.0, 2.0).endswith("left ?")


def test_bar_on_a_terminal_starts_at_the_resume_step_and_writes_above_itself():
    out = io.StringIO()
    progress = TrainingProgress(80, start_step=30, stream=out, use_bar=True)
    progress.update(31, tokens_per_s=5e4, loss=3.25)
    progress.write("[eval] step 31  val_loss 3.3")
    progress.update(40, tokens_per_s=5e4, loss=3.0)
    progress.close()
    text = out.getvalue()
    assert "31/80" in text and "40/80" in text and "loss=3.0000" in text
    assert "[eval] step 31  val_loss 3.3\n" in text


def test_disabled_progress_prints_nothing():
    out = io.StringIO()
    progress = TrainingProgress(10, enabled=False, stream=out, use_bar=False)
    progress.update(10, 1.0, 1.0)
    progress.close()
    assert out.getvalue() == ""


def test_time_inside_paused_does_not_count_toward_the_step_rate():
    clock = FakeClock(100.0)
    progress = TrainingProgress(10, stream=io.StringIO(), use_bar=False, clock=clock)
    for step in (1, 2):
        clock.now += 3.0  # a step
        with progress.paused():
            clock.now += 1000.0  # an evaluation or a checkpoint
        progress.update(step, tokens_per_s=1.0, loss=1.0)
    assert progress.seconds_left(2) == pytest.approx(3.0 * 8)
    assert progress.line(2, 1.0, 1.0).endswith(f"elapsed {format_duration(2006)}  left 0:24")
