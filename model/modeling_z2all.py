"""`Z2allForCausalLM`: a llama2-style decoder-only transformer (Touvron et al. 2023).

    input_ids [B, T] -> embed_tokens -> N x DecoderBlock -> norm -> lm_head -> logits [B, T, V]
    DecoderBlock:  h = h + Attention(RMSNorm(h))      (pre-norm residual blocks)
                   h = h + SwiGLUMLP(RMSNorm(h))

Parameter names are HF Llama's (see `model/hf_llama_mapping.py` for the two fused matrices),
and the state dict is the same whichever kernels run (`model/kernels.py`). Parameters may be
fp32, bf16 or fp16; norms, softmax and the loss always run in fp32 inside.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save
from torch import nn
from torch.utils.checkpoint import checkpoint

from model import kernels
from model.attention import (
    Attention,
    attention_layout_for,
    context_parallel_layout,
    position_ids_for,
)
from model.chunked_lm_head import LMHead
from model.configuration_z2all import Z2allConfig
from model.generation import GenerationMixin
from model.hf_llama_mapping import config_from_hf, state_dict_from_hf
from model.kv_cache import KVCache
from model.mlp import SwiGLUMLP
from model.rms_norm import RMSNorm
from model.rope import rotary_cos_sin
from model.sequence_shard import SequenceShard
from utils.atomic_io import atomic_write_bytes
from utils.labels import IGNORE_INDEX

logger = logging.getLogger(__name__)
_logged_kernel_choices: set[tuple[str, torch.dtype]] = set()

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
HF_INDEX_FILE = "model.safetensors.index.json"


@dataclass
class CausalLMOutput:
    loss: torch.Tensor | None = None
    """Mean cross-entropy over labels != -100 (fp32 scalar), when labels were given."""
    logits: torch.Tensor | None = None
    """[B, T, vocab] when no labels were given (under context parallelism: of this rank's
    share of the tokens). With labels the loss is computed chunk by chunk without ever holding
    all logits (`model/chunked_lm_head.py`), and this is None."""


class DecoderBlock(nn.Module):
    def __init__(self, config: Z2allConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SwiGLUMLP(config)
        self.dropout = config.dropout

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                layout: kernels.AttentionLayout, kv_cache: KVCache | None = None
                ) -> torch.Tensor:
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), cos, sin, layout,
                                         kv_cache)
        mlp_out = self.mlp(self.post_attention_layernorm(hidden))
        return hidden + (F.dropout(mlp_out, self.dropout, self.training) if self.dropout
                         else mlp_out)


def _compute_dtype(reference: torch.Tensor) -> torch.dtype:
    """The dtype activations run in: autocast's if active, else the parameters'."""
    if torch.is_autocast_enabled(reference.device.type):
        return torch.get_autocast_dtype(reference.device.type)
    return reference.dtype


def kernels_already_reported(device: torch.device, dtype: torch.dtype) -> None:
    """For a caller that printed a fuller kernel line itself (the trainer's names the optimizer
    too): the model does not log its own again."""
    _logged_kernel_choices.add((device.type, dtype))


def _log_kernels_once(device: torch.device, dtype: torch.dtype, head_dim: int) -> None:
    if (device.type, dtype) not in _logged_kernel_choices:
        _logged_kernel_choices.add((device.type, dtype))
        choices = kernels.kernel_choices(device, dtype, head_dim)
        logger.info("model kernels on %s/%s: %s", device.type, str(dtype).removeprefix("torch."),
                    ", ".join(f"{op}={impl}" for op, impl in choices.items()))


class BlockInputs(NamedTuple):
    """What every decoder block reads besides the hidden states, made once per forward."""

    cos: torch.Tensor
    """RoPE at the tokens' positions, scaled as `config.rope_scaling` says: [B or 1, T, D]."""
    sin: torch.Tensor
    layout: kernels.AttentionLayout
    """Who attends to whom (causal, padding, packed samples) and with which kernel."""


