"""The run directory's files (utils/run_directory.py): one writer per run dir (a live holder
refuses a second trainer, a dead one's lock is taken over, the trainer itself refuses before any
work); the heartbeat read back as written and judged on our clock; the newest checkpoint as
utils/checkpoint.py wrote it; resume records only once their line is complete."""

from __future__ import annotations

import json
import os
import random
import re
import socket
import subprocess
import time

import pytest

from tests.train_helpers import run_main
from utils.checkpoint import begin_checkpoint, list_checkpoints, save_checkpoint
from utils.run_directory import (
    HEARTBEAT_FILE,
    LOCK_FILE,
    METRICS_FILE,
    HeartbeatWatch,
    ResumeLines,
    RunDirInUse,
    RunLock,
    checkpoints_dir,
    heartbeat_step,
    lock_holder,
    newest_checkpoint_step,
    write_heartbeat,
)


def test_a_held_lock_refuses_a_second_holder_until_released(tmp_path):
    first = RunLock(tmp_path / "run")
    assert first.acquire() is None
    holder = f"PID {os.getpid()} (host {socket.gethostname()})"
    assert lock_holder(tmp_path / "run") == holder
    with pytest.raises(RunDirInUse, match="run dir .*run is in use by " + re.escape(holder)):
        RunLock(tmp_path / "run").acquire()  # another open file: flock conflicts
    first.release()
    assert lock_holder(tmp_path / "run") is None
    second = RunLock(tmp_path / "run")
    assert second.acquire() is None  # released cleanly: nothing to take over
    second.release()


def test_the_lock_of_a_dead_run_is_taken_over_with_a_note(tmp_path):
    dead = subprocess.Popen(["sleep", "0"])
    dead.wait()
    (tmp_path / LOCK_FILE).write_text(f'{{"pid": {dead.pid}, "host": "gone-host"}}')
    assert lock_holder(tmp_path) is None
    lock = RunLock(tmp_path)
    note = lock.acquire()
    assert f"left by PID {dead.pid} (host gone-host), which is gone" in note
    assert lock_holder(tmp_path) == f"PID {os.getpid()} (host {socket.gethostname()})"
    lock.release()


def test_a_second_trainer_on_a_run_dir_in_use_exits_before_any_work(tmp_path):
    run_dir = tmp_path / "run"
    (tmp_path / "data").mkdir()
    lock = RunLock(run_dir)
    lock.acquire()
    try:
        with pytest.raises(ValueError, match=f"run dir {run_dir} is in use by PID "
                                             f"{os.getpid()}"):
            run_main([f"--data_dir={tmp_path / 'data'}", f"--tokenizer_dir={tmp_path / 'data'}",
                      f"--out_dir={run_dir}"])
    finally:
        lock.release()
    assert sorted(path.name for path in run_dir.iterdir()) == [LOCK_FILE]


def test_the_heartbeat_reads_back_as_written_and_leaves_no_temporary_file(tmp_path):
    assert heartbeat_step(tmp_path) is None
    step = random.randint(0, 10**6)
    before = time.time()
    write_heartbeat(tmp_path, step)
    beat = json.loads((tmp_path / HEARTBEAT_FILE).read_text())  # the format of design.md §2.7
    assert beat["step"] == step and before <= beat["time"] <= time.time()
    assert heartbeat_step(tmp_path) == step
    assert sorted(path.name for path in tmp_path.iterdir()) == [HEARTBEAT_FILE]


def test_a_hang_is_silence_past_the_startup_limit_then_past_the_heartbeat_limit(tmp_path):
    write_heartbeat(tmp_path, 1)  # an earlier attempt's beat does not count
    watch = HeartbeatWatch(tmp_path, startup_timeout=60.0, heartbeat_timeout=0.1)
    time.sleep(0.15)
    assert watch.overdue_seconds() is None  # silent past 0.1 s, but within the startup grace
    write_heartbeat(tmp_path, 2)
    assert watch.overdue_seconds() is None and watch.seen_beat
    time.sleep(0.15)
    silence = watch.overdue_seconds()
    assert silence is not None and silence > 0.1  # now the (shorter) heartbeat limit applies
    assert HeartbeatWatch(tmp_path, 0.0, heartbeat_timeout=0).overdue_seconds() is None


def test_the_newest_checkpoint_is_the_newest_sealed_by_utils_checkpoint(tmp_path):
    steps = sorted(random.sample(range(1, 1000), 3))
    for step in steps:
        save_checkpoint(checkpoints_dir(tmp_path), step,
                        lambda directory: (directory / "weights.bin").write_bytes(os.urandom(32)),
                        keep_last=len(steps))
    begin_checkpoint(checkpoints_dir(tmp_path), steps[-1] + 1)  # being written: not counted
    assert [step for step, _ in list_checkpoints(checkpoints_dir(tmp_path))] == steps  # reference
    assert newest_checkpoint_step(tmp_path) == steps[-1]


def test_newest_checkpoint_ignores_dirs_without_manifest(tmp_path):
    steps = sorted(random.sample(range(1, 1000), 3))
    for step in steps:
        directory = tmp_path / "ckpt" / f"step_{step:06d}"
        directory.mkdir(parents=True)
        (directory / "manifest.json").write_text(json.dumps({"step": step}))
    unfinished = tmp_path / "ckpt" / f"step_{steps[-1] + 1:06d}"
    unfinished.mkdir()
    (unfinished / "model.safetensors").write_bytes(os.urandom(64))
    assert newest_checkpoint_step(tmp_path) == steps[-1]
    assert newest_checkpoint_step(tmp_path / "empty") is None


def test_resume_lines_wait_for_a_complete_line(tmp_path):
    metrics = tmp_path / METRICS_FILE
    metrics.write_text(json.dumps({"kind": "resume", "step": 1}) + "\n")  # an earlier attempt's
    reader = ResumeLines(tmp_path)
    step = random.randint(2, 10**6)
    line = json.dumps({"kind": "resume", "step": step, "checkpoint": "c"}) + "\n"
    with open(metrics, "a") as handle:
        handle.write(json.dumps({"kind": "train", "step": 5, "loss": random.random()}) + "\n")
        handle.write(line[:7])
    assert reader.new() == []
    with open(metrics, "a") as handle:
        handle.write(line[7:])
    assert [record["step"] for record in reader.new()] == [step]
