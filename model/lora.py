"""LoRA: fine-tune a frozen model through small low-rank updates (Hu et al. 2021).

A targeted linear layer keeps its weight W [out, in] frozen and learns two small matrices,
A [r, in] and B [out, r], with r much smaller than in and out:

    y = W x + (alpha / r) * B A dropout(x)

B starts at zero, so training starts exactly at the base model; A starts like a fresh
`nn.Linear` (Kaiming-uniform), as in the paper and peft. With r = 8 on a 2048 x 2048
projection the update has 8 * (2048 + 2048) = 32,768 parameters instead of 4,194,304: only
these get gradients, gradient buffers and Adam moments (see bench/bench_lora.py).

Targets are named as in HF Llama (`q_proj`, ..., `down_proj`), so an adapter maps one to one
onto a peft adapter. Two of our matrices stack several HF projections in their rows
(`model/hf_llama_mapping.py`), so one `LoraLinear` may hold one (A, B) pair per *row slice*:

    qkv_proj.weight [H*D + 2*KV*D, hidden], targets q_proj, v_proj (not k_proj):
        rows 0 .. H*D            q_proj   + (alpha/r) * B_q A_q dropout(x)
        rows H*D .. H*D+KV*D     k_proj   (no adapter: unchanged)
        rows H*D+KV*D .. end     v_proj   + (alpha/r) * B_v A_v dropout(x)

which is exactly what peft computes on HF's three separate layers (each slice draws its own
dropout mask, as each peft layer does). The base weight keeps its parameter name
(`...qkv_proj.weight`); the adapters are `...qkv_proj.lora_A.q_proj` [r, in] and
`...qkv_proj.lora_B.q_proj` [rows, r].

Also here: merging (W += (alpha/r) B A, for inference at the base model's speed) and
unmerging, `adapters_disabled` (the base model's output without a second copy of its weights:
the DPO reference), and the adapter-only state dict a LoRA checkpoint stores. Tensor
parallelism slices a `LoraLinear` like its base weight (parallel_plan/tensor_parallel_lora.py): it
subclasses this layer, wraps its forward in the collectives and overrides `adapter_weights`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from model.configuration_z2all import Z2allConfig
from model.hf_llama_mapping import hf_projection_rows
from model.modeling_z2all import Z2allForCausalLM

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class LoraConfig:
    rank: int = 0
    """r, the rank of each update B A; 0 = LoRA off (full fine-tuning)."""
    alpha: float = 16.0
    """The update is scaled by alpha / rank (so a changed rank needs no new learning rate)."""
    dropout: float = 0.0
    """Dropout on the adapters' input (training only; the frozen path sees no dropout)."""
    targets: str = ",".join(ALL_TARGETS)
    """Comma list of HF Llama projection names that get an adapter."""

    def __post_init__(self) -> None:
        if self.rank < 0:
            raise ValueError(f"--lora_rank must be >= 0 (0 = off), got {self.rank}")
        if not (math.isfinite(self.alpha) and self.alpha > 0):  # nan would fail only later
            raise ValueError(f"--lora_alpha must be a finite number > 0, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"--lora_dropout must be in [0, 1), got {self.dropout}")
        unknown = [name for name in self.target_names if name not in ALL_TARGETS]
        if unknown or not self.target_names:
            raise ValueError(f"--lora_targets {self.targets!r}: choose from "
                             f"{','.join(ALL_TARGETS)} (comma-separated)")

    @property
    def target_names(self) -> list[str]:
        return [name.strip() for name in self.targets.split(",") if name.strip()]

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def check_fits(self, model_config: Z2allConfig) -> None:
        """Refuse a rank above min(in, out) of a targeted projection: B A can have no higher
        rank, so the extra rows only cost memory (a huge --lora_rank is killed for it)."""
        hidden = model_config.hidden_size
        in_features = {"qkv_proj": hidden, "gate_up_proj": hidden,
                       "o_proj": model_config.num_attention_heads * model_config.head_dim,
                       "down_proj": model_config.intermediate_size}
        limits = {name: min(rows, in_features[layer])
                  for layer, row_slices in hf_projection_rows(model_config).items()
                  for name, rows in row_slices if name in self.target_names}
        smallest = min(limits, key=limits.get)
        if self.rank > limits[smallest]:
            raise ValueError(f"--lora_rank={self.rank} exceeds min(in, out) = "
                             f"{limits[smallest]} of {smallest}, the smallest of "
                             f"--lora_targets: use --lora_rank <= {limits[smallest]}")


class LoraLinear(nn.Module):
    """A frozen linear layer (no bias) plus one LoRA update per targeted row slice."""

    def __init__(self, base: nn.Linear, row_slices: list[tuple[str, int]],
                 config: LoraConfig,
                 adapters: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None) -> None:
        """`adapters`: (A, B) of each targeted slice to start from (tensor parallelism passes
        its slices of a whole layer's); None: fresh ones, A Kaiming-uniform and B zero."""
        super().__init__()
        self.weight = base.weight  # the same Parameter: same name in the state dict
        self.weight.requires_grad_(False)
        self.row_slices = row_slices
        self.config = config
        self.scaling = config.scaling
        self.dropout = config.dropout
        self.merged = False
        self.adapters_enabled = True
        factory = dict(dtype=base.weight.dtype, device=base.weight.device)
        self.lora_A = nn.ParameterDict()
        self.lora_B = nn.ParameterDict()
        for name, rows in row_slices:
            if name not in config.target_names:
                continue
            if adapters is not None:
                lora_a, lora_b = adapters[name]
            else:
                lora_a = torch.empty(config.rank, base.in_features, **factory)
                nn.init.kaiming_uniform_(lora_a, a=math.sqrt(5))  # nn.Linear's (and peft's)
                lora_b = torch.zeros(rows, config.rank, **factory)
            self.lora_A[name] = nn.Parameter(lora_a)
            self.lora_B[name] = nn.Parameter(lora_b)

    def adapter_weights(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(A, B) of row slice `name` as the forward multiplies by them."""
        return self.lora_A[name], self.lora_B[name]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight)
        if self.merged or not self.adapters_enabled:
            return out
        slices = list(out.split([rows for _, rows in self.row_slices], dim=-1))
        for index, (name, _) in enumerate(self.row_slices):
            if name in self.lora_A:
                lora_a, lora_b = self.adapter_weights(name)
                adapter_input = F.dropout(x, self.dropout, self.training)
                update = F.linear(F.linear(adapter_input, lora_a), lora_b)
                slices[index] = slices[index] + self.scaling * update
        return torch.cat(slices, dim=-1) if len(slices) > 1 else slices[0]

    @torch.no_grad()
    def _add_updates_to_weight(self, sign: int) -> None:
        """W[slice] += sign * (alpha/r) B A for every adapter, computed in fp32."""
        start = 0
        for name, rows in self.row_slices:
            if name in self.lora_A:
                update = self.lora_B[name].float() @ self.lora_A[name].float()
                rows_of_weight = self.weight[start:start + rows]
                rows_of_weight.copy_(rows_of_weight.float() + sign * self.scaling * update)
            start += rows

    def merge(self) -> None:
        if not self.merged:
            self._add_updates_to_weight(+1)
            self.merged = True

    def unmerge(self) -> None:
        """Subtract the updates again (exact up to rounding of W + update - update)."""
        if self.merged:
            self._add_updates_to_weight(-1)
            self.merged = False


def apply_lora(model: Z2allForCausalLM, config: LoraConfig) -> Z2allForCausalLM:
    """Freeze every parameter of `model` and put adapters on the targeted projections, in
    place; afterwards only the adapters have `requires_grad` (so only they reach our DDP's
    buckets, the optimizer and ZeRO-1's shards). Returns the model."""
    if config.rank == 0:
        raise ValueError("apply_lora needs --lora_rank >= 1 (0 means LoRA off)")
    # Step 1: freeze the base.
    for param in model.parameters():
        param.requires_grad_(False)
    # Step 2: replace each linear layer that holds a targeted HF projection.
    projections = hf_projection_rows(model.config)
    for block in model.model.layers:
        for parent in (block.self_attn, block.mlp):
            for attribute, row_slices in projections.items():
                layer = getattr(parent, attribute, None)
                targeted = any(name in config.target_names for name, _ in row_slices)
                if isinstance(layer, nn.Linear) and targeted:
                    setattr(parent, attribute, LoraLinear(layer, row_slices, config))
    return model


def lora_layers(model: nn.Module) -> list[LoraLinear]:
    return [module for module in model.modules() if isinstance(module, LoraLinear)]


def lora_config_of(model: nn.Module) -> LoraConfig | None:
    """The config `apply_lora` gave `model` (or any part of it that holds adapters, e.g. a
    pipeline stage); None without adapters."""
    layers = lora_layers(model)
    return layers[0].config if layers else None


def linear_with_weight(weight: nn.Parameter) -> nn.Linear:
    """A bias-free `nn.Linear` whose weight is `weight` itself (no copy, no new init)."""
    out_features, in_features = weight.shape
    layer = nn.Linear(in_features, out_features, bias=False, device="meta")
    layer.weight = weight
    return layer


def merge_lora(model: nn.Module) -> None:
    for layer in lora_layers(model):
        layer.merge()


def unmerge_lora(model: nn.Module) -> None:
    for layer in lora_layers(model):
        layer.unmerge()


def merge_and_unload(model: Z2allForCausalLM) -> Z2allForCausalLM:
    """Fold every adapter into its weight and put plain `nn.Linear`s back: the result is an
    ordinary model (same state-dict names as the base) for export and inference."""
    for parent in list(model.modules()):
        for attribute, child in list(parent.named_children()):
            if isinstance(child, LoraLinear):
                child.merge()
                setattr(parent, attribute, linear_with_weight(child.weight))
    return model


@contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """Inside this block the model computes the frozen base model (e.g. DPO's reference
    policy, with no second copy of the weights). Refused while merged: the weights would
    still carry the updates."""
    layers = lora_layers(model)
    if any(layer.merged for layer in layers):
        raise ValueError("adapters_disabled: the adapters are merged into the weights; "
                         "call unmerge_lora(model) first")
    for layer in layers:
        layer.adapters_enabled = False
    try:
        yield
    finally:
        for layer in layers:
            layer.adapters_enabled = True


# ---------------------------------------------------------------------- adapter state

def is_adapter_name(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def lora_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapters only, under their parameter names (what a LoRA checkpoint stores)."""
    return {name: tensor.detach() for name, tensor in model.state_dict().items()
            if is_adapter_name(name)}


def load_lora_state_dict(model: nn.Module, state: dict[str, torch.Tensor],
                         source: str = "<state>") -> None:
    """Copy saved adapters into a model that `apply_lora` prepared with the same config;
    names and shapes must match exactly (else the error names the first differences)."""
    expected = lora_state_dict(model)
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{source}: adapters do not match the LoRA config: missing "
                         f"{missing[:3]}, unexpected {unexpected[:3]}")
    with torch.no_grad():
        for name, tensor in expected.items():
            if tensor.shape != state[name].shape:
                raise ValueError(f"{source}: {name} has shape {list(state[name].shape)}, "
                                 f"the LoRA config gives {list(tensor.shape)}")
            tensor.copy_(state[name])


def weights_fingerprint(model: nn.Module) -> str:
    """16 hex digits of a sha256 over the non-adapter tensors (names, dtypes, shapes, bytes):
    proves that the base a LoRA checkpoint is reloaded on is the one it was trained on."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        if is_adapter_name(name):
            continue
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{list(tensor.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]
