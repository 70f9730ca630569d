"""ZeRO stages 2 and 3: gradients (stage 2) and parameters (stage 3) sharded over ranks.

Read flat_param_unit.py (one unit's flat, sharded storage) and then sharded_data_parallel.py
(the hooks that gather, free and reduce around forward and backward). The optimizer over the
shards is optimizer/sharded_optimizer.py.
"""

from .flat_param_unit import FlatParamUnit
from .sharded_data_parallel import (
    ShardedDataParallel,
    group_into_units,
    with_owner_of,
)

__all__ = ["FlatParamUnit", "ShardedDataParallel", "group_into_units", "with_owner_of"]
