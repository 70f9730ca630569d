"""One supervisor per run directory: `monitor_process.py` holds `<run>/.monitor.lock` for life
(a multi-node run with a supervisor on every node: one per node, holding
`<run>/nodes/<node>.monitor.lock`; utils/run_directory.py `supervisor_files`).

Why the trainer's own lock (`<run>/.lock`, utils/run_directory.py) is not enough: two supervisors
started at the same instant both find it free and both launch a trainer. One trainer wins the
lock; the other exits "in use", and its supervisor, taking that for a crash, relaunches it,
without `--resume` if no checkpoint exists yet, over the run the winner is writing (or has
finished). With this lock, taken before anything is launched, the second supervisor is refused
instead. The same flock mechanism as the trainer's lock: the kernel drops it when its holder
dies, however it dies, so it is never stuck.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from utils.run_directory import SUPERVISOR_LOCK_FILE, RunDirInUse, RunLock


class SupervisedElsewhere(ValueError):
    """Another live supervisor watches this run dir (bad input: exit 2, one line)."""


@contextlib.contextmanager
def only_supervisor(run_dir: str | os.PathLike, lock_file: str = SUPERVISOR_LOCK_FILE
                    ) -> Iterator[None]:
    """Inside the block this process is the only supervisor holding `lock_file` (the run
    dir's, or one node's); else one line saying which process is."""
    lock = RunLock(run_dir, lock_file)
    try:
        lock.acquire()  # a dead supervisor's leftover record is simply taken over
    except RunDirInUse as error:
        raise SupervisedElsewhere(f"another monitor_process.py supervises this run: {error}"
                                  ) from None
    try:
        yield
    finally:
        lock.release()
