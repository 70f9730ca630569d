"""Prepare data once per job under torchrun: rank 0 builds, the other ranks wait for a file.

Why not a barrier? A collective would make the other ranks wait under the process group's
timeout (often 10-30 min, tuned for training steps), and tokenizing a large SFT/DPO set can
take longer. Waiting on a *done-file* with its own, separate timeout keeps the two apart, and
a finished cache is reused by later runs without any rank doing work.

    rank 0:   done-file exists? -> use it. Else build (files appear atomically), then write it.
    rank > 0: poll until the done-file appears; after `timeout_s` raise TimeoutError.

If rank 0 fails, torchrun stops the other ranks. The cache directory must be on a filesystem
every rank can see (a shared disk for multi-node jobs).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist

DEFAULT_PREPARE_TIMEOUT_S = 3600.0
POLL_INTERVAL_S = 0.5


def global_rank() -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def prepare_once(done_path: str | Path, build: Callable[[], None], what: str,
                 timeout_s: float = DEFAULT_PREPARE_TIMEOUT_S) -> None:
    """Make sure `done_path` exists: rank 0 runs `build()` (which must create it), others wait."""
    done_path = Path(done_path)
    if done_path.exists():
        return
    rank = global_rank()
    if rank == 0:
        print(f"rank 0: preparing {what} (other ranks wait for {done_path})", flush=True)
        build()
        if not done_path.exists():
            raise RuntimeError(f"preparing {what} finished without writing {done_path}")
        return
    deadline = time.monotonic() + timeout_s
    while not done_path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank}: waited {timeout_s:.0f}s for rank 0 to prepare "
                               f"{what} ({done_path} never appeared); raise the timeout or "
                               "prepare the data offline before training")
        time.sleep(POLL_INTERVAL_S)
