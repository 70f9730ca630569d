"""Expected errors end a command with one line, `error: <file:line: reason>`, not a traceback.

Every command-line entry point hands its `main` to `run_main`:

    if __name__ == "__main__":
        sys.exit(run_main(main))

Exit codes: 0 done; 2 bad input (an invalid option, a missing path, a bad record, a damaged
checkpoint: fix the input and rerun); 1 a runtime failure (the disk is full, another I/O
error, out of memory). `--debug` anywhere before a `--` (or `Z2ALL_DEBUG=1`) shows the full
traceback instead. Any other exception is a bug, and keeps its traceback: hiding it would
not help anyone fix it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Callable, Iterator

EXIT_RUNTIME_FAILURE = 1
EXIT_BAD_INPUT = 2
DEBUG_FLAG = "--debug"
DEBUG_ENV = "Z2ALL_DEBUG"

# Errors of the input (utils.checkpoint.CheckpointError and readers.BadRecordError are
# ValueErrors); they are tried before OSError, of which the path errors are subclasses.
BAD_INPUT_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError,
                    PermissionError)


class ReportedElsewhere(Exception):
    """This process's share of an error that another process prints (a rank whose main rank
    says why): it exits with `code`, silently, so a run of N ranks prints one line, not N."""

    def __init__(self, code: int) -> None:
        super().__init__(f"exit {code}: the error is printed by another process")
        self.code = code


class DiskFullError(OSError):
    """The disk filled up while writing; the message says what was written and what is safe."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.ENOSPC, message)

    def __str__(self) -> str:
        return self.strerror


@contextlib.contextmanager
def disk_full_explained(writing: str | os.PathLike, note: str = "") -> Iterator[None]:
    """Inside the block, running out of disk space raises a `DiskFullError` that names `writing`
    (and adds `note`, e.g. which earlier file is still intact) instead of a bare ENOSPC."""
    try:
        yield
    except DiskFullError:
        raise
    except OSError as error:
        if error.errno != errno.ENOSPC:
            raise
        raise DiskFullError(f"no space left on device while writing {writing}"
                            + (f"; {note}" if note else "")) from error


def describe(error: BaseException) -> str:
    """The one line printed after `error: `."""
    if isinstance(error, DiskFullError):
        return str(error)
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return f"no space left on device while writing {error.filename or 'a file'}"
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        return f"{error.filename}: {error.strerror.lower()}"
    return " ".join(str(error).split()) or type(error).__name__


def exit_code(error: BaseException) -> int | None:
    """2 for bad input, 1 for an expected runtime failure, None for a bug (re-raised)."""
    if isinstance(error, BAD_INPUT_ERRORS):
        return EXIT_BAD_INPUT
    if isinstance(error, (OSError, MemoryError)):
        return EXIT_RUNTIME_FAILURE
    return None


def split_debug_flag(argv: list[str]) -> tuple[list[str], bool]:
    """(argv without `--debug`, whether it was given); after `--` everything is left alone."""
    own = argv[:argv.index("--")] if "--" in argv else argv
    if DEBUG_FLAG not in own:
        return argv, False
    return [arg for arg in own if arg != DEBUG_FLAG] + argv[len(own):], True


def run_main(main: Callable[[list[str]], int | None], argv: list[str] | None = None) -> int:
    """Run `main(argv)`; return its exit code, or print an expected error in one line."""
    argv, debug = split_debug_flag(sys.argv[1:] if argv is None else list(argv))
    debug = debug or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    try:
        return main(argv) or 0
    except Exception as error:  # noqa: BLE001 - sorted below: expected ones end in one line
        if isinstance(error, ReportedElsewhere) and not debug:
            return error.code
        code = exit_code(error)
        if debug or code is None:
            raise
        print(f"error: {describe(error)}", file=sys.stderr, flush=True)
        return code

