"""A run directory never loses a run: a fresh run refuses one that holds another run (or moves
it aside with --overwrite), a resume cannot change the model's shape, and a stop signal to
the whole process group (workers included) still ends with a checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import train_my_ddp
from tests.train_helpers import TINY_ARGS, data_args, run_main, tiny_training_data
from trainer.metrics import read_metrics
from utils.checkpoint import list_checkpoints
from utils.cli_errors import EXIT_BAD_INPUT
from utils.cli_errors import run_main as cli_run_main

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def data(tmp_path_factory, tiny_hf_tokenizer_dir) -> dict[str, Path]:
    return tiny_training_data(tmp_path_factory.getbasetemp(), tiny_hf_tokenizer_dir)


def _args(data, *extra: str) -> list[str]:
    return [*TINY_ARGS, *data_args(data, "pretrain"), "--eval_interval=1000",
            '--eval_prompts=[]', *extra]


def _steps(run_dir: Path) -> list[int]:
    return [step for step, _ in list_checkpoints(run_dir / "ckpt")]


def test_a_fresh_run_refuses_a_used_run_dir_and_overwrite_moves_it_aside(data, tmp_path,
                                                                          capsys):
    run_dir = tmp_path / "pre"
    assert run_main(_args(data, f"--out_dir={run_dir}", "--max_iters=6",
                          "--save_interval=3")) == 0
    before = {path: path.stat().st_mtime_ns for path in run_dir.rglob("*") if path.is_file()}
    again = _args(data, f"--out_dir={run_dir}", "--max_iters=4", "--save_interval=2",
                  "--keep_last=2")
    assert cli_run_main(train_my_ddp.main, again) == EXIT_BAD_INPUT
    message = capsys.readouterr().err
    assert "holds another run (checkpoints up to step 6 and metrics.jsonl)" in message
    assert "--resume" in message and "--overwrite" in message
    assert {path: path.stat().st_mtime_ns for path in run_dir.rglob("*")
            if path.is_file()} == before  # nothing written, nothing lost

    assert run_main([*again, "--overwrite"]) == 0
    (moved,) = tmp_path.glob("pre.old-*")
    assert _steps(moved) == [3, 6]  # the earlier run, whole
    assert _steps(run_dir) == [2, 4]
    assert {record["step"] for record in read_metrics(run_dir)
            if record["kind"] == "train"} == {1, 2, 3, 4}  # the new run's metrics only


def test_pruning_never_removes_the_checkpoint_just_written(tmp_path):
    from utils.checkpoint import begin_checkpoint, finish_checkpoint

    for step in (300, 320, 2, 4):  # a later run's steps written beside an earlier run's
        tmp_dir = begin_checkpoint(tmp_path, step)
        (tmp_dir / "weights.bin").write_bytes(os.urandom(16))
        finish_checkpoint(tmp_dir, step, keep_last=2)
    assert [step for step, _ in list_checkpoints(tmp_path)] == [2, 4, 300, 320]


def test_resume_refuses_a_change_of_the_model_shape_before_writing(data, tmp_path):
    run_dir = tmp_path / "run"
    assert run_main(_args(data, f"--out_dir={run_dir}", "--max_iters=2")) == 0
    config = (run_dir / "config.json").read_text()
    for change, saved in (("--hidden_size=64", "32"), ("--max_seq_len=64", "32")):
        with pytest.raises(ValueError, match=f"--resume cannot change {change}.*has {saved}"):
            run_main(_args(data, f"--out_dir={run_dir}", "--resume", "--max_iters=4", change))
    assert (run_dir / "config.json").read_text() == config
    assert json.loads(config)["hidden_size"] == 32


def test_sigterm_to_the_process_group_with_workers_still_checkpoints(data, tmp_path):
    """What a supervisor, SLURM or Kubernetes does: SIGTERM to every process of the job, the
    DataLoader workers included. The workers leave the stop to the trainer."""
    run_dir = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "train_my_ddp.py", *_args(data, f"--out_dir={run_dir}",
                                                   "--max_iters=100000",
                                                   "--save_interval=100000",
                                                   "--num_workers=2")],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 180
    while process.poll() is None and not _heartbeat_step(run_dir):
        assert time.monotonic() < deadline, "the run made no step"
        time.sleep(0.1)
    os.killpg(process.pid, signal.SIGTERM)
    returncode = process.wait(timeout=120)
    assert returncode == 128 + signal.SIGTERM, process.stderr.read().decode()
    assert _steps(run_dir), "no checkpoint was written"


def _heartbeat_step(run_dir: Path) -> int:
    try:
        return json.loads((run_dir / "heartbeat").read_text())["step"]
    except (OSError, ValueError):
        return 0
