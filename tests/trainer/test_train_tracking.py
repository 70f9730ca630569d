"""The trainer's own curves reach the trackers: a tiny run with --tracker=tensorboard,wandb
(offline) is read back with each library's reader and equals metrics.jsonl, step for step;
and the trainer shows `step N/M` with the time left when its output is not a terminal."""

from __future__ import annotations

from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.train_helpers import TINY_ARGS, data_args, run_main, tiny_training_data
from tests.utils.test_trackers import _wandb_history, read_wandb_records
from trainer.metrics import read_metrics


@pytest.fixture(scope="module")
def data(tmp_path_factory, tiny_hf_tokenizer_dir) -> dict[str, Path]:
    return tiny_training_data(tmp_path_factory.getbasetemp(), tiny_hf_tokenizer_dir)


def test_tensorboard_and_wandb_get_the_curves_of_metrics_jsonl(data, tmp_path, monkeypatch,
                                                               capsys):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
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
