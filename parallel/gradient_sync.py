"""`GradientSync`: what code that runs backward passes needs from a data-parallel wrapper.

The training loop and the pipeline schedule run several backwards per optimizer step
(gradient accumulation; a pipeline's micro-batches) and then read gradients. Two wrappers
keep them: our DDP (parallel/distributed_data_parallel/: whole gradients in `main_grad`,
reduced once per step) and ZeRO-2/3's ShardedDataParallel (parallel/sharded_data_parallel/:
each rank keeps its shard, reduced every backward). Both answer the same calls, so the
callers need not know which one they drive:

    no_sync()              a context: the backwards inside it are not the step's last
                           (DDP: do not reduce yet; ZeRO-3: keep the root unit gathered)
    finish_grad_sync()     after the last backward: every reduction done
    accumulated_grad(p)    the gradient of `p` this rank accumulates: DDP's whole
                           `main_grad` (before finish_grad_sync: this rank's sum), ZeRO-2/3
                           this rank's shard (already averaged over the group). A sum of it
                           over ranks that hold the same elements, such as a pipeline's two
                           copies of a tied embedding, commutes with the data-parallel average.
    gathered_params()      a context (every rank enters): inside, every weight is whole, for
                           one rank alone to generate from or save (DDP: always; ZeRO-3
                           gathers its shards and keeps them until the block ends)
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol

from torch import Tensor
from torch.nn import Parameter


class GradientSync(Protocol):
    def no_sync(self) -> AbstractContextManager[None]: ...

    def finish_grad_sync(self) -> None: ...

    def accumulated_grad(self, param: Parameter) -> Tensor: ...

    def gathered_params(self) -> AbstractContextManager[None]: ...
