"""What the trainer prints on a terminal: its other lines go above tqdm's bar, each on a line
of its own (trainer/progress.py `write`), never glued onto the bar's line."""

from __future__ import annotations

import io
import sys

from tests.train_helpers import TINY_ARGS, data_args, run_main


class Terminal(io.StringIO):
    """stdout as a terminal: the trainer then draws tqdm's bar (carriage returns and all)."""

    def isatty(self) -> bool:
        return True


def test_sample_lines_are_not_glued_onto_the_progress_bar(data, tmp_path, monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    assert run_main([*TINY_ARGS, *data_args(data, "pretrain"), f"--out_dir={tmp_path / 'run'}",
                     "--max_iters=2", "--eval_interval=1", "--eval_at_start=false"]) == 0
    screen_lines = [line.rsplit("\r", 1)[-1] for line in terminal.getvalue().split("\n")]
    samples = [line for line in screen_lines if "[sample]" in line]
    assert samples and all(line.startswith("  [sample] ") for line in samples), samples
