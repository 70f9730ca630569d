"""Who am I, where do I compute, and how the ranks agree: the trainer's process setup.

`python train_my_ddp.py` is a world of one; `torchrun --nproc_per_node=N train_my_ddp.py` sets
RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE / MASTER_ADDR / MASTER_PORT for each rank.
The backend follows the device: NCCL for CUDA tensors, gloo for CPU. A process group that
already exists (our multi-process tests create one) is used as it is.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from utils.cli_errors import EXIT_RUNTIME_FAILURE, ReportedElsewhere, exit_code

T = TypeVar("T")


@dataclass(frozen=True)
class DistributedEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    owns_process_group: bool = False  # created here, so destroyed here at the end

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def cpu_threads_per_rank(local_world_size: int, requested: int | None) -> int:
    """`requested`, else this machine's cores shared evenly by the ranks on it."""
    if requested:
        return requested
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // local_world_size)


def is_main_process() -> bool:
    """Rank 0, known before the process group exists (torchrun's RANK): every rank reads the
    options, and what they have to say about them is said once."""
    return int(os.environ.get("RANK", 0)) == 0


def init_distributed(device: str = "auto", num_threads: int | None = None,
                     timeout_s: float = 600.0) -> DistributedEnv:
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        torch.cuda.set_device(local_rank)
        torch_device = torch.device("cuda", local_rank)
    else:
        torch_device = torch.device(device)
    threads = cpu_threads_per_rank(local_world_size, num_threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)  # for DataLoader workers started later
    torch.set_num_threads(threads)
    # Our DDP and optimizers speak torch.distributed even in a world of one process; that
    # world needs no rendezvous, so it gets an in-memory store instead of MASTER_ADDR/PORT.
    owns_process_group = not dist.is_initialized()
    if owns_process_group:
        backend = "nccl" if torch_device.type == "cuda" else "gloo"
        timeout = timedelta(seconds=timeout_s)
        if world_size > 1:
            dist.init_process_group(backend, timeout=timeout)
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                    timeout=timeout)
    if dist.is_initialized():
        rank, world_size = dist.get_rank(), dist.get_world_size()
    return DistributedEnv(rank, world_size, local_rank, local_world_size, torch_device,
                          owns_process_group)


def barrier(env: DistributedEnv) -> None:
    if env.is_distributed:
        dist.barrier()


def all_reduce_sum(values: list[float], env: DistributedEnv) -> list[float]:
    """Sum a few floats over ranks (float64, on the compute device so NCCL accepts them)."""
    if not env.is_distributed:
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=env.device)
    dist.all_reduce(tensor)
    return tensor.tolist()


def all_reduce_sum_lists(lists: list[list[float]], env: DistributedEnv) -> list[list[float]]:
    """Several `all_reduce_sum`s in one collective: the lists are summed as one vector and
    cut back to their lengths, so a step that sums a loss, some counts and a table of bytes
    waits for the other ranks once, not once per list."""
    summed = all_reduce_sum([value for values in lists for value in values], env)
    cuts, start = [], 0
    for values in lists:
        cuts.append(summed[start:start + len(values)])
        start += len(values)
    return cuts


def broadcast_from_main(value: Any, env: DistributedEnv) -> Any:
    """Rank 0's `value` on every rank (any picklable object)."""
    if not env.is_distributed:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def check_on_main(check: Callable[[], T], env: DistributedEnv) -> T:
    """Run an input check (reading files: an --init_from model) on rank 0 alone and share its
    verdict: rank 0 raises the error, the other ranks exit with its exit code without a word
    (`ReportedElsewhere`), so a run of N ranks says what is wrong once, not N times (and none
    is left waiting for rank 0 in a collective). What the check returns (what it resolved:
    the --init_from model's directory) is rank 0's on every rank, so all ranks use the one
    thing that was checked."""
    problem, result = None, None
    if env.is_main:
        try:
            result = check()
        except Exception as error:  # noqa: BLE001 - re-raised below, once every rank knows
            problem = error
    code, result = broadcast_from_main((None if problem is None else exit_code(problem)
                                        or EXIT_RUNTIME_FAILURE, result), env)
    if problem is not None:
        raise problem
    if code is not None:
        raise ReportedElsewhere(code)
    return result


def loaded_on_every_rank(load: Callable[[], T], env: DistributedEnv) -> tuple[T | None, str | None]:
    """Run `load` (reading files: a checkpoint) on every rank and agree on how it went, where
    `check_on_main` has rank 0 alone check: (load(), None) when it succeeded on every rank,
    else (None, why) on all of them, so that they all go on to the next checkpoint together.
    Errors of a file that does not load (OSError, ValueError: a CheckpointError among them,
    KeyError, RuntimeError) are caught; anything else (a bug) propagates."""
    result, error = None, None
    try:
        result = load()
    except (OSError, ValueError, KeyError, RuntimeError) as exception:
        error = f"{type(exception).__name__}: {exception}"
    failed_ranks = all_reduce_sum([float(error is not None)], env)[0]
    if error is None and failed_ranks:
        error = f"it failed on {int(failed_ranks)} other rank(s)"
    return (result, None) if error is None else (None, error)


def shutdown_distributed(env: DistributedEnv) -> None:
    if env.owns_process_group and dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def writing_together(env: DistributedEnv, what: str) -> Iterator[None]:
    """Run the block on every rank, then wait for all of them (a barrier). If the block raised
    on some rank, every rank raises: the failing ones their own error, the others an OSError
    naming `what`; without this, a rank whose write failed would leave the others waiting at
    the next collective until the process-group timeout."""
    error: Exception | None = None
    try:
        yield
    except Exception as caught:  # noqa: BLE001 - re-raised below, after the vote
        error = caught
    (failed_ranks,) = all_reduce_sum([float(error is not None)], env)
    if error is not None:
        raise error
    if failed_ranks:
        raise OSError(errno.EIO, f"{what} failed on {int(failed_ranks)} other rank(s); "
                                 "their error is above")
