"""Who owns a directory: a run writes only into a directory of its own (docs/design.md §2.7).

Every name a z2all run writes into its directory is listed here, once, with its writer
(`RUN_FILES`, `RUN_FOLDERS`); a tool that writes a new name into a run adds it here. A
directory is a run's own only when it holds nothing else:

    out/<run>/z2all_run.json     the marker, written first (`claim_run_dir`)
              .lock, heartbeat   the trainer (utils/run_directory.py)
              ckpt/step_000200/  checkpoints (utils/checkpoint.py)
              tokenizer/         the run's tokenizer (model/run_tokenizer.py)
              ...                (the rest: the two tables below)

plus the temporaries of those writers (`.config.json.k3j2.tmp`, `.heartbeat.tmp`,
`.tokenizer.x8q1/`, ...: a dot, a listed name, a dot, anything), which a crash can leave.
Two names are common enough elsewhere that the name alone proves nothing, so their content
is asked too: `config.json` must be a trainer's config (it has `task_type`; an HF model's has
not) and `report.md` a run report (or tools.evaluate's results).

The rules, asked by rank 0 before the run writes anything (`claim_run_dir`):
1. a directory holding any other entry is someone else's: refused, naming the first such entry,
   for a fresh run, --resume and --overwrite alike;
2. a z2all run is a directory with the marker and nothing foreign (runs made before the marker
   existed: a sealed checkpoint instead of the marker); an empty `ckpt/`, an empty
   `metrics.jsonl` or a copied marker beside a user's files makes no run;
3. a fresh run takes a directory that does not exist, is empty (a supervisor's files and a
   released lock aside), or holds a z2all run without checkpoints: one that died before its
   first checkpoint is started again in its own directory (its metrics.jsonl is kept and the new
   records follow). A run with checkpoints is refused (continue it with --resume), or moved aside
   whole with --overwrite, never while it is live;
4. --resume needs a z2all run with a checkpoint (without one: start it again, rule 3);
5. /, the home directory, the repository, and what the run reads (or a directory above it or
   inside it) are never a run directory (`out_dir_problem`).
"""

from __future__ import annotations

import fnmatch
import json
import os
import time
from collections.abc import Collection, Iterable
from pathlib import Path

from utils.atomic_io import atomic_write_text
from utils.checkpoint import BEST_LINK, list_checkpoints
from utils.path_overlap import path_overlap
from utils.run_directory import (
    CHECKPOINTS_DIR,
    HEARTBEAT_FILE,
    LOCK_FILE,
    MARKER,
    METRICS_FILE,
    MONITOR_LOG,
    NODES_DIR,
    RUN_MARKER,
    SHARED_CHECK_FILE,
    SUPERVISOR_LOCK_FILE,
    RunLock,
    checkpoints_dir,
    newest_checkpoint_step,
    read_json_or_none,
)

CONFIG_FILE = "config.json"
REPORT_FILE = "report.md"
RUN_TOKENIZER_DIR = "tokenizer"
# tools.evaluate's results in report.md begin with this line; the trainer's rewrite keeps it
# and everything after it (trainer/report.py).
EVALUATIONS_MARKER = "<!-- tools.evaluate results: kept when the trainer rewrites this report -->"

