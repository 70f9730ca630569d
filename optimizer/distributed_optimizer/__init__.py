"""ZeRO-1: optimizer state sharded over data-parallel ranks.

Read shard_map.py (which elements each rank owns), then distributed_optimizer.py (the step),
then zero1_checkpoint.py (per-rank files, re-cut for any world size on load).
"""

from .distributed_optimizer import DistributedOptimizer

__all__ = ["DistributedOptimizer"]
