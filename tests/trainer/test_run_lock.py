"""One writer per run dir: a live holder refuses a second trainer; a dead one's lock is taken
over; the trainer itself refuses before doing any work."""

from __future__ import annotations

import os
import re
import socket
import subprocess

import pytest

from tests.train_helpers import run_main
from trainer.run_lock import LOCK_FILE, RunDirInUse, RunLock, lock_holder


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
    lock = RunLock(run_dir)
    lock.acquire()
    try:
        with pytest.raises(ValueError, match=f"run dir {run_dir} is in use by PID "
                                             f"{os.getpid()}"):
            run_main([f"--data_dir={tmp_path}", f"--tokenizer_dir={tmp_path}",
                      f"--out_dir={run_dir}"])
    finally:
        lock.release()
    assert sorted(path.name for path in run_dir.iterdir()) == [LOCK_FILE]