class Z2allModel(nn.Module):
    """The transformer body: token ids -> final normalised hidden states.

    Its parts are methods (or modules) of their own, `embed`, `block_inputs`, `run_blocks`,
    `norm`, so that a pipeline or tensor-parallel stage composes the very same code from the
    parts it holds (parallel_plan/llama_pipeline.py) instead of a copy.

    Context parallelism is one attribute, `sequence_shard` (a `SequenceShard`; None: off),
    switched only through `Z2allForCausalLM.use_sequence_shard` and `whole_sequences` (the
    trainer turns it on in trainer/sequence_sharding.py): the inputs stay whole [B, S], and
    `embed`, `block_inputs` and the head (`Z2allForCausalLM.head_loss`) then compute this
    rank's share of every sequence (parallel/context_parallel/context_shard.py's steps 1-4)."""

    def __init__(self, config: Z2allConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderBlock(config, i)
                                    for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.sequence_shard: SequenceShard | None = None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                kv_cache: KVCache | None = None) -> torch.Tensor:
        """attention_mask [B, past + T] as `Z2allForCausalLM.forward`'s, or None."""
        query_len, past_len = input_ids.shape[1], (kv_cache.length if kv_cache else 0)
        hidden = self.embed(input_ids)
        inputs = self.block_inputs(attention_mask, query_len, past_len, hidden)
        hidden = self.run_blocks(hidden, inputs, kv_cache)
        if kv_cache is not None:
            kv_cache.advance(query_len)
        return self.norm(hidden)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The embeddings of the tokens this rank computes: all of them, or under context
        parallelism its share of each sequence."""
        if self.sequence_shard is not None:
            input_ids = self.sequence_shard.shard(input_ids)
        return self.embed_tokens(input_ids)

    def block_inputs(self, attention_mask: torch.Tensor | None, query_len: int, past_len: int,
                     hidden: torch.Tensor) -> BlockInputs:
        """Positions, RoPE and attention layout of the `query_len` new tokens, in the dtype
        `hidden` computes in. `hidden` is read for its dtype and device only (a stage's input
        or, under sequence or context parallelism, a part of the sequence: hence `query_len`).
        Positions and samples are always the whole sequence's: under context parallelism this
        rank then keeps its share of them and attends around the ring."""
        config, device = self.config, hidden.device
        dtype = _compute_dtype(hidden)
        _log_kernels_once(device, dtype, config.head_dim)
        key_padding_mask = _key_padding_mask(attention_mask)
        position_ids = position_ids_for(key_padding_mask, query_len, past_len, device)
        if self.sequence_shard is not None:
            position_ids, layout = context_parallel_layout(self.sequence_shard, position_ids,
                                                           key_padding_mask, past_len)
        else:
            use_flash = not kernels.why_not_flash_attention(device, dtype, config.head_dim)
            layout = attention_layout_for(key_padding_mask, query_len, past_len, device,
                                          use_flash)
        cos, sin = rotary_cos_sin(position_ids, config.head_dim, config.rope_theta, dtype,
                                  config.rope_scaling)
        return BlockInputs(cos, sin, layout)

    def run_blocks(self, hidden: torch.Tensor, inputs: BlockInputs,
                   kv_cache: KVCache | None = None) -> torch.Tensor:
        """The decoder blocks held here, in order: all of them, or a pipeline stage's slice
        (`layers` is then an `nn.ModuleDict` keyed by layer number; both name each child by
        its layer number)."""
        for name, layer in self.layers.named_children():
            if self._recompute_in_backward(int(name)):
                hidden = checkpoint(layer, hidden, inputs.cos, inputs.sin, inputs.layout,
                                    use_reentrant=False)
            else:
                hidden = layer(hidden, inputs.cos, inputs.sin, inputs.layout, kv_cache)
        return hidden

    def _recompute_in_backward(self, layer_idx: int) -> bool:
        config = self.config
        return (config.activation_checkpointing and self.training and torch.is_grad_enabled()
                and layer_idx % config.activation_checkpointing_every == 0)


class Z2allForCausalLM(GenerationMixin, nn.Module):
    def __init__(self, config: Z2allConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Z2allModel(config)
        self.lm_head = LMHead(config.hidden_size, config.vocab_size)
        self.tie_weights()
        self.apply(self._init_weights)

    def tie_weights(self) -> None:
        """With tie_word_embeddings, lm_head.weight *is* the embedding Parameter (one tensor,
        one gradient accumulating both uses; `parameters()` lists it once)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def _init_weights(self, module: nn.Module) -> None:
        """Normal(0, initializer_range); the projections that write into the residual stream
        (o_proj, down_proj) get std / sqrt(2 * layers), so the stream's variance does not grow
        with depth: GPT-2 (Radford et al. 2019, sec. 2.3), Megatron-LM's
        `scaled_init_method_normal`."""
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        for residual_out in ("o_proj", "down_proj"):
            if isinstance(getattr(module, residual_out, None), nn.Linear):
                nn.init.normal_(getattr(module, residual_out).weight, mean=0.0,
                                std=std / (2 * self.config.num_hidden_layers) ** 0.5)

    # ---- context parallelism: this rank's share of every sequence ----------------------------
    def use_sequence_shard(self, shard: SequenceShard | None) -> None:
        """From now on compute this rank's share of every sequence it is given (`shard`: the
        trainer's ring, trainer/sequence_sharding.py), or with None whole sequences. The
        inputs stay whole either way; only what the model computes of them changes."""
        self.model.sequence_shard = shard

    @contextlib.contextmanager
    def whole_sequences(self) -> Iterator[None]:
        """Context parallelism off inside, restored after: for one rank alone generating or
        saving (the other ranks of its ring are not calling the model then)."""
        shard = self.model.sequence_shard
        self.use_sequence_shard(None)
        try:
            yield
        finally:
            self.use_sequence_shard(shard)

    # ---- training and scoring ---------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> CausalLMOutput:
        """input_ids [B, T]; labels [B, T] already shifted (labels[b, t] is the target of
        position t; -100 = not trained); attention_mask [B, T], 1 = real token, 0 = padding
        (right padding for training; left or right both give correct positions), or for packed
        rows the number of the sample each token belongs to (model/attention.py)."""
        hidden = self.model(input_ids, attention_mask)
        if labels is None:
            return CausalLMOutput(logits=self.lm_head(hidden))
        return CausalLMOutput(loss=self.head_loss(hidden, labels))

    def token_log_probs(self, input_ids: torch.Tensor, labels: torch.Tensor,
                        attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """log p(labels[b, t] | tokens <= t) as fp32 [B, T], 0 where labels == -100 (DPO sums
        these over the response)."""
        return self.head_loss(self.model(input_ids, attention_mask), labels, per_token=True)

    def head_loss(self, hidden: torch.Tensor, labels: torch.Tensor, per_token: bool = False
                  ) -> torch.Tensor:
        """From the final normalised hidden states [B, T, H]: the mean cross-entropy of
        `labels` (fp32 scalar), or with `per_token` the log-probs [B, T] `token_log_probs`
        returns. The part of the forward a pipeline's last stage runs after its blocks.
        Under context parallelism `hidden` holds this rank's share of each sequence and
        `labels` are whole: the result is the whole sequence's, on every rank of the group."""
        context = self.model.sequence_shard
        if context is not None:
            labels = context.shard(labels)
        flat = self.lm_head(hidden.flatten(0, 1), labels.flatten(), per_token=per_token)
        if per_token:
            token_log_probs = flat.view(labels.shape)
            return token_log_probs if context is None else context.gather(token_log_probs)
        if context is None:
            return flat
        return context.mean_over_ranks(flat, (labels != IGNORE_INDEX).sum())

    # ---- incremental decoding (used by model/generation.py) ---------------------------------
    def new_kv_cache(self, batch_size: int, capacity: int) -> KVCache:
        config, weight = self.config, self.lm_head.weight
        return KVCache(config.num_hidden_layers, batch_size, capacity,
                       config.num_key_value_heads, config.head_dim,
                       _compute_dtype(weight), weight.device)

    def next_token_logits(self, input_ids: torch.Tensor, key_padding_mask: torch.Tensor | None,
                          kv_cache: KVCache) -> torch.Tensor:
        """Run the new tokens through the model (filling the cache); fp32 logits [B, V] of the
        last position only (the prompt's other positions need no vocabulary projection)."""
        hidden = self.model(input_ids, key_padding_mask, kv_cache)
        return self.lm_head(hidden[:, -1]).float()

    def compile_blocks(self) -> None:
        """torch.compile each decoder block in place (parameter names unchanged). Per block, as
        torchtitan does: every block has the same code and shapes, so one compiled graph is
        reused N times and compile time does not grow with depth."""
        for layer in self.model.layers:
            layer.compile()

    # ---- size and cost ----------------------------------------------------------------------
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def num_flops_per_token(self, seq_len: int | None = None) -> int:
        """Training FLOPs per token (forward + backward): 6N + 12·L·H·Q·T (PaLM, Chowdhery et
        al. 2022, appendix B). 6N: each weight does one multiply-add (2 FLOPs) per token
        forward and two backward; N excludes an untied embedding table (a lookup, no matmul).
        12·L·H·Q·T: the attention scores and weighted sum, L layers, H heads of size Q, over
        T = seq_len (default max_position_embeddings) keys."""
        config = self.config
        matmul_params = self.num_parameters()
        if not config.tie_word_embeddings:
            matmul_params -= self.model.embed_tokens.weight.numel()
        seq_len = seq_len or config.max_position_embeddings
        return (6 * matmul_params + 12 * config.num_hidden_layers * config.num_attention_heads
                * config.head_dim * seq_len)

    # ---- saving and loading -----------------------------------------------------------------
    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Write `config.json` and `model.safetensors` (each atomically; a tied lm_head is
        stored once, as the embedding)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tensors = {name: tensor.detach().contiguous() for name, tensor in self.state_dict().items()
                   if not (name == "lm_head.weight" and self.config.tie_word_embeddings)}
        atomic_write_bytes(directory / WEIGHTS_FILE, save(tensors, metadata={"format": "pt"}))
        self.config.to_json_file(directory / CONFIG_FILE)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike,
                        dtype: torch.dtype | None = None) -> Z2allForCausalLM:
        """Load a `save_pretrained` directory (e.g. a checkpoint); weights keep their saved
        dtype unless `dtype` is given."""
        directory = Path(directory)
        config = Z2allConfig.from_json_file(directory / CONFIG_FILE)
        return cls._from_state_dict(config, load_file(directory / WEIGHTS_FILE), dtype)

    @classmethod
    def from_hf(cls, directory: str | os.PathLike,
                dtype: torch.dtype | None = None) -> Z2allForCausalLM:
        """Load a Hugging Face `LlamaForCausalLM` directory (config.json + model.safetensors, or
        shards listed in model.safetensors.index.json)."""
        directory = Path(directory)
        with open(directory / CONFIG_FILE, encoding="utf-8") as handle:
            config = config_from_hf(json.load(handle), source=str(directory / CONFIG_FILE))
        hf_state = {}
        for weights_file in hf_weight_files(directory):
            hf_state.update(load_file(directory / weights_file))
        return cls._from_state_dict(config, state_dict_from_hf(hf_state, config), dtype)

    @classmethod
    def _from_state_dict(cls, config: Z2allConfig, state: dict[str, torch.Tensor],
                         dtype: torch.dtype | None) -> Z2allForCausalLM:
        with torch.device("meta"):  # no time spent on a random init that is overwritten
            model = cls(config)
        if config.tie_word_embeddings:
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
        model.load_state_dict(state, strict=True, assign=True)
        model.tie_weights()  # `assign` made two Parameters of the one tensor; make them one
        return model.to(dtype) if dtype is not None else model


