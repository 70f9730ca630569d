"""Our DistributedDataParallel: bucketed, overlapped gradient averaging with pluggable comm hooks.

Read in this order: distributed_data_parallel_config.py (the knobs), param_and_grad_buffer.py
(the memory layout), distributed_data_parallel.py (the hooks and the step), then
ddp_comm_hooks/ (default_hooks, powerSGD_hook). The optimizers that use these buffers
(incl. ZeRO-1 and the overlapped AdamW hook) live in optimizer/.
"""

from .distributed_data_parallel import DistributedDataParallel
from .distributed_data_parallel_config import DistributedDataParallelConfig
from .param_and_grad_buffer import Bucket, ParamAndGradBuffer

__all__ = ["Bucket", "DistributedDataParallel", "DistributedDataParallelConfig",
           "ParamAndGradBuffer"]
