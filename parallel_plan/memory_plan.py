"""Will it fit? Bytes per rank for parameters, gradients, optimizer state and activations.

`plan_memory(...)` predicts, for one rank at ZeRO stage 0-3, the bytes of every tensor the
model wrapper and the optimizer keep between steps, laid out exactly as the code lays them out
(DDP's padded buckets for stages 0/1, one padded unit per decoder block plus the root for
stages 2/3), so on a CPU run the prediction equals `measure_memory(...)` to the byte (tests
check it on data-parallel runs and on every rank of tensor/pipeline grids). With P
parameters, W ranks that shard the states (the data-parallel ones; with context parallelism
the dp x cp group), b bytes per param (bf16: 2), g per gradient (4 with
grad_reduce_in_fp32) and AdamW:

    stage   params      grads       optimizer (exp_avg + exp_avg_sq, + fp32 master if b < 4)
    0       P b         P g         8P (+ 4P)
    1       P b         P g         8P/W (+ 4P/W)
    2       P b         P g / W     8P/W (+ 4P/W)
    3       P b / W     P g / W     8P/W (+ 4P/W)
(+ padding to multiples of W, + 4 bytes of Adam step counter per tensor piece.) Stages 2 and 3
also hold, during backward, the whole gradients of the root unit, the computing block and the
`max_reductions_in_flight` (1) blocks reducing (and stage 3 a few units' whole params).

On a grid of T tensor x P pipeline x D data-parallel x C context-parallel ranks
(`tensor_parallel`, `pipeline_parallel`, `context_parallel`; W = D x C: the C ranks of a
context-parallel group hold the same weights, and the states shard over the dp x cp group as
over data-parallel ranks) "the model" is this rank's part of it, built exactly as the
trainer builds it (on the meta device: no memory): its stage's blocks (the first stage also
the embedding, the last the final norm and head, with a tied embedding's copy), every matrix
sliced to 1/T (norm weights whole), then laid out in buckets or units and sharded over the
W = D x C ranks as above, with the same unit boundaries (a pipeline's tied embedding alone in its
unit). Worked example, the tests' 2-layer model (hidden 32, vocab 512 tied, MLP 64; P =
37,024) on DP2 x PP2 at ZeRO-3, fp32: stage 0 holds the embedding (16,384) and layer 0
(10,304), each unit cut in 2, so rank 0 keeps 13,344 parameters (53,376 B); the last stage
16 more (its half of the final norm; its head is the embedding's copy: 8,192 + 5,152 + 16).

LoRA (`lora=`, model/lora.py): P counts the adapters only, since only they are trainable, so only
they reach the buckets, the units, the gradients and the optimizer state. The frozen base (this
rank's part of it, on a grid) is a line of its own, `frozen_base` = P_frozen b, at every stage:
it stays replicated over the data-parallel ranks even under ZeRO-3, because with no gradient
and no optimizer state, sharding it would save only its parameter bytes at the price of
gathering every block's base in every forward and backward.

Activations are an *estimate*, by counting the tensors our decoder block saves for backward,
per token (h hidden, i intermediate, kv = key/value heads x head size):
    each RMSNorm    8h + 4 + hb    its input and output in fp32, 1/rms, the output cast to b
    attention       b(3h + 3kv)    q and k after RoPE, the fused qkv output, the attention output
                    + 4 heads      the softmax log-sum-exp per head (fp32)
    MLP             4ib            the fused gate|up output, silu(gate), silu(gate) * up
The head (final norm, the chunked lm_head's gradient w.r.t. the hidden states, the token ids)
adds 8h + 4 + hb + 4h + 8 per token and its fp32 weight gradient 4Vh, computed in forward.
With activation checkpointing a block keeps only its input (hb) and one block at a time is
recomputed in backward. On a grid: the stage's blocks (and the head on the last stage only),
the tensors tensor parallelism slices (attention's, the MLP's, the head's weight gradient)
1/T, times the micro-batches in flight (a pipeline stage holds several: `in_flight`). With
context parallelism a rank computes S/C tokens of every sequence (its two chunks), so every
per-token term is for B S/C tokens.
`measure_activation_bytes` counts what autograd really saves (a
saved-tensor hook, parameters excluded): the test holds the estimate within
`ACTIVATION_MARGIN` of it without checkpointing, and within `CHECKPOINTED_ACTIVATION_MARGIN`
with it (the forward's saved tensors against the estimate minus the recomputed block: what is
left is small, so the head's per-token terms weigh more; a 1-layer bf16 model measured 16%).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from model.configuration_z2all import Z2allConfig
from model.lora import LoraConfig, apply_lora
from model.modeling_z2all import Z2allForCausalLM
from optimizer.distributed_optimizer.shard_map import overlaps_with_shard
from parallel.distributed_data_parallel.param_and_grad_buffer import pad_to_multiple, plan_layout
from parallel.parallel_dims import ParallelDims
from parallel.pipeline_parallel.schedules import micro_batches_in_flight
from parallel.sharded_data_parallel import ShardedDataParallel, group_into_units
from parallel.tensor_parallel.sharding import padded_size
from parallel_plan.llama_pipeline import split_into_stage
from parallel_plan.llama_tensor_parallel import parallelize_model
from parallel_plan.llama_units import zero_units
from utils.precision import DTYPES

ACTIVATION_MARGIN = 0.15
"""How far the activation estimate may be from the measured saved tensors (fraction)."""
CHECKPOINTED_ACTIVATION_MARGIN = 0.25
"""The same with activation checkpointing (see the module docstring)."""


@dataclass
class MemoryLine:
    name: str
    bytes: int
    formula: str


@dataclass
class MemoryPlan:
    lines: list[MemoryLine] = field(default_factory=list)
    recomputed_block_bytes: int = 0
    """With activation checkpointing: the part of the activations that exists only while one
    block is recomputed in backward."""

    def bytes_of(self, name: str) -> int:
        return next(line.bytes for line in self.lines if line.name == name)

    @property
    def total(self) -> int:
        return sum(line.bytes for line in self.lines)

    def as_measured(self) -> dict[str, int]:
        """The plan under `measure_memory`'s keys, to compare the two: optimizer = Adam's
        moments and counters + fp32 master copies; frozen_base is 0 without LoRA."""
        lines_of = {"params": ("params",), "grads": ("grads",),
                    "optimizer": ("adam_state", "fp32_master"), "frozen_base": ("frozen_base",)}
        return {key: sum(line.bytes for line in self.lines if line.name in names)
                for key, names in lines_of.items()}

    def render(self) -> str:
        rows = [f"{line.name:<12} {line.bytes / 2**30:10.3f} GiB  {line.bytes:>16,} B   "
                f"{line.formula}" for line in self.lines]
        rows.append(f"{'total':<12} {self.total / 2**30:10.3f} GiB  {self.total:>16,} B")
        return "\n".join(rows)


@dataclass
class _Region:
    """A flat stretch of parameters that is sharded as one (a DDP bucket or a ZeRO unit)."""
    sizes: list[int]  # parameter sizes in layout order
    numel: int        # padded to a multiple of W


def stage_model(config: Z2allConfig, dims: ParallelDims, lora: LoraConfig | None = None
                ) -> Z2allForCausalLM:
    """The part of the model rank `dims.rank` holds, on the meta device (no memory): the
    trainer's own split and slicing (trainer/model_parallel.py), so names, shapes and the
    order of registration are the real ones; with `lora`, its adapters on the frozen base."""
    with torch.device("meta"):
        model = Z2allForCausalLM(config)
        if lora is not None:
            apply_lora(model, lora)
    if dims.pipeline_parallel > 1:
        split_into_stage(model, dims)
    if dims.tensor_parallel > 1:  # the layers only keep their group: none is needed here
        parallelize_model(model, dims)
    return model


def _regions(model: nn.Module, zero_stage: int, world_size: int,
             bucket_size: int | None, dims: ParallelDims) -> list[_Region]:
    """The flat stretches the wrappers shard: DDP's buckets (stages 0/1) or ZeRO's units."""
    params = [p for p in model.parameters() if p.requires_grad]
    if zero_stage <= 1:
        index_map, ranges = plan_layout(params, bucket_size, world_size)
        per_bucket: list[list[int]] = [[] for _ in ranges]
        for start, end, bucket in index_map.values():
            per_bucket[bucket].append(end - start)
        return [_Region(sizes, end - start) for sizes, (start, end) in zip(per_bucket, ranges)]
    units, root = group_into_units(model, zero_units(model, dims))
    groups = [root] + [unit_params for _, unit_params in units]
    return [_Region([p.numel() for p in group],
                    pad_to_multiple(sum(p.numel() for p in group), world_size))
            for group in groups if group]


def _pieces_on_rank(region: _Region, rank: int, world_size: int) -> tuple[int, int]:
    """(number of parameter pieces, their elements) inside rank `rank`'s shard of `region`."""
    shard = region.numel // world_size
    starts = [sum(region.sizes[:index]) for index in range(len(region.sizes))]
    overlaps = overlaps_with_shard([(start, start + size) for start, size
                                    in zip(starts, region.sizes)], rank * shard, (rank + 1) * shard)
    return len(overlaps), sum(high - low for _, low, high in overlaps)


