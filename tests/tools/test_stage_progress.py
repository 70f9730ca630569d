"""The demo's progress bar: fed by the trainer's step lines, other lines passed through."""

from __future__ import annotations

import subprocess

import pytest

from tools.demo import stages
from tools.stage_progress import STEP_LINE, run_with_progress, training_steps

FAKE_TRAINER = """
import sys
print("effective batch: 16 sequences")
for step in (10, 20, 30):
    print(f"[train] step {step}  lr 0.003  loss {5 - step / 10:.4f}  step_time 0.01")
print("[eval] step 30  val_loss 2.5")
sys.exit(int(sys.argv[1]))
"""


def test_training_steps_of_the_demo_stages():
    argv = dict(stages())
    assert training_steps(argv["corpus"]) is None
    assert training_steps(argv["sft"]) == int(next(a for a in argv["sft"]
                                                   if a.startswith("--max_iters="))[12:])
    assert training_steps(["train_my_ddp.py", "--max_iters=700", "--stop_at_iter=50"]) == 50


def test_step_lines_move_the_bar_and_other_lines_are_printed(capsys):
    assert run_with_progress(["-c", FAKE_TRAINER, "0"], total_steps=30, label="fake") == 30
    out = capsys.readouterr().out
    assert "effective batch: 16 sequences" in out and "[eval] step 30  val_loss 2.5" in out
    assert "[train] step" not in out  # shown as the bar, not as lines
    match = STEP_LINE.match("[train] step 120  lr 0.003  grad_norm 0.5  loss 2.4100  x 1")
    assert match[1] == "120" and match[2] == "2.4100"


def test_a_failing_stage_raises_like_subprocess_run():
    with pytest.raises(subprocess.CalledProcessError):
        run_with_progress(["-c", FAKE_TRAINER, "3"], total_steps=30, label="fake")
