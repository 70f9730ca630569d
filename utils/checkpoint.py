"""Crash-proof checkpoints: a checkpoint exists only once it is complete and verified.

Layout of a run's checkpoints (docs/design.md §2.7):

    out/<run>/ckpt/step_000100/   config.json, model.safetensors, optim/, trainer_state.pt,
                                  manifest.json  <- written LAST: sizes + sha256 of every file
    out/<run>/ckpt/step_000200/
    out/<run>/ckpt/best -> step_000100   (symlink: best validation loss so far)

How a checkpoint is written, so that a crash at any instant leaves either the old set of
checkpoints or the new one, never something half-written that looks complete:
1. `begin_checkpoint`: make an empty `ckpt/.tmp_step_000200/` (stale temp dirs from a crash
   are removed first). In a distributed run every rank then writes its own files into it
   (its optimizer shard, ...); the trainer puts a barrier after that.
2. `finish_checkpoint` (rank 0 only): check that every file the loader will read (`required`,
   e.g. one optimizer shard per rank) is there, else refuse to seal; fsync every file, write
   `manifest.json` (also fsynced), rename the temp dir to `step_000200` (atomic on POSIX) and
   fsync `ckpt/` so the rename itself survives a power cut; then update `best` and delete old
   checkpoints beyond `keep_last`.
A reader trusts a checkpoint only if `verify_checkpoint` passes: the manifest exists, every
required file is listed, and every file listed has the recorded size and sha256 (a manifest
without a `required` list requires the files it lists). `valid_checkpoints` walks from the
newest step down and skips (with a warning) any that fails, so a damaged newest checkpoint
costs only the steps since the previous one.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from utils.atomic_io import atomic_symlink, atomic_write_json, fsync_dir, replace_durably

CHECKPOINT_FORMAT = "z2all-checkpoint"
CHECKPOINT_VERSION = 1
MANIFEST = "manifest.json"
TRAINER_STATE = "trainer_state.pt"
BEST_LINK = "best"
_STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used (missing, damaged, wrong format): bad input."""


class DamagedCheckpointWarning(UserWarning):
    """A checkpoint was found but failed verification (or its state failed to load) and was
    skipped."""


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files_under(directory: Path) -> list[Path]:
    """Every regular file below `directory` (relative paths, sorted), manifest excluded."""
    return sorted(p.relative_to(directory) for p in directory.rglob("*")
                  if p.is_file() and p.name != MANIFEST)


# ---------------------------------------------------------------------------------- writing

def tmp_checkpoint_dir(ckpt_root: str | os.PathLike, step: int) -> Path:
    """`ckpt_root/.tmp_step_XXXXXX`: where the checkpoint of `step` is built until it is sealed
    (every rank of a distributed save writes into it; rank 0 alone creates it)."""
    return Path(ckpt_root) / f".tmp_{step_dir_name(step)}"


def begin_checkpoint(ckpt_root: str | os.PathLike, step: int) -> Path:
    """Create the empty `tmp_checkpoint_dir` that a checkpoint is built in."""
    ckpt_root = Path(ckpt_root)
    ckpt_root.mkdir(parents=True, exist_ok=True)
    for stale in ckpt_root.glob(".tmp_step_*"):  # leftovers of a crash mid-save
        shutil.rmtree(stale, ignore_errors=True)
    tmp_dir = tmp_checkpoint_dir(ckpt_root, step)
    tmp_dir.mkdir()
    return tmp_dir