def plan_memory(config: Z2allConfig, world_size: int, zero_stage: int, dtype: str,
                batch_size: int, max_seq_len: int, activation_checkpointing: bool = False,
                grad_reduce_in_fp32: bool = True, bucket_size: int | None = 40_000_000,
                rank: int = 0, tensor_parallel: int = 1, pipeline_parallel: int = 1,
                pp_schedule: str = "1f1b", micro_batches: int = 1,
                lora: LoraConfig | None = None, context_parallel: int = 1) -> MemoryPlan:
    """Bytes held by rank `rank` of `world_size` (module docstring); `dtype` is fp32, bf16 or
    fp16; `max_seq_len` the whole sequence (a context-parallel rank computes max_seq_len / C
    of it); `micro_batches` per step (a pipeline stage holds several at once); `lora`: the
    adapters of a LoRA run (None: every parameter trains)."""
    dims = ParallelDims(world_size, tensor_parallel, pipeline_parallel, context_parallel,
                        rank=rank)
    model = stage_model(config, dims, lora)
    plan = MemoryPlan()
    _plan_states(plan, model, dims, zero_stage, DTYPES[dtype].itemsize,
                 4 if grad_reduce_in_fp32 else DTYPES[dtype].itemsize, bucket_size)
    in_flight = micro_batches_in_flight(pp_schedule, pipeline_parallel, dims.pp_rank,
                                        micro_batches)
    _plan_activations(plan, config, dims, DTYPES[dtype].itemsize,
                      batch_size * max_seq_len // context_parallel, activation_checkpointing,
                      in_flight)
    return plan


