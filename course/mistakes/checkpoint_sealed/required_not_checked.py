"""the manifest trusted as complete: a required file missing from it passes.

Rank 0 seals what it sees; if another rank's shard was not written yet, the manifest lists
only the files present. Its "required" list names every file the save promised: each must be
in "files" too, or the save was incomplete.
"""

from __future__ import annotations

import os
from pathlib import Path

from utils.checkpoint import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_VERSION,
    MANIFEST,
    _read_manifest,
    _sha256,
)


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
