"""The run directory's contract: the files a trainer writes and a supervisor reads, in one place.

A training run lives in one directory (`--out_dir`, docs/design.md §2.7). The trainer and
`monitor_process.py` never talk to each other; they only share these files, so both read and
write them through this module, and a file name or format exists once:

    out/<run>/z2all_run.json                 {"format": "z2all run directory", "version": 1}:
                                             the directory holds a z2all run (written right
                                             after .lock is taken, before anything else)
    out/<run>/.lock                          {"pid": 4242, "host": "node7"}; rank 0 holds an
                                             exclusive flock on it for the run's life
    out/<run>/heartbeat                      {"step": 1234, "time": 1795309463.3}, rewritten by
                                             rank 0 after every step
    out/<run>/ckpt/step_001200/manifest.json {"step": 1200, ...} written last: a checkpoint dir
                                             without it is unfinished (utils/checkpoint.py)
    out/<run>/metrics.jsonl                  {"kind": "resume", "step": 1200, "checkpoint": ...}
                                             appended by the trainer when it resumes
    out/<run>/.monitor.lock, monitor.log     the supervisor's lock and events (monitor_process.py)
    out/<run>/nodes/<node>.monitor.lock|.log the same, per node, when each node of a multi-node
                                             run has its own supervisor (`supervisor_files`)

The module has four parts:
1. the lock (`RunLock`, `lock_holder`): one writer per run directory, and `run_dir_moved`,
   the error a trainer stops with once the directory it locked was moved;
2. the heartbeat (`write_heartbeat`, `heartbeat_step`, `HeartbeatWatch`): "slow" or "hung";
3. the checkpoints index (`checkpoints_dir`, `newest_checkpoint_step`): how far a restart
   would resume from;
4. the resume records (`ResumeLines`): the trainer confirming where it resumed.
Every name a run writes, and who owns a directory (a run writes only into one of its own),
are in utils/run_ownership.py.

Why a lock. Two trainers on one run directory (started twice by mistake, or orphaned ranks of
a killed launcher still going while the supervisor restarts the run) would delete each other's
temporary checkpoints and interleave their logs. So before it writes anything, rank 0 takes
`fcntl.flock(LOCK_EX | LOCK_NB)` on `.lock` and keeps it, with its PID and host written in
the file; a second trainer gets `RunDirInUse` naming the holder. The kernel drops a flock when
its holder dies, however it dies (kill -9 included), so a lock is never stuck (forked
DataLoader workers share it until they see their parent gone, within ~5 s): a file that still
names a holder but is not locked was left by a run that died, and the next run takes it over
with a note. flock is enforced on local filesystems and NFSv4 (Linux emulates it with
byte-range locks there); other network filesystems may not enforce it.

Nothing here imports torch or the trainer: the supervisor reads files only.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from utils.checkpoint import MANIFEST, list_checkpoints

LOCK_FILE = ".lock"
HEARTBEAT_FILE = "heartbeat"
CHECKPOINTS_DIR = "ckpt"
METRICS_FILE = "metrics.jsonl"
MONITOR_LOG = "monitor.log"
SUPERVISOR_LOCK_FILE = ".monitor.lock"
SHARED_CHECK_FILE = "shared_filesystem_check"  # trainer/shared_filesystem.py
NODES_DIR = "nodes"  # a multi-node run's supervisors, one lock and log per node
RUN_MARKER = "z2all_run.json"  # the marker: who owns a directory, utils/run_ownership.py
MARKER = {"format": "z2all run directory", "version": 1}


def read_json_or_none(path: Path) -> dict | None:
    """A JSON object from `path`, or None if it is missing, torn or not an object."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


# ---- 1. the lock: one writer per run directory -------------------------------------------------

class RunDirInUse(RuntimeError):
    """Another live process holds the run directory's lock."""


class RunDirMoved(OSError):
    """The run directory was moved or replaced while the run wrote it (a runtime failure)."""


def run_dir_moved(run_dir: Path, step: int) -> RunDirMoved:
    """The error a trainer stops with once `RunLock.in_place` turned False during `step`."""
    return RunDirMoved(f"run dir {run_dir} was moved or replaced during step {step}: "
                       "stopped without writing into what now has its name; continue the run "
                       "with --resume where it was moved")


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
        self.path.parent.mkdir(parents=True, exist_ok=True)
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

    def in_place(self) -> bool:
        """Whether the locked file is still the one at `self.path`. False once someone moved or
        replaced the run directory: the trainer writes by path, so it must stop, or it would
        write into whatever now has the name (`train_my_ddp.py` asks after every step)."""
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            return False
        held = os.fstat(self._handle)
        return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)

    def release(self) -> None:
        """Unlock (the file stays: removing it would race with a trainer opening it)."""
        if self._handle is not None:
            os.ftruncate(self._handle, 0)
            # Unlock explicitly: a forked child (a DataLoader worker) shares the lock until
            # every copy of the descriptor is closed.
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            os.close(self._handle)
            self._handle = None


