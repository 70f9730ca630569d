"""Will the run fit in this machine's memory, and what to say when it did not.

Before any model is built, each rank compares its memory plan (`memory_plan` below: the
options read into parallel_plan/memory_plan.py's parameters, gradients, optimizer state and
activations it will hold) with what it can get: on CUDA its device's free memory
(`torch.cuda.mem_get_info`), on CPU the host's available memory (psutil) shared by the ranks of
this machine. Rank 0 warns, in one line, when its plan does not fit (the plan is an estimate: a
run slightly over may still get through, so it is a warning, not a refusal).

When an allocation fails anyway (CUDA's `torch.OutOfMemoryError`; on CPU the allocator's
RuntimeError "DefaultCPUAllocator: can't allocate memory", or a `MemoryError`),
`out_of_memory_explained` turns it into `OutOfMemory`: one line naming the rank, its plan
against its limit, and the options that cut memory; `utils.cli_errors.run_main` ends the run
with it, exit code 1 (a runtime failure: the input was fine, this machine is too small).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import psutil
import torch

from model.configuration_z2all import Z2allConfig
from parallel_plan.memory_plan import MemoryPlan, plan_memory
from trainer.distributed_env import DistributedEnv
from trainer.options import TrainingOptions
from trainer.parallelize import effective_zero_stage

# What cuts a rank's memory, most effective first for a run that is over by its activations.
MEMORY_CUTS = ("a smaller --batch_size with a larger --gradient_accumulation_steps (the same "
               "global batch), --activation_checkpointing, --zero_stage 1, 2 or 3 (with several "
               "data-parallel ranks), or --lora_rank (fine-tuning adapters only)")
# How CPU allocations that fail read: PyTorch's allocator (c10/core/impl/alloc_cpu.cpp).
CPU_ALLOCATOR_FAILURE = "DefaultCPUAllocator: can't allocate memory"


class OutOfMemory(MemoryError):
    """A rank ran out of memory; the message says which, its plan and limit, and what to
    change (a MemoryError: run_main ends it with exit code 1, a runtime failure)."""


def memory_plan(options: TrainingOptions, config: Z2allConfig, world_size: int, rank: int,
                dtype: str) -> MemoryPlan:
    """Rank `rank`'s bytes for params, grads, optimizer state and activations, predicted from
    the options (parallel_plan/memory_plan.py); after the first step every rank's measured bytes
    are logged next to it (`"kind": "memory"`, trainer/loop_actions.py). With context
    parallelism a rank holds the activations of S/C tokens of each sequence, and the
    data-parallel states are sharded over the dp x cp group."""
    parallel, optimization = options.parallel, options.optimization
    return plan_memory(config, world_size, effective_zero_stage(parallel), dtype,
                       optimization.batch_size, options.data.max_seq_len,
                       options.model.activation_checkpointing,
                       grad_reduce_in_fp32=parallel.grad_reduce_in_fp32,
                       bucket_size=parallel.bucket_size, rank=rank,
                       tensor_parallel=parallel.tensor_parallel,
                       pipeline_parallel=parallel.pipeline_parallel,
                       pp_schedule=parallel.pp_schedule,
                       micro_batches=optimization.gradient_accumulation_steps,
                       lora=options.lora.config(), context_parallel=parallel.context_parallel)


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
        """Record the plan and this rank's limit now, before the model takes any of it; rank 0
        warns on stderr when its plan does not fit (`fit_warning`)."""
        self.planned = planned
        if env.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(env.device)
            self.limit, self.where = free, f"free on {env.device} (of {readable(total)})"
        else:
            ranks_here = max(env.local_world_size, 1)
            self.limit = psutil.virtual_memory().available // ranks_here
            self.where = ("of host memory available" if ranks_here == 1 else
                          f"of host memory available per rank ({ranks_here} ranks here)")
        if self.rank == 0 and (warning := self.fit_warning()):
            print(warning, file=sys.stderr, flush=True)

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
