"""The run directory's contract: its liveness file (written by the trainer, read by the
supervisor), and who may start a run in it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from utils.checkpoint import list_checkpoints


def write_heartbeat(run_dir: Path, step: int) -> None:
    """`monitor_process.py` watches this file to tell a slow run from a hung one.

    Written every step, so renamed into place (a reader never sees half a file) but not
    fsynced like `utils.atomic_io` does: a heartbeat need not survive a power cut (the run does
    not either), and an fsync waits for the disk on every step (here: ~0.1 ms idle, ~8 ms
    while other jobs wrote to the same disk; a tiny model's step takes ~2 ms)."""
    tmp_path = run_dir / ".heartbeat.tmp"
    tmp_path.write_text(json.dumps({"step": step, "time": time.time()}))
    os.replace(tmp_path, run_dir / "heartbeat")


def earlier_run(run_dir: Path) -> str | None:
    """What of an earlier run `run_dir` holds (its checkpoints, its metrics), or None when a
    fresh run may start there (missing, empty, or only a released lock / a failed start)."""
    found = []
    steps = [step for step, _ in list_checkpoints(run_dir / "ckpt")]
    if steps:
        found.append(f"checkpoints up to step {max(steps)}")
    metrics = run_dir / "metrics.jsonl"
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


def claim_for_fresh_run(run_dir: Path, overwrite: bool) -> str | None:
    """Before a fresh (not --resume) run writes anything: refuse a directory that holds
    another run, or with `overwrite` move that run aside. Returns a note for the log."""
    held = earlier_run(run_dir)
    if held is None:
        return None
    if not overwrite:
        raise RunDirHoldsARun(
            f"--out_dir={run_dir} holds another run ({held}): continue it with --resume, "
            "choose a new --out_dir, or add --overwrite to move it aside (nothing is deleted)")
    return f"note: --overwrite: moved the earlier run to {move_aside(run_dir)}"


class RunDirHoldsARun(ValueError):
    """A fresh run was pointed at a directory holding another run's checkpoints or metrics."""