def finish_checkpoint(tmp_dir: str | os.PathLike, step: int, *, keep_last: int = 2,
                      val_loss: float | None = None,
                      required: list[str] | None = None) -> Path:
    """Seal `tmp_dir` (manifest last), rename it to `step_XXXXXX`, update `best`, prune old ones.

    `required`: the relative paths a loader of this checkpoint will read (default: every file
    written); if one is missing (a rank did not write its shard, another writer removed the
    temp dir) a `CheckpointError` is raised and nothing is sealed. `val_loss` (if given) is
    recorded in the manifest; the checkpoint with the lowest recorded val_loss is `best` and
    is never pruned. Returns the final checkpoint dir.
    """
    tmp_dir = Path(tmp_dir)
    ckpt_root = tmp_dir.parent
    written = {relpath.as_posix() for relpath in _files_under(tmp_dir)}
    required = sorted(written if required is None else required)
    missing = [relpath for relpath in required if relpath not in written]
    if missing:
        raise CheckpointError(f"{tmp_dir}: not sealing checkpoint of step {step}: "
                              f"{', '.join(missing[:3])} missing ({len(missing)} of "
                              f"{len(required)} required files)")
    files = {}
    for relpath in _files_under(tmp_dir):
        path = tmp_dir / relpath
        with open(path, "rb") as handle:  # make the bytes durable before the manifest vouches
            os.fsync(handle.fileno())
        files[relpath.as_posix()] = {"size": path.stat().st_size, "sha256": _sha256(path)}
    for sub in {tmp_dir / rel.parent for rel in _files_under(tmp_dir)}:
        fsync_dir(sub)
    manifest = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "step": step,
                "val_loss": val_loss, "required": required, "files": files}
    atomic_write_json(tmp_dir / MANIFEST, manifest)

    final_dir = ckpt_root / step_dir_name(step)
    if final_dir.is_dir() and not final_dir.is_symlink():  # e.g. re-saving a step after a resume
        shutil.rmtree(final_dir)
    elif final_dir.is_symlink() or final_dir.exists():  # a stray file or link by that name
        final_dir.unlink()
    replace_durably(tmp_dir, final_dir)
    _update_best(ckpt_root)
    prune_checkpoints(ckpt_root, keep_last, newest_kept=step)
    return final_dir


def save_checkpoint(ckpt_root: str | os.PathLike, step: int,
                    write_files: Callable[[Path], None], *, keep_last: int = 2,
                    val_loss: float | None = None) -> Path:
    """Single-process convenience: begin, let `write_files(tmp_dir)` fill it, finish."""
    tmp_dir = begin_checkpoint(ckpt_root, step)
    write_files(tmp_dir)
    return finish_checkpoint(tmp_dir, step, keep_last=keep_last, val_loss=val_loss)


def _read_manifest(ckpt_dir: Path) -> dict[str, Any]:
    with open(ckpt_dir / MANIFEST, encoding="utf-8") as handle:
        return json.load(handle)


def _update_best(ckpt_root: Path) -> None:
    """Point `best` at the valid checkpoint with the lowest recorded val_loss (if any)."""
    scored = []
    for step, ckpt_dir in list_checkpoints(ckpt_root):
        try:
            val_loss = _read_manifest(ckpt_dir).get("val_loss")
        except (OSError, ValueError):
            continue
        if val_loss is not None and math.isfinite(val_loss):  # a diverged (NaN) eval never wins
            scored.append((val_loss, -step, ckpt_dir))
    if not scored:
        return
    best_dir = min(scored)[2]
    atomic_symlink(best_dir.name, ckpt_root / BEST_LINK)  # relative: the run dir can be moved


def best_checkpoint(ckpt_root: str | os.PathLike) -> Path | None:
    link = Path(ckpt_root) / BEST_LINK
    return link.resolve() if link.is_symlink() and link.resolve().is_dir() else None


def prune_checkpoints(ckpt_root: str | os.PathLike, keep_last: int,
                      newest_kept: int | None = None) -> None:
    """Delete all but the newest `keep_last` checkpoints; `best` is always kept.

    `newest_kept`: the step just written. It and every step up to it count as the newest,
    and checkpoints *after* it (left by another run, which a fresh run refuses unless told to
    overwrite) are never what gets deleted to make room: pruning removes only older steps."""
    if keep_last <= 0:
        return
    ckpt_root = Path(ckpt_root)
    best = best_checkpoint(ckpt_root)
    candidates = [(step, ckpt_dir) for step, ckpt_dir in list_checkpoints(ckpt_root)
                  if newest_kept is None or step <= newest_kept]
    for _, ckpt_dir in candidates[:-keep_last]:
        if best is None or ckpt_dir.resolve() != best:
            shutil.rmtree(ckpt_dir, ignore_errors=True)


# ---------------------------------------------------------------------------------- reading

