"""The device grid: W ranks arranged as P pipeline stages x D data-parallel replicas x C
context-parallel shards x T tensor-parallel shards (W = P * D * C * T), and the process groups of
each dimension.

Rank layout (tensor parallel fastest, then context parallel, as in Megatron-LM: the T ranks of
one tensor-parallel group talk after every matmul, the C ranks of a context-parallel group pass
keys and values around a ring in every attention, so they should be neighbours, e.g. GPUs of
one node). Worked example, W=8, T=2, P=2, C=1, so D=2:

    rank  pp dp tp        tensor-parallel groups  [0,1] [2,3] [4,5] [6,7]
      0    0  0  0        data-parallel groups    [0,2] [1,3] [4,6] [5,7]
      1    0  0  1        pipeline groups         [0,4] [1,5] [2,6] [3,7]
      2    0  1  0
      3    0  1  1        rank = pp * (D * C * T) + dp * (C * T) + cp * T + tp
      4    1  0  0
      ...

and W=8, T=2, C=2, P=1, so D=2: context-parallel groups [0,2] [1,3] [4,6] [5,7], data-parallel
groups [0,4] [1,5] [2,6] [3,7], and the dp x cp groups [0,2,4,6] [1,3,5,7].

Which collective runs in which group: tensor parallel all-reduces (or all-gathers /
reduce-scatters with sequence parallelism) activations inside every block; context parallel
passes K/V blocks around its ring in every attention (parallel/context_parallel/); pipeline
parallel sends activations to the next stage and gradients to the previous one. Gradients are
averaged once per step over the ranks that hold the same weights and see different tokens:
the dp x cp group (`dp_cp_group`; our DDP's process group; without context parallelism it is
the data-parallel group). A tied embedding lives on the first and the last stage;
`embedding_group` links those two ranks.

`check_parallel_shapes` validates every shape constraint before any work; the trainer's option
check calls it, so a bad grid fails in one line that names the option to change.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch.distributed as dist

from model.configuration_z2all import Z2allConfig


def _grid_product(tensor_parallel: int, pipeline_parallel: int, context_parallel: int) -> str:
    """'--tensor_parallel T x --pipeline_parallel P [x --context_parallel C]', for messages."""
    named = f"--tensor_parallel {tensor_parallel} x --pipeline_parallel {pipeline_parallel}"
    return named + (f" x --context_parallel {context_parallel}" if context_parallel > 1 else "")


def check_parallel_shapes(config: Z2allConfig, world_size: int, tensor_parallel: int = 1,
                          pipeline_parallel: int = 1, sequence_parallel: bool = False,
                          seq_len: int | None = None, context_parallel: int = 1) -> None:
    """Raise ValueError (one line naming the option) if the model cannot be split this way."""
    if tensor_parallel < 1 or pipeline_parallel < 1 or context_parallel < 1:
        raise ValueError("--tensor_parallel, --pipeline_parallel and --context_parallel must "
                         "be >= 1")
    if world_size % (tensor_parallel * pipeline_parallel * context_parallel):
        raise ValueError(f"world size {world_size} is not divisible by "
                         f"{_grid_product(tensor_parallel, pipeline_parallel, context_parallel)}")
    t = tensor_parallel
    for name, size in (("num_attention_heads", config.num_attention_heads),
                       ("num_key_value_heads", config.num_key_value_heads),
                       ("intermediate_size", config.intermediate_size)):
        if size % t:  # (the vocabulary need not be: it is padded, tensor_parallel/sharding.py)
            raise ValueError(f"model {name} {size} is not divisible by --tensor_parallel {t}")
    if t > 1 and config.dropout:
        raise ValueError(f"dropout {config.dropout} with --tensor_parallel {t} is not "
                         "supported (replicated regions would need one RNG stream); use 0")
    if context_parallel > 1 and config.dropout:
        raise ValueError(f"dropout {config.dropout} with --context_parallel {context_parallel} "
                         "is not supported (ring attention has no dropout); use 0")
    if config.num_hidden_layers % pipeline_parallel:
        raise ValueError(f"model num_hidden_layers {config.num_hidden_layers} is not divisible "
                         f"by --pipeline_parallel {pipeline_parallel}")
    if sequence_parallel and t == 1:
        raise ValueError("--sequence_parallel needs --tensor_parallel > 1")
    if sequence_parallel and seq_len is not None and seq_len % (t * context_parallel):
        raise ValueError(f"sequence length {seq_len} is not divisible by --tensor_parallel {t}"
                         + (f" x --context_parallel {context_parallel}" if context_parallel > 1
                            else "") + " (--sequence_parallel splits the sequence)")
    check_context_parallel_length(seq_len, context_parallel)


def check_context_parallel_length(seq_len: int | None, context_parallel: int) -> None:
    """Context parallelism cuts every sequence into 2C equal chunks (two per rank, one from
    the cheap head and one from the expensive tail: parallel/context_parallel/load_balance.py)."""
    if context_parallel > 1 and seq_len is not None and seq_len % (2 * context_parallel):
        raise ValueError(f"--max_seq_len {seq_len} is not divisible by 2 x --context_parallel "
                         f"{context_parallel} = {2 * context_parallel} (each rank holds two "
                         "equal chunks of every sequence)")


@dataclass
class ParallelDims:
    """Sizes of the grid; `build_groups()` (collective: every rank calls it) makes the groups."""

    world_size: int
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    context_parallel: int = 1
    rank: int = 0
    tp_group: dist.ProcessGroup | None = field(default=None, repr=False)
    cp_group: dist.ProcessGroup | None = field(default=None, repr=False)  # None when C = 1
    dp_group: dist.ProcessGroup | None = field(default=None, repr=False)
    dp_cp_group: dist.ProcessGroup | None = field(default=None, repr=False)
    """The ranks that hold the same weights and see different tokens: gradients are averaged
    over it (Megatron-LM's data-parallel group "with context parallel")."""
    pp_group: dist.ProcessGroup | None = field(default=None, repr=False)
    embedding_group: dist.ProcessGroup | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        model_parallel = self.tensor_parallel * self.pipeline_parallel * self.context_parallel
        if self.world_size % model_parallel:
            raise ValueError(f"world size {self.world_size} is not divisible by "
                             + _grid_product(self.tensor_parallel, self.pipeline_parallel,
                                             self.context_parallel))

    @property
    def data_parallel(self) -> int:
        return self.world_size // (self.tensor_parallel * self.pipeline_parallel
                                   * self.context_parallel)

    # ---- coordinates (module docstring: rank = pp*(D*C*T) + dp*(C*T) + cp*T + tp) ----------
    def coordinates(self, rank: int) -> tuple[int, int, int, int]:
        """(pp, dp, cp, tp) of a global rank."""
        t, c, d = self.tensor_parallel, self.context_parallel, self.data_parallel
        return rank // (d * c * t), rank // (c * t) % d, rank // t % c, rank % t

    def rank_of(self, pp: int, dp: int, cp: int, tp: int) -> int:
        t, c = self.tensor_parallel, self.context_parallel
        return ((pp * self.data_parallel + dp) * c + cp) * t + tp

    @property
    def pp_rank(self) -> int:
        return self.coordinates(self.rank)[0]

    @property
    def dp_rank(self) -> int:
        return self.coordinates(self.rank)[1]

    @property
    def cp_rank(self) -> int:
        return self.coordinates(self.rank)[2]

    @property
    def tp_rank(self) -> int:
        return self.coordinates(self.rank)[3]

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pipeline_parallel - 1

    def stage_rank(self, pp: int) -> int:
        """Global rank of pipeline stage `pp` that holds the same (dp, cp, tp) shard as this
        rank."""
        _, dp, cp, tp = self.coordinates(self.rank)
        return self.rank_of(pp, dp, cp, tp)

    # ---- process groups ---------------------------------------------------------------------
    def group_ranks(self) -> dict[str, list[list[int]]]:
        """Every group of every dimension, as lists of global ranks (the docstring's tables):
        a group varies its own coordinates and holds the others fixed."""
        sizes = {"pp": self.pipeline_parallel, "dp": self.data_parallel,
                 "cp": self.context_parallel, "tp": self.tensor_parallel}
        order = list(sizes)  # the coordinates' order, slowest first

        def groups(varying: tuple[str, ...]) -> list[list[int]]:
            fixed = [axis for axis in order if axis not in varying]
            return [[self.rank_of(**dict(zip(fixed, held)), **dict(zip(varying, moving)))
                     for moving in itertools.product(*(range(sizes[a]) for a in varying))]
                    for held in itertools.product(*(range(sizes[a]) for a in fixed))]

        pp_groups = groups(("pp",))
        return {"tp": groups(("tp",)), "cp": groups(("cp",)), "dp": groups(("dp",)),
                "dp_cp": groups(("dp", "cp")), "pp": pp_groups,
                "embedding": [sorted({group[0], group[-1]}) for group in pp_groups]}

    def build_groups(self) -> ParallelDims:
        """Create all groups (each rank must call `new_group` for every group, in the same
        order, even for groups it is not in) and keep the ones containing this rank."""
        self.rank = dist.get_rank()
        all_groups = self.group_ranks()
        if self.context_parallel == 1:  # then the dp x cp groups are the dp groups
            del all_groups["cp"], all_groups["dp_cp"]
        for dimension, groups in all_groups.items():
            for ranks in groups:
                group = dist.new_group(ranks)
                if self.rank in ranks:
                    setattr(self, f"{dimension}_group", group)
        if self.context_parallel == 1:
            self.dp_cp_group = self.dp_group
        return self