# The files a run's directory may hold, and who writes each.
RUN_FILES = {
    RUN_MARKER: "the trainer, first (claim_run_dir)",
    LOCK_FILE: "the trainer's lock for the run's life (utils/run_directory.RunLock)",
    HEARTBEAT_FILE: "rank 0 after every step (utils/run_directory.write_heartbeat)",
    METRICS_FILE: "the trainer's records (trainer/metrics.py)",
    CONFIG_FILE: "the run's options (trainer/config_files.save_config)",
    "exp_config.py": "the same options as a config file (trainer/config_files.save_config)",
    REPORT_FILE: "the report card (trainer/report.py); tools.evaluate appends its tables",
    "evaluations.json": "tools.evaluate's results",
    "task_accuracy.json": "tools.demo_eval's results",
    "wandb_run_id": "the W&B run id (trainer/trackers.py)",
    MONITOR_LOG: "monitor_process.py's events (monitor/event_log.py)",
    SUPERVISOR_LOCK_FILE: "monitor_process.py's lock (monitor/supervisor_lock.py)",
    SHARED_CHECK_FILE: "rank 0's token that every rank reads back at start "
                       "(trainer/shared_filesystem.py)",
}
# The folders a run's directory may hold, who writes each, and what they hold (fnmatch
# patterns of their entries; None: a tracker's own tree, not ours to list).
RUN_FOLDERS = {
    CHECKPOINTS_DIR: ("the trainer's checkpoints (utils/checkpoint.py)",
                      ("step_*", ".tmp_step_*", BEST_LINK)),
    RUN_TOKENIZER_DIR: ("the run's tokenizer (model/run_tokenizer.save_run_tokenizer)",
                        ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                         "generation_config.json", ".*.tmp")),
    "plots": ("python -m tools.resplot", ("*.png", ".*.tmp")),
    "tensorboard": ("--tracker tensorboard (trainer/trackers.py)", ("events.out.tfevents.*",)),
    "wandb": ("--tracker wandb (trainer/trackers.py)", None),
    NODES_DIR: ("monitor_process.py on each node of a multi-node run (utils/run_directory.py "
                "supervisor_files)", ("*.monitor.lock", "*.monitor.log")),
}
# What a directory may hold before a fresh run starts in it: its supervisor's files (written
# before the first attempt, monitor_process.py) and a released lock.
BEFORE_THE_RUN = frozenset({LOCK_FILE, SUPERVISOR_LOCK_FILE, MONITOR_LOG, NODES_DIR})
REPOSITORY = Path(__file__).resolve().parents[1]


class RunDirHoldsARun(ValueError):
    """A fresh run was pointed at a directory holding another run, or at one that is not empty
    and holds no run; or --resume at a directory that holds no run; or any of them at a
    directory holding what no run writes."""


def _is_temporary(name: str, own: Collection[str]) -> bool:
    """A writer's temporary (`.config.json.k3j2.tmp`, `.heartbeat.tmp`, `.tokenizer.x8q1`)."""
    return any(name.startswith(f".{own_name}.") for own_name in own)


def _looks_like_ours(path: Path) -> bool:
    """For the two common names, whether the content is what the run writes there."""
    if path.name == CONFIG_FILE:
        config = read_json_or_none(path)
        return config is not None and "task_type" in config
    if path.name == REPORT_FILE:
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                start = handle.read(len(EVALUATIONS_MARKER) + 2).lstrip()
        except OSError:
            return False
        return start.startswith(("# Run report: ", EVALUATIONS_MARKER))
    return True


def foreign_entry(directory: Path, names: Collection[str] | None = None,
                  allowed: Collection[str] | None = None) -> str | None:
    """The first entry of `directory` (in sorted order, as `tokenizer/my_tok.py`) that no z2all
    run writes, or None. `names` limits the look to those top-level entries; `allowed` to
    those of the run's names that may be there (default: all)."""
    own = {*RUN_FILES, *RUN_FOLDERS} if allowed is None else set(allowed)
    for entry in sorted(directory.iterdir()):
        if names is not None and entry.name not in names or _is_temporary(entry.name, own):
            continue
        if not os.path.lexists(entry):
            continue  # renamed away while we looked: a writer of the run (e.g. tokenizer/)
        if entry.name in RUN_FILES and entry.name in own:
            if not entry.is_file() or entry.is_symlink() or not _looks_like_ours(entry):
                return entry.name
            continue
        if entry.name not in own or not entry.is_dir() or entry.is_symlink():
            return entry.name
        if (inner := _foreign_inside(entry)) is not None:
            return f"{entry.name}/{inner}"
    return None


