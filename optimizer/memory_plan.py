"""Will it fit? Bytes per rank for parameters, gradients, optimizer state and activations.

`plan_memory(...)` predicts, for one rank of a data-parallel run at ZeRO stage 0-3, the bytes of
every tensor the model wrapper and the optimizer keep between steps, laid out exactly as the
code lays them out (DDP's padded buckets for stages 0/1, one padded unit per decoder block plus
the root for stages 2/3), so on a CPU run the prediction equals `measure_memory(...)` to the
byte (a test checks it). With P parameters, W ranks, b bytes per param (bf16: 2), g per
gradient (4 with grad_reduce_in_fp32) and AdamW:

    stage   params      grads       optimizer (exp_avg + exp_avg_sq, + fp32 master if b < 4)
    0       P b         P g         8P (+ 4P)
    1       P b         P g         8P/W (+ 4P/W)
    2       P b         P g / W     8P/W (+ 4P/W)
    3       P b / W     P g / W     8P/W (+ 4P/W)
(+ padding to multiples of W, + 4 bytes of Adam step counter per tensor piece.) Stages 2 and 3
also hold, transiently, one or two units' whole gradient (and stage 3 params) while reducing.

LoRA (`lora=`, model/lora.py): P counts the adapters only, since only they are trainable, so only
they reach the buckets, the units, the gradients and the optimizer state. The frozen base is a
line of its own, `frozen_base` = P_frozen b on every rank at every stage: it stays replicated
even under ZeRO-3, because with no gradient and no optimizer state, sharding it would save only
its parameter bytes at the price of gathering every block's base in every forward and backward.

Activations are an *estimate*, by counting the tensors our decoder block saves for backward,
per token (h hidden, i intermediate, kv = key/value heads x head size):
    each RMSNorm    8h + 4 + hb    its input and output in fp32, 1/rms, the output cast to b
    attention       b(3h + 3kv)    q and k after RoPE, the fused qkv output, the attention output
                    + 4 heads      the softmax log-sum-exp per head (fp32)
    MLP             4ib            the fused gate|up output, silu(gate), silu(gate) * up
The head (final norm, the chunked lm_head's gradient w.r.t. the hidden states, the token ids)
adds 8h + 4 + hb + 4h + 8 per token and its fp32 weight gradient 4Vh, computed in forward.
With activation checkpointing a block keeps only its input (hb) and one block at a time is
recomputed in backward. `measure_activation_bytes` counts what autograd really saves (a
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
from parallel.distributed_data_parallel.param_and_grad_buffer import pad_to_multiple, plan_layout
from parallel.sharded_data_parallel import is_decoder_block
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


def _regions(model: nn.Module, zero_stage: int, world_size: int,
             bucket_size: int | None) -> list[_Region]:
    params = [p for p in model.parameters() if p.requires_grad]
    if zero_stage <= 1:
        index_map, ranges = plan_layout(params, bucket_size, world_size)
        per_bucket: list[list[int]] = [[] for _ in ranges]
        for start, end, bucket in index_map.values():
            per_bucket[bucket].append(end - start)
        return [_Region(sizes, end - start) for sizes, (start, end) in zip(per_bucket, ranges)]
    claimed: set[nn.Parameter] = set()
    groups = []
    for module in model.modules():
        if module is not model and is_decoder_block(module):
            group = [p for p in module.parameters() if p.requires_grad and p not in claimed]
            claimed.update(group)
            groups.append(group)
    groups.insert(0, [p for p in params if p not in claimed])
    return [_Region([p.numel() for p in group],
                    pad_to_multiple(sum(p.numel() for p in group), world_size))
            for group in groups if group]


def _pieces_on_rank(region: _Region, rank: int, world_size: int) -> tuple[int, int]:
    """(number of parameter pieces, their elements) inside rank `rank`'s shard of `region`."""
    shard = region.numel // world_size
    low, high = rank * shard, (rank + 1) * shard
    count = numel = start = 0
    for size in region.sizes:
        overlap = min(start + size, high) - max(start, low)
        if overlap > 0:
            count, numel = count + 1, numel + overlap
        start += size
    return count, numel


def plan_memory(config: Z2allConfig, world_size: int, zero_stage: int, dtype: str,
                batch_size: int, max_seq_len: int, activation_checkpointing: bool = False,
                grad_reduce_in_fp32: bool = True, bucket_size: int | None = 40_000_000,
                rank: int = 0, lora: LoraConfig | None = None) -> MemoryPlan:
    """Bytes held by rank `rank` (module docstring); `dtype` is fp32, bf16 or fp16; `lora`:
    the adapters of a LoRA run (None: every parameter trains)."""
    with torch.device("meta"):
        model = Z2allForCausalLM(config)
        if lora is not None:
            apply_lora(model, lora)
    b = DTYPES[dtype].itemsize
    g = 4 if grad_reduce_in_fp32 else b
    W, stage = world_size, zero_stage
    params = [p for p in model.parameters() if p.requires_grad]
    P = sum(p.numel() for p in params)
    regions = _regions(model, stage, W, bucket_size)
    padded = sum(region.numel for region in regions)
    shard = padded // W
    plan = MemoryPlan()

    # Step 1: parameters and gradients, as the wrappers lay them out.
    param_bytes = {0: P * b, 1: padded * b, 2: padded * b, 3: shard * b}[stage]
    param_formula = {0: "P b", 1: "P b (+ padding)", 2: "P b (+ padding)",
                     3: "P b / W (+ padding)"}[stage]
    trainable = " trainable (LoRA adapters)" if lora is not None else ""
    plan.lines.append(MemoryLine("params", param_bytes,
                                 f"{param_formula}, P = {P:,}{trainable}, b = {b}, W = {W}"))
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
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

    # Step 3: activations (an estimate, see the module docstring).
    h, i, L = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    kv, heads = config.num_key_value_heads * config.head_dim, config.num_attention_heads
    tokens = batch_size * max_seq_len
    norm = 8 * h + 4 + h * b
    per_block = tokens * (2 * norm + b * (3 * h + 3 * kv) + 4 * heads + 4 * i * b)
    head = tokens * (norm + 4 * h + 8) + 4 * config.vocab_size * h
    plan.recomputed_block_bytes = per_block if activation_checkpointing else 0
    if activation_checkpointing:
        activations = L * tokens * h * b + per_block + head
        formula = "L B T h b (block inputs) + one block recomputed + head"
    else:
        activations = L * per_block + head
        formula = "L B T (2(8h + 4 + hb) + b(3h + 3kv) + 4 heads + 4ib) + head"
    margin = CHECKPOINTED_ACTIVATION_MARGIN if activation_checkpointing else ACTIVATION_MARGIN
    plan.lines.append(MemoryLine("activations", activations,
                                 f"~{formula}, B T = {tokens:,} (estimate, ±{margin:.0%})"))
    return plan


def measure_memory(wrapped: nn.Module, optimizer) -> dict[str, int]:
    """The bytes of the same tensors, read from a live wrapper and optimizer (after a step, when
    Adam's state exists): what `plan_memory`'s params, grads, optimizer and (LoRA)
    frozen_base lines predict; `params` counts the trainable parameters only."""
    if hasattr(wrapped, "resident_bytes"):  # ZeRO-2/3
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