def list_checkpoints(ckpt_root: str | os.PathLike) -> list[tuple[int, Path]]:
    """`(step, dir)` for every `step_XXXXXX` dir under `ckpt_root`, oldest first (unverified)."""
    ckpt_root = Path(ckpt_root)
    if not ckpt_root.is_dir():
        return []
    found = []
    for entry in ckpt_root.iterdir():
        match = _STEP_DIR.match(entry.name)
        if match and entry.is_dir() and not entry.is_symlink():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def is_step_dir(path: str | os.PathLike) -> bool:
    """A run's checkpoint dir: `ckpt/step_XXXXXX`, or `ckpt/best` (a link to one). It was
    written with a manifest, so without one it is an unfinished or tampered save, never a
    bare `save_pretrained` dir to trust as it is."""
    return bool(_STEP_DIR.match(Path(path).resolve().name))


def verify_checkpoint(ckpt_dir: str | os.PathLike) -> str | None:
    """None if `ckpt_dir` is a complete, intact checkpoint; otherwise the reason it is not."""
    ckpt_dir = Path(ckpt_dir)
    if not (ckpt_dir / MANIFEST).is_file():
        return "no manifest.json (the save did not finish)"
    try:
        manifest = _read_manifest(ckpt_dir)
    except (OSError, ValueError) as error:
        return f"unreadable manifest.json: {error}"
    if manifest.get("format") != CHECKPOINT_FORMAT or manifest.get("version") != CHECKPOINT_VERSION:
        return (f"manifest format {manifest.get('format')!r} v{manifest.get('version')} is not "
                f"{CHECKPOINT_FORMAT!r} v{CHECKPOINT_VERSION}")
    files = manifest.get("files", {})
    for relpath in manifest.get("required", files):
        if relpath not in files:
            return f"{relpath} is required but not in the manifest (an incomplete save)"
    for relpath, expected in files.items():
        path = ckpt_dir / relpath
        if not path.is_file():
            return f"{relpath} is missing"
        size = path.stat().st_size
        if size != expected["size"]:
            return f"{relpath} has {size} bytes, manifest says {expected['size']} (truncated?)"
        if _sha256(path) != expected["sha256"]:
            return f"{relpath} sha256 does not match the manifest (corrupted)"
    return None


def valid_checkpoints(path: str | os.PathLike) -> Iterator[Path]:
    """A checkpoint dir (verified), or a run dir / `ckpt` dir -> its valid checkpoints, newest
    first, verified one at a time as the caller asks for the next (hashing is not free).

    Damaged checkpoints are reported with a `DamagedCheckpointWarning` and skipped; if none is
    valid a `CheckpointError` says why.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint or run directory")
    if (path / MANIFEST).exists() or is_step_dir(path):
        problem = verify_checkpoint(path)
        if problem:
            raise CheckpointError(f"checkpoint {path} is not usable: {problem}")
        yield path
        return
    ckpt_root = path / "ckpt" if (path / "ckpt").is_dir() else path
    candidates = list_checkpoints(ckpt_root)
    found = False
    for _, ckpt_dir in reversed(candidates):
        problem = verify_checkpoint(ckpt_dir)
        if problem is None:
            found = True
            yield ckpt_dir
        else:
            warnings.warn(f"skipping damaged checkpoint {ckpt_dir}: {problem}",
                          DamagedCheckpointWarning, stacklevel=2)
    if found:
        return
    if candidates:
        raise CheckpointError(f"{ckpt_root}: all {len(candidates)} checkpoints are damaged "
                              "(see the warnings above); nothing to resume from")
    raise CheckpointError(f"{path}: no checkpoint found (expected {ckpt_root}/step_XXXXXX/ "
                          "with a manifest.json); train first or pass a checkpoint dir")


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """The newest valid checkpoint of `path` (see `valid_checkpoints`)."""
    return next(valid_checkpoints(path))


def checkpoint_step(ckpt_dir: str | os.PathLike) -> int:
    return int(_read_manifest(Path(ckpt_dir))["step"])


def load_torch(path: str | os.PathLike) -> Any:
    """The only way we unpickle: `weights_only=True` never runs code from the file."""
    import torch  # here, not at the top: the supervisor lists checkpoints without torch

    return torch.load(path, map_location="cpu", weights_only=True)