def _foreign_inside(folder: Path) -> str | None:
    """The first entry of one of the run's folders that its writer does not write, or None."""
    patterns = RUN_FOLDERS[folder.name][1]
    try:
        inside = [] if patterns is None else sorted(folder.iterdir())
    except FileNotFoundError:
        return None  # renamed away while we looked
    for inner in inside:
        if not any(fnmatch.fnmatchcase(inner.name, pattern) for pattern in patterns):
            return inner.name
    return None


def is_run(run_dir: Path) -> bool:
    """Whether `run_dir` holds a z2all run (rule 2 of the module docstring)."""
    if foreign_entry(run_dir) is not None:
        return False
    marker = read_json_or_none(run_dir / RUN_MARKER)
    marked = marker is not None and marker.get("format") == MARKER["format"]
    return marked or newest_checkpoint_step(run_dir) is not None


def foreign_dir_problem(directory: Path, flag: str) -> str | None:
    """Why nothing of a run may be written into `directory` (`flag` names the option), or
    None: it is a file, or it holds an entry no run writes (rule 1 of the module docstring)."""
    if not directory.exists():
        return None
    if not directory.is_dir():
        return f"{flag} is a file: name a new or empty directory for the run"
    foreign = foreign_entry(directory)
    if foreign is None:
        return None
    return (f"{flag} holds {foreign}, which no z2all run writes: a run takes only a new or "
            "empty directory or its own (docs/design.md 2.7); choose another --out_dir")


def not_a_run_dir_problem(directory: Path, flag: str) -> str | None:
    """Why a run may not start in `directory` (`flag` names the option), or None: it does not
    exist, is empty (a supervisor's files and a released lock aside) or holds a z2all run.
    Asked by a fresh run and by the supervisor before it writes its lock and log there."""
    problem = foreign_dir_problem(directory, flag)
    if problem or not directory.is_dir():
        return problem
    present = sorted(entry.name for entry in directory.iterdir()
                     if entry.name not in BEFORE_THE_RUN)
    if not present or is_run(directory):
        return None
    return (f"{flag} is not empty and holds no z2all run (no {RUN_MARKER}; it holds "
            f"{present[0]}): a fresh run needs a new or empty directory; choose another --out_dir")


def overlap_problem(flag: str, out: str | os.PathLike,
                    reads: Iterable[tuple[str, str | os.PathLike | None]], fix: str) -> str | None:
    """Why a command may not write into `out` (one line ending in `fix`), or None: it is, holds
    or is inside a path the command reads (`reads`: (what it is, its path or None) pairs, as
    ("--data_dir", "data/demo")). The rule of every tool that writes a folder (the trainer,
    `convert_to_hf --out`, `tools.evaluate --report_dir`): it never writes into what it reads."""
    for name, value in reads:
        overlap = path_overlap(out, value) if value else None
        if overlap in ("same", "holds"):
            return f"{flag} is or contains {name} {value}: {fix}"
        if overlap == "inside":
            return f"{flag} is inside {name} {value}: {fix}"
    return None


def out_dir_problem(out_dir: str, reads: dict[str, str | None]) -> str | None:
    """Why `--out_dir` can never be this run's directory (one line), or None. Read-only and the
    same on every rank: the entry point asks before anything is written. `reads` maps the
    options naming what the run reads (`--data_dir`, ...) to their values: the run writes into
    none of them, above them or inside them. /, the home directory and the repository are never
    a run directory. What the directory holds is judged later, by rank 0 alone under the lock
    (`claim_run_dir`): another rank looking would see rank 0's first files."""
    flag, path = f"--out_dir={out_dir}", Path(out_dir)
    if path.exists() and not path.is_dir():
        return f"{flag} is a file: name a new or empty directory for the run"
    fix = "a run writes only into a directory of its own; choose another --out_dir (e.g. out/run1)"
    for name, place in (("the root directory", Path("/")), ("your home directory", Path.home()),
                        ("the z2all repository", REPOSITORY)):
        if path_overlap(path, place) in ("same", "holds"):
            return f"{flag} is or contains {name}: {fix}"
    return overlap_problem(flag, path, reads.items(), fix)


