"""One writer per run directory: the trainer holds an exclusive lock on `<run>/.lock`.

Two trainers on one `--out_dir` (started twice by mistake, or orphaned ranks of a killed
launcher still going while the supervisor restarts the run) would delete each other's
temporary checkpoints and interleave their logs. So before it writes anything, rank 0 takes
`fcntl.flock(LOCK_EX | LOCK_NB)` on `<run>/.lock` and keeps it for the run's life, with its
PID and host written in the file; a second trainer gets `RunDirInUse` naming the holder.

The kernel drops a flock when its holder dies, however it dies (kill -9 included), so a lock
is never stuck (forked DataLoader workers share it until they see their parent gone,
within ~5 s): a file that still names a holder but is not locked was left by a run that
died, and the next run takes it over with a note. `monitor_process.py` asks `lock_holder`
before it (re)starts a run. flock is enforced on local filesystems and NFSv4 (Linux emulates
it with byte-range locks there); other network filesystems may not enforce it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from pathlib import Path

LOCK_FILE = ".lock"


class RunDirInUse(RuntimeError):
    """Another live process holds the run directory's lock."""


def _describe(record: str) -> str:
    try:
        holder = json.loads(record)
        return f"PID {holder['pid']} (host {holder['host']})"
    except (ValueError, KeyError, TypeError):
        return "another process (its lock file names none)"


def _try_lock(handle: int) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


class RunLock:
    """`acquire()` -> a note if a dead run's lock was taken over (else None); `release()`."""

    def __init__(self, run_dir: str | os.PathLike, file_name: str = LOCK_FILE):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / file_name  # another name: another role (the supervisor's)
        self._handle: int | None = None

    def acquire(self) -> str | None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        handle = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        previous = os.pread(handle, 4096, 0).decode(errors="replace")
        if not _try_lock(handle):
            os.close(handle)
            raise RunDirInUse(f"run dir {self.run_dir} is in use by {_describe(previous)}; "
                              "stop that run first or choose another --out_dir")
        self._handle = handle
        record = json.dumps({"pid": os.getpid(), "host": socket.gethostname()})
        os.ftruncate(handle, 0)
        os.pwrite(handle, record.encode(), 0)
        if previous.strip():
            return (f"note: {self.path} was left by {_describe(previous)}, which is gone; "
                    "taking it over")
        return None

    def release(self) -> None:
        """Unlock (the file stays: removing it would race with a trainer opening it)."""
        if self._handle is not None:
            os.ftruncate(self._handle, 0)
            # Unlock explicitly: a forked child (a DataLoader worker) shares the lock until
            # every copy of the descriptor is closed.
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            os.close(self._handle)
            self._handle = None


def lock_holder(run_dir: str | os.PathLike) -> str | None:
    """"PID N (host H)" of the live process holding `run_dir`'s lock, or None if it is free."""
    path = Path(run_dir) / LOCK_FILE
    try:
        handle = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        if _try_lock(handle):
            return None  # closing below unlocks again
        return _describe(os.pread(handle, 4096, 0).decode(errors="replace"))
    finally:
        with contextlib.suppress(OSError):
            os.close(handle)
