"""Will the run fit in this machine's memory, and what to say when it did not.

Before any model is built, each rank compares its memory plan (parallel_plan/memory_plan.py:
the parameters, gradients, optimizer state and activations it will hold) with what it can get:
on CUDA its device's free memory (`torch.cuda.mem_get_info`), on CPU the host's available
memory (psutil) shared by the ranks of this machine. Rank 0 warns, in one line, when its plan
does not fit (the plan is an estimate: a run slightly over may still get through, so it is a
warning, not a refusal).

When an allocation fails anyway (CUDA's `torch.OutOfMemoryError`; on CPU the allocator's
RuntimeError "DefaultCPUAllocator: can't allocate memory", or a `MemoryError`),
`out_of_memory_explained` turns it into `OutOfMemory`: one line naming the rank, its plan
against its limit, and the options that cut memory; `utils.cli_errors.run_main` ends the run
with it, exit code 1 (a runtime failure: the input was fine, this machine is too small).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import psutil
import torch

from trainer.distributed_env import DistributedEnv

# What cuts a rank's memory, most effective first for a run that is over by its activations.
MEMORY_CUTS = ("a smaller --batch_size with a larger --gradient_accumulation_steps (the same "
               "global batch), --activation_checkpointing, --zero_stage 1, 2 or 3 (with several "
               "data-parallel ranks), or --lora_rank (fine-tuning adapters only)")
# How CPU allocations that fail read: PyTorch's allocator (c10/core/impl/alloc_cpu.cpp).
CPU_ALLOCATOR_FAILURE = "DefaultCPUAllocator: can't allocate memory"


class OutOfMemory(MemoryError):
    """A rank ran out of memory; the message says which, its plan and limit, and what to
    change (a MemoryError: run_main ends it with exit code 1, a runtime failure)."""


def readable(num_bytes: int) -> str:
    """Bytes for people: GiB, MiB, or bytes below one MiB (a test model's plan)."""
    if num_bytes >= 2**30:
        return f"{num_bytes / 2**30:.2f} GiB"
    if num_bytes >= 2**20:
        return f"{num_bytes / 2**20:.2f} MiB"
    return f"{num_bytes:,} B"


@dataclass
class MemoryBudget:
    """One rank's plan against what it can get (`limit`, described by `where`)."""
    rank: int
    planned: int | None = None  # bytes; None until the plan is known
    limit: int | None = None
    where: str = ""

    def measure(self, planned: int, env: DistributedEnv) -> None:
        """Record the plan and this rank's limit now, before the model takes any of it."""
        self.planned = planned
        if env.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(env.device)
            self.limit, self.where = free, f"free on {env.device} (of {readable(total)})"
        else:
            ranks_here = max(env.local_world_size, 1)
            self.limit = psutil.virtual_memory().available // ranks_here
            self.where = ("of host memory available" if ranks_here == 1 else
                          f"of host memory available per rank ({ranks_here} ranks here)")

    def fit_warning(self) -> str | None:
        """One line when the plan exceeds the limit, else None."""
        if self.planned is None or self.limit is None or self.planned <= self.limit:
            return None
        return (f"warning: rank {self.rank}'s memory plan ({readable(self.planned)}) exceeds the "
                f"{readable(self.limit)} {self.where}: it will likely run out of memory; cut it "
                f"with {MEMORY_CUTS}")

    def explain(self, error: BaseException) -> str:
        plan = ("" if self.planned is None else
                f"; its memory plan is {readable(self.planned)} against "
                f"{readable(self.limit or 0)} {self.where}")
        detail = " ".join(str(error).split()) or type(error).__name__
        if CPU_ALLOCATOR_FAILURE in detail:  # drop the "[enforce fail at alloc_cpu.cpp...]"
            detail = detail[detail.index(CPU_ALLOCATOR_FAILURE):]
        detail = detail if len(detail) <= 200 else detail[:200] + "..."
        return (f"rank {self.rank} ran out of memory ({detail}){plan}; cut memory with "
                f"{MEMORY_CUTS}")


def is_out_of_memory(error: BaseException) -> bool:
    return (isinstance(error, (torch.OutOfMemoryError, MemoryError))
            or (isinstance(error, RuntimeError) and CPU_ALLOCATOR_FAILURE in str(error)))


@contextlib.contextmanager
def out_of_memory_explained(env: DistributedEnv) -> Iterator[MemoryBudget]:
    """Inside the block, running out of memory raises `OutOfMemory` with the budget's line
    (the caller fills the budget in once the plan is known)."""
    budget = MemoryBudget(env.rank)
    try:
        yield budget
    except OutOfMemory:
        raise
    except Exception as error:  # noqa: BLE001 - only out-of-memory errors are translated
        if not is_out_of_memory(error):
            raise
        raise OutOfMemory(budget.explain(error)) from error
