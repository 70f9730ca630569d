"""Die with the parent: ask Linux to send us a signal when the process that started us exits.

A supervisor or launcher that is itself killed with SIGKILL cannot pass the signal on, and its
children would keep running as orphans (training on, holding GPUs, colliding with the restart).
`prctl(PR_SET_PDEATHSIG)` makes the kernel do it instead. Caveats: the signal comes when the
parent *thread* that forked us exits (call this from processes started by a main thread), and
the setting is per process (not inherited by our own children: each level sets its own).
Elsewhere than Linux it does nothing and returns False.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def die_with_parent(signum: int, parent_pid: int | None = None) -> bool:
    """Have `signum` sent to this process when its parent exits; True if the OS supports it.

    `parent_pid`: the process that forked us, where known (a multiprocessing child's
    `multiprocessing.parent_process().pid`). A parent that died between the fork and this call
    is then caught too: we are already someone else's child, and signal ourselves.
    Safe in a `preexec_fn` (between fork and exec; the setting survives exec)."""
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid() if parent_pid is None else parent_pid
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        return False
    if os.getppid() != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), signum)
    return True