def _plan_states(plan: MemoryPlan, model: nn.Module, dims: ParallelDims, stage: int, b: int,
                 g: int, bucket_size: int | None) -> None:
    """Steps 1 and 2: parameters, gradients and AdamW's state, as the wrappers lay them out:
    sharded over the W = D x C ranks of the dp x cp group, where this rank is dp C + cp (the
    group's ranks in order, `ParallelDims.group_ranks`)."""
    C = dims.context_parallel
    W, rank = dims.data_parallel * C, dims.dp_rank * C + dims.cp_rank
    params = [p for p in model.parameters() if p.requires_grad]
    P = sum(p.numel() for p in params)
    regions = _regions(model, stage, W, bucket_size, dims)
    padded = sum(region.numel for region in regions)
    shard = padded // W
    parts = [f"stage {dims.pp_rank} of {dims.pipeline_parallel}"] * (dims.pipeline_parallel > 1)
    parts += [f"1/{dims.tensor_parallel} of each sliced matrix"] * (dims.tensor_parallel > 1)
    whose = f", this rank's part ({', '.join(parts)})" if parts else ""

    # Step 1: parameters and gradients.
    param_bytes = {0: P * b, 1: padded * b, 2: padded * b, 3: shard * b}[stage]
    param_formula = {0: "P b", 1: "P b (+ padding)", 2: "P b (+ padding)",
                     3: "P b / W (+ padding)"}[stage]
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    trainable = " trainable (LoRA adapters)" if frozen else ""
    group = f" (D {dims.data_parallel} x C {C})" if C > 1 else ""
    plan.lines.append(MemoryLine("params", param_bytes, f"{param_formula}, P = {P:,}{trainable}"
                                                        f"{whose}, b = {b}, W = {W}{group}"))
    if frozen:
        plan.lines.append(MemoryLine("frozen_base", frozen * b,
                                     f"P_frozen b, P_frozen = {frozen:,} (the LoRA base, "
                                     "replicated: no grads, no optimizer state)"))
    grad_bytes = padded * g if stage <= 1 else shard * g
    plan.lines.append(MemoryLine("grads", grad_bytes,
                                 f"P g{' / W' if stage >= 2 else ''} (+ padding), g = {g}"))

    # Step 2: AdamW's moments and step counters, and fp32 copies of what is not fp32.
    if stage == 0:
        pieces, owned, main_numel = len(params), P, (P if b < 4 else 0)
        grad_copy = 0
    else:
        counts = [_pieces_on_rank(region, rank, W) for region in regions]
        pieces, owned = sum(c for c, _ in counts), sum(n for _, n in counts)
        main_numel = shard if b < 4 else 0
        grad_copy = shard if g < 4 else 0
    over_w = "" if stage == 0 else " / W"
    plan.lines.append(MemoryLine("adam_state", 8 * owned + 4 * pieces,
                                 f"8 P{over_w} (exp_avg, exp_avg_sq) + 4 x {pieces} step counters"))
    if main_numel or grad_copy:
        plan.lines.append(MemoryLine("fp32_master", 4 * (main_numel + grad_copy),
                                     f"4 P{over_w} (fp32 master params"
                                     f"{' and grads' if grad_copy else ''})"))


