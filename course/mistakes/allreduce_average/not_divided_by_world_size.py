"""not dividing by the world size.

An all-reduce SUMs the ranks' gradients; DDP wants their average (each rank's loss is a mean
over its own batch), so divide by dist.get_world_size(group) (before the sum: it overflows fp16
less).
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch import Tensor


def allreduce_average_async(tensor: Tensor, process_group: dist.ProcessGroup | None) -> Any:
    return dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=process_group, async_op=True)
