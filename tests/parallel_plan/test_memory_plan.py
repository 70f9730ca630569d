"""The memory planner against the tensors the code really allocates.

Parameters, gradients and optimizer state: `plan_memory` must equal `measure_memory` to the byte
on each of 2 gloo ranks, at ZeRO stages 0-3, in fp32 and bf16, and with LoRA adapters on a
frozen base (padding lands on different ranks, so each rank is checked with its own plan).
Activations: the estimate must be within ACTIVATION_MARGIN of the bytes autograd saves
(saved-tensor hook), with and without activation checkpointing, for fresh random shapes.
"""

from __future__ import annotations

import random

import pytest
import torch

from model.configuration_z2all import Z2allConfig
from model.lora import LoraConfig, apply_lora
from model.modeling_z2all import Z2allForCausalLM
from optimizer import OptimizerConfig
from optimizer.data_parallel_factory import build_data_parallel
from parallel.distributed_data_parallel import DistributedDataParallelConfig
from parallel.local_ranks import run_on_ranks
from parallel_plan.llama_units import zero_units
from parallel_plan.memory_plan import (
    ACTIVATION_MARGIN,
    CHECKPOINTED_ACTIVATION_MARGIN,
    measure_activation_bytes,
    measure_memory,
    plan_memory,
)
from utils.precision import DTYPES

BUCKET_SIZE = 5000  # several buckets, each padded
LORA = LoraConfig(rank=2, targets="q_proj,v_proj,down_proj")
CONFIG = dict(vocab_size=203, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, intermediate_size=72, max_position_embeddings=32)


def planned_and_measured(rank: int, world_size: int) -> list[tuple]:
    config = Z2allConfig(**CONFIG)
    results = []
    for dtype, lora in (("fp32", None), ("bf16", None), ("bf16", LORA)):
        for zero_stage in (0, 1, 2, 3):
            torch.manual_seed(0)
            model = Z2allForCausalLM(config)
            if lora is not None:
                apply_lora(model, lora)
            model.to(DTYPES[dtype])
            wrapped, optimizer, _ = build_data_parallel(
                model, zero_stage, DistributedDataParallelConfig(bucket_size=BUCKET_SIZE),
                OptimizerConfig(params_dtype=dtype), is_unit=zero_units(model))
            ids = torch.randint(0, config.vocab_size, (2, 16))
            optimizer.zero_grad()
            wrapped(ids, labels=ids).loss.backward()
            wrapped.finish_grad_sync()
            optimizer.step()
            measured = measure_memory(wrapped, optimizer)
            plan = plan_memory(config, world_size, zero_stage, dtype, batch_size=2,
                               max_seq_len=16, bucket_size=BUCKET_SIZE, rank=rank, lora=lora)
            results.append((dtype, lora is not None, zero_stage, plan.as_measured(), measured))
    return results


def test_planned_param_grad_optimizer_bytes_equal_measured_at_every_stage():
    for rank_results in run_on_ranks(planned_and_measured, world_size=2, timeout=300):
        for dtype, lora, zero_stage, planned, measured in rank_results:
            assert planned == measured, (dtype, lora, zero_stage)
    # the stages shrink what the theory says they shrink (rank 0, fp32)
    by_stage = {stage: planned for dtype, lora, stage, planned, _ in rank_results
                if dtype == "fp32"}
    assert by_stage[1]["optimizer"] < by_stage[0]["optimizer"]
    assert by_stage[2]["grads"] < by_stage[1]["grads"]
    assert by_stage[3]["params"] < by_stage[2]["params"]
    # LoRA: the base is held whole at every stage, with neither gradient nor optimizer state
    lora_rows = [planned for _, lora, _, planned, _ in rank_results if lora]
    base_bytes = 2 * sum(p.numel() for p in Z2allForCausalLM(Z2allConfig(**CONFIG)).parameters())
    assert all(row["frozen_base"] == base_bytes for row in lora_rows)
    assert all(row["grads"] < base_bytes // 10 for row in lora_rows)  # adapters only


@pytest.mark.parametrize("checkpointing", [False, True])
def test_activation_estimate_within_margin_of_saved_tensors(checkpointing):
    rng = random.Random()
    heads = rng.choice([2, 4])
    config = Z2allConfig(vocab_size=rng.randint(100, 400),
                         hidden_size=16 * heads * rng.randint(1, 3),
                         num_hidden_layers=rng.randint(1, 3), num_attention_heads=heads,
                         num_key_value_heads=rng.choice([1, heads]),
                         intermediate_size=rng.randint(40, 200), max_position_embeddings=64,
                         activation_checkpointing=checkpointing)
    dtype = rng.choice(["fp32", "bf16"])
    batch_size, seq_len = rng.randint(1, 3), rng.randint(16, 64)
    model = Z2allForCausalLM(config).to(DTYPES[dtype])
    ids = torch.randint(0, config.vocab_size, (batch_size, seq_len))
    measured = measure_activation_bytes(model, ids, labels=ids)
    plan = plan_memory(config, 1, 0, dtype, batch_size, seq_len, checkpointing)
    estimate = plan.bytes_of("activations") - plan.recomputed_block_bytes
    margin = CHECKPOINTED_ACTIVATION_MARGIN if checkpointing else ACTIVATION_MARGIN
    assert abs(estimate - measured) <= margin * measured, (config, dtype, seq_len)