def _plan_activations(plan: MemoryPlan, config: Z2allConfig, dims: ParallelDims, b: int,
                      tokens: int, activation_checkpointing: bool, in_flight: int) -> None:
    """Step 3: activations, an estimate (module docstring)."""
    h, i = config.hidden_size, config.intermediate_size
    L = config.num_hidden_layers // dims.pipeline_parallel
    T = dims.tensor_parallel
    kv, heads = config.num_key_value_heads * config.head_dim, config.num_attention_heads
    norm = 8 * h + 4 + h * b
    per_block = tokens * (2 * norm + (b * (3 * h + 3 * kv) + 4 * heads + 4 * i * b) // T)
    vocab_slice = padded_size(config.vocab_size, T) // T  # (padded: tensor_parallel/sharding)
    head = (tokens * (norm + 4 * h + 8) + 4 * vocab_slice * h
            if dims.is_last_stage else 0)
    plan.recomputed_block_bytes = per_block if activation_checkpointing else 0
    if activation_checkpointing:
        activations = in_flight * (L * tokens * h * b + head) + per_block
        formula = "L B T h b (block inputs) + one block recomputed + head"
    else:
        activations = in_flight * (L * per_block + head)
        formula = "L B T (2(8h + 4 + hb) + b(3h + 3kv) + 4 heads + 4ib) + head"
    if T > 1 or dims.pipeline_parallel > 1:
        formula += (f"; L = {L} blocks of this stage, sliced terms / T = {T}, x {in_flight} "
                    "micro-batches in flight")
    if dims.context_parallel > 1:
        formula += f"; B T: this rank's S/C tokens of each sequence, C = {dims.context_parallel}"
    margin = CHECKPOINTED_ACTIVATION_MARGIN if activation_checkpointing else ACTIVATION_MARGIN
    plan.lines.append(MemoryLine("activations", activations,
                                 f"~{formula}, B T = {tokens:,} (estimate, ±{margin:.0%})"))


def measure_memory(wrapped: nn.Module, optimizer) -> dict[str, int]:
    """The bytes of the same tensors, read from a live wrapper and optimizer (after a step, when
    Adam's state exists): what `plan_memory`'s params, grads, optimizer and (LoRA)
    frozen_base lines predict; `params` counts the trainable parameters only."""
    if isinstance(wrapped, ShardedDataParallel):  # ZeRO-2/3
        resident = wrapped.resident_bytes()
        params, grads = resident["params"], resident["grads"]
    else:  # our DDP (stage 0/1)
        buffers = wrapped.param_and_grad_buffers
        grads = sum(buf.grad_data.numel() * buf.grad_data.element_size() for buf in buffers)
        if all(buf.param_data is not None for buf in buffers):
            params = sum(buf.param_data.numel() * buf.param_data.element_size()
                         for buf in buffers)
        else:
            params = sum(p.numel() * p.element_size() for p in wrapped.module.parameters()
                         if p.requires_grad)
    frozen = sum(p.numel() * p.element_size() for p in wrapped.module.parameters()
                 if not p.requires_grad)
    return {"params": params, "grads": grads, "optimizer": optimizer.state_bytes(),
            "frozen_base": frozen}


def measure_activation_bytes(model: nn.Module, *args, **kwargs) -> int:
    """Bytes of the distinct tensors autograd saves for backward during `model(*args)`,
    parameters excluded (they are counted as params)."""
    param_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def count(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in param_storages:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(count, lambda tensor: tensor):
        model(*args, **kwargs)
    return sum(saved.values())
