"""The device grid: W ranks arranged as P pipeline stages x D data-parallel replicas x T
tensor-parallel shards (W = P * D * T), and the process groups of each dimension.

Rank layout (tensor parallel fastest, as in Megatron-LM: the T ranks of one tensor-parallel
group talk after every matmul, so they should be neighbours, e.g. GPUs of one node). Worked
example, W=8, T=2, P=2, so D=2:

    rank  pp dp tp        tensor-parallel groups  [0,1] [2,3] [4,5] [6,7]
      0    0  0  0        data-parallel groups    [0,2] [1,3] [4,6] [5,7]
      1    0  0  1        pipeline groups         [0,4] [1,5] [2,6] [3,7]
      2    0  1  0
      3    0  1  1        rank = pp * (D * T) + dp * T + tp
      4    1  0  0
      ...

Which collective runs in which group: tensor parallel all-reduces (or all-gathers /
reduce-scatters with sequence parallelism) activations inside every block; pipeline parallel
sends activations to the next stage and gradients to the previous one; data parallel
averages gradients once per step (our DDP with `process_group=dims.dp_group`). A tied
embedding lives on the first and the last stage; `embedding_group` links those two ranks.

`check_parallel_shapes` validates every shape constraint before any work; the trainer's option
check calls it, so a bad grid fails in one line that names the option to change.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.distributed as dist

from model.configuration_z2all import Z2allConfig


def check_parallel_shapes(config: Z2allConfig, world_size: int, tensor_parallel: int = 1,
                          pipeline_parallel: int = 1, sequence_parallel: bool = False,
                          seq_len: int | None = None) -> None:
    """Raise ValueError (one line naming the option) if the model cannot be split this way."""
    if tensor_parallel < 1 or pipeline_parallel < 1:
        raise ValueError("--tensor_parallel and --pipeline_parallel must be >= 1")
    if world_size % (tensor_parallel * pipeline_parallel):
        raise ValueError(f"world size {world_size} is not divisible by --tensor_parallel "
                         f"{tensor_parallel} x --pipeline_parallel {pipeline_parallel}")
    t = tensor_parallel
    for name, size in (("num_attention_heads", config.num_attention_heads),
                       ("num_key_value_heads", config.num_key_value_heads),
                       ("intermediate_size", config.intermediate_size),
                       ("vocab_size", config.vocab_size)):
        if size % t:
            fix = (" (raise vocab_size_multiple to a multiple of it)" if name == "vocab_size"
                   else "")
            raise ValueError(f"model {name} {size} is not divisible by --tensor_parallel {t}"
                             f"{fix}")
    if t > 1 and config.dropout:
        raise ValueError(f"dropout {config.dropout} with --tensor_parallel {t} is not "
                         "supported (replicated regions would need one RNG stream); use 0")
    if config.num_hidden_layers % pipeline_parallel:
        raise ValueError(f"model num_hidden_layers {config.num_hidden_layers} is not divisible "
                         f"by --pipeline_parallel {pipeline_parallel}")
    if sequence_parallel and t == 1:
        raise ValueError("--sequence_parallel needs --tensor_parallel > 1")
    if sequence_parallel and seq_len is not None and seq_len % t:
        raise ValueError(f"sequence length {seq_len} is not divisible by --tensor_parallel {t} "
                         "(--sequence_parallel splits the sequence)")


@dataclass
class ParallelDims:
    """Sizes of the grid; `build_groups()` (collective: every rank calls it) makes the groups."""

    world_size: int
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    rank: int = 0
    tp_group: dist.ProcessGroup | None = field(default=None, repr=False)
    dp_group: dist.ProcessGroup | None = field(default=None, repr=False)
    pp_group: dist.ProcessGroup | None = field(default=None, repr=False)
    embedding_group: dist.ProcessGroup | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.world_size % (self.tensor_parallel * self.pipeline_parallel):
            raise ValueError(f"world size {self.world_size} is not divisible by "
                             f"--tensor_parallel {self.tensor_parallel} x --pipeline_parallel "
                             f"{self.pipeline_parallel}")

    @property
    def data_parallel(self) -> int:
        return self.world_size // (self.tensor_parallel * self.pipeline_parallel)

    # ---- coordinates (module docstring: rank = pp * (D * T) + dp * T + tp) ------------------
    def coordinates(self, rank: int) -> tuple[int, int, int]:
        """(pp, dp, tp) of a global rank."""
        t, d = self.tensor_parallel, self.data_parallel
        return rank // (d * t), rank // t % d, rank % t

    def rank_of(self, pp: int, dp: int, tp: int) -> int:
        return pp * self.data_parallel * self.tensor_parallel + dp * self.tensor_parallel + tp

    @property
    def pp_rank(self) -> int:
        return self.coordinates(self.rank)[0]

    @property
    def dp_rank(self) -> int:
        return self.coordinates(self.rank)[1]

    @property
    def tp_rank(self) -> int:
        return self.coordinates(self.rank)[2]

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pipeline_parallel - 1

    def stage_rank(self, pp: int) -> int:
        """Global rank of pipeline stage `pp` that holds the same (dp, tp) shard as this rank."""
        _, dp, tp = self.coordinates(self.rank)
        return self.rank_of(pp, dp, tp)

    # ---- process groups ---------------------------------------------------------------------
    def group_ranks(self) -> dict[str, list[list[int]]]:
        """Every group of every dimension, as lists of global ranks (the docstring's table)."""
        p, d, t = self.pipeline_parallel, self.data_parallel, self.tensor_parallel
        tp_groups = [[self.rank_of(pp, dp, tp) for tp in range(t)]
                     for pp in range(p) for dp in range(d)]
        dp_groups = [[self.rank_of(pp, dp, tp) for dp in range(d)]
                     for pp in range(p) for tp in range(t)]
        pp_groups = [[self.rank_of(pp, dp, tp) for pp in range(p)]
                     for dp in range(d) for tp in range(t)]
        embedding_groups = [sorted({group[0], group[-1]}) for group in pp_groups]
        return {"tp": tp_groups, "dp": dp_groups, "pp": pp_groups, "embedding": embedding_groups}

    def build_groups(self) -> ParallelDims:
        """Create all groups (each rank must call `new_group` for every group, in the same
        order, even for groups it is not in) and keep the ones containing this rank."""
        self.rank = dist.get_rank()
        for dimension, groups in self.group_ranks().items():
            for ranks in groups:
                group = dist.new_group(ranks)
                if self.rank in ranks:
                    setattr(self, f"{dimension}_group", group)
        return self