def supervisor_files(node_name: str | None) -> tuple[str, str]:
    """The supervisor's (lock, log), relative to the run dir: the run's own, or with one
    supervisor on each node of a multi-node run, that node's (`<node>` is its --node_name)."""
    if node_name is None:
        return SUPERVISOR_LOCK_FILE, MONITOR_LOG
    return f"{NODES_DIR}/{node_name}.monitor.lock", f"{NODES_DIR}/{node_name}.monitor.log"


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


# ---- 2. the heartbeat: a slow run or a hung one -------------------------------------------------

def write_heartbeat(run_dir: Path, step: int) -> None:
    """Rank 0 after every step: `monitor_process.py` watches this file to tell slow from hung.

    Renamed into place (a reader never sees half a file) but not fsynced like
    `utils.atomic_io` does: a heartbeat need not survive a power cut (the run does not
    either), and an fsync waits for the disk on every step (here: ~0.1 ms idle, ~8 ms while
    other jobs wrote to the same disk; a tiny model's step takes ~2 ms)."""
    tmp_path = run_dir / f".{HEARTBEAT_FILE}.tmp"
    tmp_path.write_text(json.dumps({"step": step, "time": time.time()}))
    os.replace(tmp_path, run_dir / HEARTBEAT_FILE)


def heartbeat_step(run_dir: Path) -> int | None:
    """The step of the last heartbeat, or None before the first one."""
    beat = read_json_or_none(run_dir / HEARTBEAT_FILE)
    return beat.get("step") if beat is not None else None


class HeartbeatWatch:
    """Decides "hung" from how long the heartbeat file has not changed, timed on *our* clock.

    Comparing file contents, not the trainer's `time` field, makes clock skew between hosts
    irrelevant. The file left by an earlier attempt does not count as a beat of this one.
    """

    def __init__(self, run_dir: Path, startup_timeout: float, heartbeat_timeout: float):
        self.path = run_dir / HEARTBEAT_FILE
        self.startup_timeout = startup_timeout
        self.heartbeat_timeout = heartbeat_timeout
        self.last_content = self._read()
        self.last_change = time.monotonic()
        self.seen_beat = False

    def _read(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except OSError:
            return None

    def overdue_seconds(self) -> float | None:
        """Seconds of silence if past the limit (startup or heartbeat), else None."""
        if self.heartbeat_timeout <= 0:
            return None
        content = self._read()
        if content is not None and content != self.last_content:
            self.last_content, self.last_change, self.seen_beat = content, time.monotonic(), True
        silence = time.monotonic() - self.last_change
        limit = self.heartbeat_timeout if self.seen_beat else self.startup_timeout
        return silence if silence > limit else None


# ---- 3. the checkpoints index: where a restart resumes from ------------------------------------

def checkpoints_dir(run_dir: str | os.PathLike) -> Path:
    """`<run>/ckpt`: the root that utils/checkpoint.py writes `step_XXXXXX/` dirs into."""
    return Path(run_dir) / CHECKPOINTS_DIR


def newest_checkpoint_step(run_dir: Path) -> int | None:
    """The step of the newest checkpoint whose manifest exists and names its step, else None.

    The trainer also verifies sizes and sha256 before loading (`utils.checkpoint`); this is
    the supervisor's cheap view for its log, so the manifest (written last) must only exist
    and parse.
    """
    for _, step_dir in reversed(list_checkpoints(checkpoints_dir(run_dir))):
        manifest = read_json_or_none(step_dir / MANIFEST)
        if manifest is not None and isinstance(manifest.get("step"), int):
            return manifest["step"]
    return None


# ---- 4. the resume records: the trainer says where it resumed -----------------------------------

class ResumeLines:
    """Yields the trainer's `{"kind": "resume"}` lines appended to metrics.jsonl since creation."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / METRICS_FILE
        self.offset = self.path.stat().st_size if self.path.exists() else 0

    def new(self) -> list[dict]:
        try:
            with open(self.path, "rb") as handle:
                if os.fstat(handle.fileno()).st_size < self.offset:
                    self.offset = 0  # the file was replaced: read it from the start
                handle.seek(self.offset)
                chunk = handle.read()
        except OSError:
            return []
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits
        self.offset += len(complete)
        found = []
        for line in complete.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("kind") == "resume":
                found.append(record)
        return found