def hf_weight_files(directory: Path) -> list[str]:
    """The weight files of an HF directory, exactly those transformers reads: `model.safetensors`,
    or the shards `model.safetensors.index.json` names. Any other `*.safetensors` (a backup, a
    leftover) is ignored, as transformers ignores it; a directory with both names (transformers
    would read one, an index-reader the other) or with neither is refused in one line."""
    has_single = (directory / WEIGHTS_FILE).is_file()
    has_index = (directory / HF_INDEX_FILE).is_file()
    if has_single and has_index:
        raise ValueError(f"{directory}: has both {WEIGHTS_FILE} and {HF_INDEX_FILE}, so which "
                         "weights are the model is ambiguous; remove the one that is stale")
    if has_single:
        return [WEIGHTS_FILE]
    if not has_index:
        found = sorted(path.name for path in directory.glob("*.safetensors"))
        raise FileNotFoundError(f"{directory}: neither {WEIGHTS_FILE} nor {HF_INDEX_FILE} "
                                f"(found {found or 'no *.safetensors'}); name the weights "
                                f"{WEIGHTS_FILE}, or add the index that lists the shards")
    with open(directory / HF_INDEX_FILE, encoding="utf-8") as handle:
        shards = sorted(set(json.load(handle)["weight_map"].values()))
    for shard in shards:
        if Path(shard).name != shard or not (directory / shard).is_file():
            raise FileNotFoundError(f"{directory / HF_INDEX_FILE}: names {shard!r}, which is "
                                    f"not a file in {directory}")
    return shards


def _key_padding_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """None when there is no padding (and no packing), so attention can use its fast causal
    path."""
    if attention_mask is None or bool((attention_mask == 1).all()):
        return None
    return attention_mask