def _contents_problem(run_dir: Path, resume: bool, overwrite: bool) -> str | None:
    """Why the run may not start in `run_dir` as it is now, or None (rules 1-4 of the module
    docstring; rule 3's checkpoints are settled by `_record_to_replace`)."""
    flag = f"--out_dir={run_dir}"
    if not resume:
        problem = not_a_run_dir_problem(run_dir, flag)
        return problem and problem + (
            "; --overwrite moves aside only an earlier z2all run" if overwrite else "")
    problem = foreign_dir_problem(run_dir, flag)
    if problem or not run_dir.is_dir():
        return problem  # (a missing directory: the run creates it)
    if not is_run(run_dir):
        return (f"{flag} holds no z2all run to resume (no {RUN_MARKER}, no checkpoint): check "
                "the path, or start a fresh run without --resume")
    if earlier_run(run_dir) is None:
        return (f"--resume: {run_dir} holds a run that stopped before its first checkpoint: "
                "nothing to resume; start it again there without --resume")
    return None


def earlier_run(run_dir: Path) -> str | None:
    """The checkpoints of an earlier run in `run_dir` ("checkpoints up to step N"), or None when
    a fresh run may start there: missing, empty, or a run that died before its first checkpoint
    (rule 3 of the module docstring)."""
    steps = [step for step, _ in list_checkpoints(checkpoints_dir(run_dir))]
    return f"checkpoints up to step {max(steps)}" if steps else None


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
    """Rank 0, once `out_dir_problem` found none: the module docstring's rules 1-4 (a refusal
    writes nothing, not even `.lock`); then lock `run_dir` (a live run refuses, naming its PID
    and host); a fresh run then refuses an earlier run's checkpoints, or with `overwrite`
    moves that run aside; last, the marker says that the directory holds a z2all run (a resumed
    run made before the marker gets it too). Returns the held lock and notes for the log.

    The lock comes first, so --overwrite never moves a live run: its flock would move with the
    directory and it would go on writing by path into the new run. (A directory moved by other
    hands stops its trainer within a step: `RunLock.in_place`.)"""
    problem = _contents_problem(run_dir, resume, overwrite)
    if problem:
        raise RunDirHoldsARun(problem)
    _record_to_replace(run_dir, resume, overwrite)
    lock = RunLock(run_dir)
    notes = [lock.acquire()]
    try:
        if _record_to_replace(run_dir, resume, overwrite):  # again, now that no run is live
            moved = move_aside(run_dir)  # ours to move: we hold its lock
            lock.release()
            lock = RunLock(run_dir)
            notes += [lock.acquire(), f"note: --overwrite: moved the earlier run to {moved}"]
        elif not resume and _has_records(run_dir):
            notes.append(f"note: {run_dir} holds a run that stopped before its first "
                         f"checkpoint: starting it again there ({METRICS_FILE} is kept; this "
                         "run's records follow its)")
        if not (run_dir / RUN_MARKER).is_file():
            atomic_write_text(run_dir / RUN_MARKER, json.dumps(MARKER) + "\n")
    except BaseException:
        lock.release()
        raise
    return lock, [note for note in notes if note]


def _has_records(run_dir: Path) -> bool:
    metrics = run_dir / METRICS_FILE
    return metrics.is_file() and metrics.stat().st_size > 0


def _record_to_replace(run_dir: Path, resume: bool, overwrite: bool) -> bool:
    """Whether a fresh run with --overwrite must move an earlier run aside; without
    --overwrite that run is refused (`RunDirHoldsARun`). A resume replaces nothing."""
    held = None if resume else earlier_run(run_dir)
    if held and not overwrite:
        raise RunDirHoldsARun(
            f"--out_dir={run_dir} holds another run ({held}): continue it with --resume, "
            "choose a new --out_dir, or add --overwrite to move it aside (nothing is deleted)")
    return held is not None
