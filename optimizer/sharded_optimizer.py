"""The optimizer of ZeRO stages 2 and 3: AdamW over this rank's shards of every unit.

parallel/sharded_data_parallel/ leaves, for every unit, this rank's shard of the parameters
(`unit.param_shard`) and of the averaged gradient (`unit.grad_shard`, fp32). That is the same
situation as ZeRO-1 after its reduce-scatter, so this optimizer *is* ZeRO-1's
`DistributedOptimizer` with another source of shards: the step recipe (clip on the global
norm summed over shards, AdamW on fp32 pieces), the per-rank checkpoint files and their
re-cutting for any world size are inherited unchanged. What differs:

    shards     one per unit (a decoder block or the root), not per DDP bucket
    Step 5     stage 2: all-gather the updated shards into the whole params
               stage 3: nothing: the shards are the params at rest

Mixed precision: for bf16/fp16 params the fp32 master copy of the shard is made here (1/W of
the model per rank), for fp32 params the shard is updated in place.

Because pieces are addressed by (parameter name, element range), the files written here load
into ZeRO-1 at any world size and vice versa (zero1_checkpoint.py).
"""

from __future__ import annotations

from typing import Any

from optimizer.distributed_optimizer.distributed_optimizer import (
    BucketShard,
    DistributedOptimizer,
    fp32_shard,
)
from optimizer.distributed_optimizer.shard_map import ShardPiece, pieces_in_range
from optimizer.optimizer import MixedPrecisionOptimizer
from optimizer.optimizer_config import OptimizerConfig
from parallel.sharded_data_parallel import FlatParamUnit, ShardedDataParallel


def unit_pieces(unit: FlatParamUnit) -> list[ShardPiece]:
    """Intersect each parameter's [start, end) in the unit's flat buffer with this rank's shard
    (the same cut as shard_map.py's, with a unit in place of a bucket)."""
    return pieces_in_range(unit.params, unit.param_names, unit.ranges, unit.shard_start,
                           unit.shard_start + unit.shard_size)


class ShardedOptimizer(DistributedOptimizer):
    """AdamW over the shards of a `ShardedDataParallel` model (ZeRO-2 or ZeRO-3)."""

    def __init__(self, config: OptimizerConfig, sharded_model: ShardedDataParallel) -> None:
        if config.cpu_offload or config.overlap_param_gather or config.overlap_step:
            raise ValueError("cpu_offload, overlap_param_gather and overlap_step are ZeRO-1/DDP "
                             "options; turn them off for ZeRO stage 2/3")
        self.world_size = sharded_model.data_parallel_world_size
        self.rank = sharded_model.data_parallel_rank
        self.param_names = sharded_model.param_names
        self.bucket_shards = [self._build_unit_shard(unit) for unit in sharded_model.units]
        model_and_main = [(piece.param, main) for piece, main in self._owned_pieces()]
        MixedPrecisionOptimizer.__init__(self, config, sharded_model, model_and_main,
                                         grads_sharded=True)
        self._pending_gathers: dict[int, Any] = {}
        self._reported_unwaited_gathers = False

    @staticmethod
    def _build_unit_shard(unit: FlatParamUnit) -> BucketShard:
        pieces = unit_pieces(unit)
        main_param_shard = fp32_shard(unit.param_shard, cpu_offload=False)
        return BucketShard(
            bucket=unit, model_param_shard=unit.param_shard, model_grad_shard=unit.grad_shard,
            main_param_shard=main_param_shard,
            main_grad_shard=fp32_shard(unit.grad_shard, cpu_offload=False), pieces=pieces,
            main_pieces=[main_param_shard[p.shard_start:p.shard_end] for p in pieces])

    def _copy_main_params_to_model_params(self) -> None:
        """Step 5: write the fp32 shards into the params' shards, then stage 2 re-gathers."""
        for shard in self.bucket_shards:
            if shard.main_param_shard is not shard.model_param_shard:
                shard.model_param_shard.copy_(shard.main_param_shard)  # rounds to bf16/fp16
        self.ddp_model.after_optimizer_step()
