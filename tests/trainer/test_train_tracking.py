"""The trainer's own curves reach the trackers: a tiny run with --tracker=tensorboard,wandb
(offline) is read back with each library's reader and equals metrics.jsonl, step for step;
the trainer shows `step N/M` with the time left when its output is not a terminal, an estimate
that evaluations and checkpoints do not slow; W&B goes
online after `wandb login`, and `WANDB_MODE=online` without a key is refused before any work."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import train_my_ddp
import trainer.loop_actions
import trainer.setup
from tests.train_helpers import TINY_ARGS, data_args, run_main, tiny_training_data
from tests.trainer.test_progress import FakeClock
from tests.trainer.test_trackers import _wandb_history, log_out_of_wandb, read_wandb_records
from trainer.evaluation import Evaluator
from trainer.metrics import read_metrics
from trainer.progress import TrainingProgress, format_duration
from utils.cli_errors import EXIT_BAD_INPUT
from utils.cli_errors import run_main as cli_run_main


@pytest.fixture(scope="module")
def data(tmp_path_factory, tiny_hf_tokenizer_dir) -> dict[str, Path]:
    return tiny_training_data(tmp_path_factory.getbasetemp(), tiny_hf_tokenizer_dir)


def test_tensorboard_and_wandb_get_the_curves_of_metrics_jsonl(data, tmp_path, monkeypatch,
                                                               capsys):
    log_out_of_wandb(monkeypatch, tmp_path)
    run_dir = tmp_path / "run"
    args = [*TINY_ARGS, *data_args(data, "pretrain"), f"--out_dir={run_dir}", "--max_iters=6",
            "--eval_interval=3", "--tracker=tensorboard,wandb", "--wandb_run_name=tiny"]
    assert run_main(args) == 0
    expected: dict[str, dict[int, float]] = {}
    for record in read_metrics(run_dir):
        for key, value in record.items():
            if key not in ("kind", "step", "time") and isinstance(value, (int, float)) \
                    and not isinstance(value, bool):
                expected.setdefault(f"{record['kind']}/{key}", {})[record["step"]] = value
    assert "train/loss" in expected and "eval/val_loss" in expected

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    for tag, by_step in expected.items():
        got = {event.step: event.value for event in events.Scalars(tag)}
        assert got == pytest.approx(by_step, rel=1e-6), tag

    (run_file,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    history = _wandb_history(read_wandb_records(run_file))
    curves = {tag: by_step for tag, by_step in expected.items()
              if tag.startswith(("train/", "eval/"))}
    for tag, by_step in curves.items():
        assert history.get(tag) == pytest.approx(by_step, rel=1e-9), tag

    output = capsys.readouterr().out
    assert "[progress] step 6/6 (100.0%)" in output and "left 0:00" in output


def test_wandb_online_without_a_key_is_one_line_before_any_work(data, tmp_path, monkeypatch,
                                                                 capsys):
    log_out_of_wandb(monkeypatch, tmp_path)
    monkeypatch.setenv("WANDB_MODE", "online")
    run_dir = tmp_path / "run"
    args = [*TINY_ARGS, *data_args(data, "pretrain"), f"--out_dir={run_dir}", "--max_iters=2",
            "--tracker=wandb"]
    assert cli_run_main(train_my_ddp.main, args) == EXIT_BAD_INPUT
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "--tracker=wandb" in error and "wandb login" in error
    assert not run_dir.exists()


class FakeWandbRun:
    """What the trainer calls on a W&B run, recorded instead of sent."""

    def __init__(self, **init_arguments) -> None:
        self.init_arguments = init_arguments

    def define_metric(self, *args, **kwargs) -> None:
        pass

    def log(self, values) -> None:
        pass

    def finish(self) -> None:
        pass


def test_wandb_login_in_netrc_goes_online_with_unset_options_as_none(data, tmp_path,
                                                                     monkeypatch):
    import wandb

    log_out_of_wandb(monkeypatch, tmp_path)
    netrc_file = tmp_path / "netrc"  # what `wandb login` writes
    netrc_file.write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    netrc_file.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc_file))
    runs: list[FakeWandbRun] = []
    monkeypatch.setattr(wandb, "init", lambda **kwargs: runs.append(FakeWandbRun(**kwargs))
                        or runs[-1])
    args = [*TINY_ARGS, *data_args(data, "pretrain"), f"--out_dir={tmp_path / 'run'}",
            "--max_iters=1", "--tracker=wandb"]
    assert run_main(args) == 0
    (run,) = runs
    assert run.init_arguments["mode"] == "online"
    config = run.init_arguments["config"]
    assert "init_from" in config and config["init_from"] is None
    assert "null" not in config.values()


def test_the_time_left_counts_steps_not_evaluations_or_checkpoints(data, tmp_path, monkeypatch,
                                                                    capsys):
    """On a fake clock a step takes 1 s, an evaluation 1000 s and a checkpoint 500 s: the time
    left shown is 1 s per step left, whatever was evaluated or saved before."""
    clock = FakeClock(0.0)

    def taking(seconds: float, function):
        def timed(*args, **kwargs):
            clock.now += seconds
            return function(*args, **kwargs)
        return timed

    monkeypatch.setattr(trainer.setup, "TrainingProgress",
                        functools.partial(TrainingProgress, clock=clock, use_bar=False))
    monkeypatch.setattr(train_my_ddp, "train_step", taking(1, train_my_ddp.train_step))
    monkeypatch.setattr(Evaluator, "__call__", taking(1000, Evaluator.__call__))
    monkeypatch.setattr(trainer.loop_actions, "save_training_checkpoint",
                        taking(500, trainer.loop_actions.save_training_checkpoint))
    args = [*TINY_ARGS, *data_args(data, "pretrain"), f"--out_dir={tmp_path / 'run'}",
            "--max_iters=6", "--eval_interval=2", "--save_interval=3"]
    assert run_main(args) == 0
    shown = re.findall(r"\[progress\] step (\d)/6 .* left (\S+)", capsys.readouterr().out)
    assert [int(step) for step, _ in shown] == [1, 3, 4, 5, 6]  # a line per 30 s of the clock
    for step, left in shown:
        assert left == format_duration(6 - int(step))
