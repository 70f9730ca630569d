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

The module has five parts:
1. the lock (`RunLock`, `lock_holder`): one writer per run directory;
2. the heartbeat (`write_heartbeat`, `heartbeat_step`, `HeartbeatWatch`): "slow" or "hung";
3. the checkpoints index (`checkpoints_dir`, `newest_checkpoint_step`): how far a restart
   would resume from;
4. the resume records (`ResumeLines`): the trainer confirming where it resumed;
5. who owns a directory (`out_dir_problem`, `claim_run_dir`): a run writes only into a
   directory of its own. A fresh run takes one that does not exist or is empty; one holding
   anything else is refused, never written over, and nothing a run did not write is deleted.
   `--overwrite` moves aside only a z2all run (its marker; before the marker existed: its
   `ckpt/` or `metrics.jsonl`), and only one that is not live. /, the home directory, the
   repository, and what the run reads (or a directory above it) are never a run directory.

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

from utils.atomic_io import atomic_write_text
from utils.checkpoint import MANIFEST, list_checkpoints

LOCK_FILE = ".lock"
HEARTBEAT_FILE = "heartbeat"
CHECKPOINTS_DIR = "ckpt"
METRICS_FILE = "metrics.jsonl"
MONITOR_LOG = "monitor.log"


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


# ---- 5. who owns a directory: the run's claim ----------------------------------------------------

RUN_MARKER = "z2all_run.json"
MARKER = {"format": "z2all run directory", "version": 1}
SUPERVISOR_LOCK_FILE = ".monitor.lock"
# What a directory may hold before a fresh run starts in it: its supervisor's files (written
# before the first attempt, monitor_process.py) and a released lock.
BEFORE_THE_RUN = frozenset({LOCK_FILE, SUPERVISOR_LOCK_FILE, MONITOR_LOG})
REPOSITORY = Path(__file__).resolve().parents[1]


class RunDirHoldsARun(ValueError):
    """A fresh run was pointed at a directory holding another run, or at one that is not empty
    and holds no run; or --resume at a directory that holds no run."""


class RunDirMoved(OSError):
    """The run directory was moved or replaced while the run wrote it (a runtime failure)."""


def is_run(run_dir: Path) -> bool:
    """Whether `run_dir` holds a z2all run: its marker, or, for runs made before the marker
    existed, a `ckpt/` or `metrics.jsonl` (the two files only a trainer writes)."""
    marker = read_json_or_none(run_dir / RUN_MARKER)
    if marker is not None and marker.get("format") == MARKER["format"]:
        return True
    return checkpoints_dir(run_dir).is_dir() or (run_dir / METRICS_FILE).is_file()


def out_dir_problem(out_dir: str, reads: dict[str, str | None]) -> str | None:
    """Why `--out_dir` can never be this run's directory (one line), or None. Read-only and the
    same on every rank: the entry point asks before anything is written. `reads` maps the
    options naming what the run reads (`--data_dir`, ...) to their values: the run writes into
    none of them, nor above them. /, the home directory and the repository are never a run
    directory. What the directory holds is judged later, by rank 0 alone under the lock
    (`claim_run_dir`): another rank looking would see rank 0's first files."""
    flag, path = f"--out_dir={out_dir}", Path(out_dir)
    if path.exists() and not path.is_dir():
        return f"{flag} is a file: name a new or empty directory for the run"
    resolved = path.resolve()
    guarded = {"the root directory": Path("/"), "your home directory": Path.home(),
               "the z2all repository": REPOSITORY,
               **{f"{name}={value}": Path(value) for name, value in reads.items() if value}}
    for name, guarded_path in guarded.items():
        guarded_path = guarded_path.resolve()
        inside = name.startswith("--") and guarded_path in resolved.parents
        if resolved == guarded_path or resolved in guarded_path.parents or inside:
            where = "is inside" if inside else "is or contains"
            return (f"{flag} {where} {name}: a run writes only into a directory of its own; "
                    "choose another --out_dir (e.g. out/run1)")
    return None


