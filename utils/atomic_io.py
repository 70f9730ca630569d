"""Crash-safe file writing: a reader never sees a half-written file under its final name.

The recipe (used for token files, tokenizers, checkpoints and reports alike):
1. write to a temporary name in the *same directory* (so the rename stays on one filesystem);
2. flush and `fsync` the file, so its bytes are on disk before it gets its name;
3. `os.replace` it onto the final name (atomic on POSIX: readers see old or new, never half);
4. `fsync` the directory, so the rename itself survives a power cut.
If anything raises before step 3, the temporary file is removed and the final name untouched.
Steps 3 and 4 are one call, `replace_durably`, for whatever was built under a temporary name:
a file here, a link (`atomic_symlink`), or a checkpoint's directory in utils/checkpoint.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_dir(directory: str | os.PathLike) -> None:
    """Make a rename or file creation inside `directory` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """Give `source` (a file, directory or link in `target`'s directory) the name `target`,
    atomically (readers see the old `target` or the new one), and make the rename durable."""
    os.replace(source, target)
    fsync_dir(Path(target).parent)


def atomic_symlink(target: str, link: str | os.PathLike) -> None:
    """Point the symbolic link `link` at `target`, replacing an older link in one step, and
    durably: a reader finds the old target or the new one, never no link (the new link is
    made under a temporary name first, as `atomic_open` makes a file)."""
    link = Path(link)
    tmp_link = link.with_name(f".{link.name}.tmp")
    if tmp_link.is_symlink() or tmp_link.exists():  # left by a crash
        tmp_link.unlink()
    os.symlink(target, tmp_link)
    replace_durably(tmp_link, link)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO[Any]]:
    """`with atomic_open(p, "w") as f: f.write(...)`: `p` appears only once `f` is complete."""
    if "w" not in mode:
        raise ValueError(f"atomic_open is for writing; got mode {mode!r}")
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    try:
        # mkstemp creates 0600 files; give the final file the permissions `open` would have.
        os.chmod(tmp_name, 0o666 & ~_current_umask())
        with os.fdopen(fd, mode) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        replace_durably(tmp_name, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_open(path, "wb") as handle:
        handle.write(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_open(path, "w") as handle:
        handle.write(text)


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int | None = 2) -> None:
    atomic_write_text(path, json.dumps(obj, indent=indent, ensure_ascii=False) + "\n")
