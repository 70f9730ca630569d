"""Trackers: TensorBoard and W&B (offline) receive the scalars we log, read back with each
library's own reader, across a resume."""

from __future__ import annotations

import json
import random
import struct
import time
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2
from wandb.proto import wandb_internal_pb2

from trainer.trackers import TrackerOptions, Trackers, parse_tracker_list

CONFIG = {"learning_rate": 6e-4, "max_iters": 30, "task_type": "pretrain",
          "betas": [0.9, 0.95], "compile": False}


def log_out_of_wandb(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No W&B key anywhere: neither in the environment nor in a netrc file (the developer's own
    `wandb login` must not send a test online)."""
    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no_netrc"))


def _log_run(trackers: Trackers, steps: range, rng: random.Random) -> dict[str, dict[int, float]]:
    """Log a train record every step and an eval record every 5th, like the trainer; return
    what was logged as {tag: {step: value}}."""
    logged: dict[str, dict[int, float]] = {}
    for step in steps:
        records = [("train", {"loss": rng.uniform(1, 9), "lr": rng.uniform(0, 1e-3),
                              "tokens": rng.randint(1, 10**6), "note": "text is skipped"})]
        if step % 5 == 0:
            records.append(("eval", {"val_loss": rng.uniform(1, 9), "nan_free": True}))
        for kind, values in records:
            trackers.log(kind, step, values)
            for key, value in values.items():
                if not isinstance(value, (bool, str)):
                    logged.setdefault(f"{kind}/{key}", {})[step] = value
    trackers.close()
    return logged


@pytest.mark.parametrize("spec, expected", [("tensorboard", ["tensorboard"]),
                                            ("wandb, tensorboard", ["wandb", "tensorboard"]),
                                            ("none", [])])
def test_parse_tracker_list(spec, expected):
    assert parse_tracker_list(spec) == expected


@pytest.mark.parametrize("spec", ["tensorbord", "", "none,wandb"])
def test_bad_tracker_list_names_the_option(spec):
    with pytest.raises(ValueError, match="--tracker"):
        parse_tracker_list(spec)


def test_disabled_trackers_write_nothing(tmp_path):
    trackers = Trackers(TrackerOptions("tensorboard,wandb"), tmp_path, CONFIG, enabled=False)
    trackers.log("train", 1, {"loss": 1.0})
    trackers.close()
    assert list(tmp_path.iterdir()) == []


def test_tensorboard_gets_the_same_curves_and_a_resume_continues_them(tmp_path):
    rng = random.Random(3)
    first = _log_run(Trackers(TrackerOptions("tensorboard"), tmp_path, CONFIG), range(0, 23), rng)
    # The first run crashed after step 22; its last checkpoint was step 15, where it resumes.
    # Like the trainer, the second invocation opens its trackers before it knows that.
    trackers = Trackers(TrackerOptions("tensorboard"), tmp_path, {**CONFIG, "resume": True})
    trackers.log("resume", 15, {"checkpoint": "ckpt/step_000015"})
    second = _log_run(trackers, range(15, 30), rng)
    expected = {tag: {**{s: v for s, v in first[tag].items() if s < 15}, **second[tag]}
                for tag in first}

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == sorted(expected)
    for tag, by_step in expected.items():
        got = {event.step: event.value for event in events.Scalars(tag)}
        assert len(events.Scalars(tag)) == len(got)  # the crashed run's steps 15-22 purged
        assert got == pytest.approx(by_step, rel=1e-6)  # stored as float32
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    session = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    assert session.hparams["learning_rate"].number_value == pytest.approx(6e-4)
    assert session.hparams["task_type"].string_value == "pretrain"
    assert session.hparams["compile"].bool_value is False
    assert json.loads(session.hparams["betas"].string_value) == [0.9, 0.95]
    assert "resume" not in session.hparams  # the first invocation's config, written once


def read_wandb_records(path: Path) -> list[wandb_internal_pb2.Record]:
    """The records of a `.wandb` file: a 7-byte header (":W&B", magic, version), then the
    LevelDB log format (32 KiB blocks of chunks: crc32c, length, type FULL/FIRST/MIDDLE/LAST)
    whose payloads are wandb's own protobuf `Record`s."""
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, position, pending, records = 32768, 7, b"", []
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a header is padding
            position += block - position % block
            continue
        _, length, chunk_type = struct.unpack("<IHB", data[position:position + 7])
        if chunk_type == 0 or position + 7 + length > len(data):
            break  # the end, or a chunk wandb-core is still writing (read again later)
        pending += data[position + 7:position + 7 + length]
        position += 7 + length
        if chunk_type in (1, 4):  # FULL or LAST: a whole record
            records.append(wandb_internal_pb2.Record.FromString(pending))
            pending = b""
    return records


def _wandb_history(records) -> dict[str, dict[int, float]]:
    history: dict[str, dict[int, float]] = {}
    for record in records:
        if record.WhichOneof("record_type") != "history":
            continue
        row = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
               for item in record.history.item}
        for key, value in row.items():
            if not key.startswith("_") and key != "step":
                history.setdefault(key, {})[row["step"]] = value
    return history


def _records_once_written(path: Path, logged: dict, timeout_s: float = 60.0) -> list:
    """The records of a `.wandb` file once its run record and all of `logged` are in it:
    wandb-core, a process of its own shared by every run of this process, writes the file, and
    on a loaded machine (the full suite, seen twice) the file was still empty when `finish()`
    had returned. Waits at most `timeout_s`, then returns what is there for the asserts."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = read_wandb_records(path)
        has_run = any(record.WhichOneof("record_type") == "run" for record in records)
        if (has_run and _wandb_history(records) == logged) or time.monotonic() > deadline:
            return records
        time.sleep(0.5)


def test_wandb_offline_gets_the_same_curves_and_a_resume_reuses_the_run(tmp_path, monkeypatch):
    log_out_of_wandb(monkeypatch, tmp_path)
    rng = random.Random(4)
    options = TrackerOptions("wandb", wandb_project="proj", wandb_run_name="tiny")
    first = _log_run(Trackers(options, tmp_path, CONFIG), range(0, 12), rng)
    time.sleep(1 - time.time() % 1)  # each session's folder is named after its start second
    trackers = Trackers(options, tmp_path, CONFIG)
    trackers.log("resume", 8, {"checkpoint": "ckpt/step_000008"})
    second = _log_run(trackers, range(8, 16), rng)

    run_files = sorted((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(run_files) == 2  # offline: nothing uploaded, two sessions of one run
    run_id = (tmp_path / "wandb_run_id").read_text().strip()
    for run_file, logged in zip(run_files, [first, second]):
        records = _records_once_written(run_file, logged)
        run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
        assert (run.run_id, run.project, run.display_name) == (run_id, "proj", "tiny")
        config = {item.key: json.loads(item.value_json) for r in records
                  if r.WhichOneof("record_type") in ("run", "config")
                  for item in (r.run.config if r.HasField("run") else r.config).update}
        assert {key: config[key] for key in CONFIG} == {**CONFIG, "betas": "[0.9, 0.95]"}
        assert _wandb_history(records) == logged