def _contents_problem(run_dir: Path, resume: bool, overwrite: bool) -> str | None:
    """Why the run may not start in `run_dir` as it is now, or None: a fresh run takes a
    directory that does not exist or is empty (a supervisor's files aside) or holds a z2all
    run (settled by `_record_to_replace`); --resume needs a z2all run."""
    flag = f"--out_dir={run_dir}"
    if not run_dir.is_dir():
        return None  # the run creates it
    if resume:
        return None if is_run(run_dir) else (
            f"{flag} holds no z2all run to resume (no {RUN_MARKER}, {CHECKPOINTS_DIR}/ or "
            f"{METRICS_FILE}): check the path, or start a fresh run without --resume")
    foreign = sorted(entry.name for entry in run_dir.iterdir()
                     if entry.name not in BEFORE_THE_RUN)
    if is_run(run_dir) or not foreign:
        return None
    shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
    return (f"{flag} is not empty and holds no z2all run ({shown}): a fresh run needs a new or "
            "empty directory; choose another --out_dir"
            + ("; --overwrite moves aside only an earlier z2all run" if overwrite else ""))


def earlier_run(run_dir: Path) -> str | None:
    """What of an earlier run `run_dir` holds (its checkpoints, its metrics), or None when a
    fresh run may start there (missing, empty, or only a released lock / a failed start)."""
    found = []
    steps = [step for step, _ in list_checkpoints(checkpoints_dir(run_dir))]
    if steps:
        found.append(f"checkpoints up to step {max(steps)}")
    metrics = run_dir / METRICS_FILE
    if metrics.is_file() and metrics.stat().st_size > 0:
        found.append("metrics.jsonl")
    return " and ".join(found) or None


def move_aside(run_dir: Path) -> Path:
    """Rename `run_dir` to `<name>.old-<UTC time>` beside it (never delete a run) and return
    the new path."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = run_dir.with_name(f"{run_dir.name}.old-{stamp}")
    suffix = 1
    while target.exists():
        suffix += 1
        target = run_dir.with_name(f"{run_dir.name}.old-{stamp}-{suffix}")
    os.replace(run_dir, target)
    return target


def claim_run_dir(run_dir: Path, resume: bool, overwrite: bool) -> tuple[RunLock, list[str]]:
    """Rank 0, once `out_dir_problem` found none: a directory that is no run and not empty is
    refused (or, for --resume, one that is no run); then lock `run_dir` (a live run refuses,
    naming its PID and host); a fresh run then refuses an earlier run's record, or with `overwrite`
    moves it aside; last, the marker says that the directory holds a z2all run (a resumed run
    made before the marker gets it too). Returns the held lock and notes for the log.

    The lock comes first, so --overwrite never moves a live run: its flock would move with the
    directory and it would go on writing by path into the new run. (A directory moved by other
    hands stops its trainer within a step: `RunLock.in_place`.)"""
    problem = _contents_problem(run_dir, resume, overwrite)
    if problem:
        raise RunDirHoldsARun(problem)
    _record_to_replace(run_dir, resume, overwrite)  # a refusal writes nothing, not even .lock
    lock = RunLock(run_dir)
    notes = [lock.acquire()]
    try:
        if _record_to_replace(run_dir, resume, overwrite):  # again, now that no run is live
            moved = move_aside(run_dir)  # ours to move: we hold its lock
            lock.release()
            lock = RunLock(run_dir)
            notes += [lock.acquire(), f"note: --overwrite: moved the earlier run to {moved}"]
        if not (run_dir / RUN_MARKER).is_file():
            atomic_write_text(run_dir / RUN_MARKER, json.dumps(MARKER) + "\n")
    except BaseException:
        lock.release()
        raise
    return lock, [note for note in notes if note]


def _record_to_replace(run_dir: Path, resume: bool, overwrite: bool) -> bool:
    """Whether a fresh run with --overwrite must move an earlier run aside; without
    --overwrite that run is refused (`RunDirHoldsARun`). A resume replaces nothing."""
    held = None if resume else earlier_run(run_dir)
    if held and not overwrite:
        raise RunDirHoldsARun(
            f"--out_dir={run_dir} holds another run ({held}): continue it with --resume, "
            "choose a new --out_dir, or add --overwrite to move it aside (nothing is deleted)")
    return held is not None
