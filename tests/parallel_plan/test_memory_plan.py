"""The memory planner against the tensors the code really allocates.

Parameters, gradients and optimizer state: `plan_memory` must equal `measure_memory` to the byte
on each of 2 gloo ranks, at ZeRO stages 0-3, in fp32 and bf16, and with LoRA adapters on a
frozen base (padding lands on different ranks, so each rank is checked with its own plan).
Activations: the estimate must be within ACTIVATION_MARGIN of the bytes autograd saves
(saved-tensor hook), with and without activation checkpointing, for fresh random shapes, and on
each rank of a context-parallel pair (S/C tokens per rank).
`python -m tools.memory_plan` prints, for every rank of each context-parallel layout of the
trainer's grid table, the plan the trainer prints at start-up (which
tests/trainer/test_train_grid_compose.py holds equal to each rank's measured bytes).
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.distributed as dist

from model.configuration_z2all import Z2allConfig
from model.lora import LoraConfig, apply_lora
from model.modeling_z2all import Z2allForCausalLM
from optimizer import OptimizerConfig
from optimizer.data_parallel_factory import build_data_parallel
from parallel.context_parallel.context_shard import ContextShard
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
from tests.trainer.test_train_grid_compose import LAYOUTS as GRID_LAYOUTS
from tools import memory_plan as memory_plan_tool
from trainer.command_line import parse_command_line
from trainer.memory_fit import memory_plan as trainer_memory_plan
from trainer.options import TrainingOptions
from trainer.parallelize import effective_zero_stage
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
            plans = [plan_memory(config, world_size, zero_stage, dtype, batch_size=2,
                                 max_seq_len=16, bucket_size=BUCKET_SIZE, rank=rank, lora=lora,
                                 context_parallel=context_parallel).as_measured()
                     for context_parallel in (1, world_size)]
            results.append((dtype, lora is not None, zero_stage, *plans, measured))
    return results


def test_planned_param_grad_optimizer_bytes_equal_measured_at_every_stage():
    """Also planned as the ranks of one context-parallel group: they shard the same states
    over the same ranks (the dp x cp group is the world, our DDP's group)."""
    for rank_results in run_on_ranks(planned_and_measured, world_size=2, timeout=300):
        for dtype, lora, zero_stage, planned, planned_cp, measured in rank_results:
            assert planned == measured == planned_cp, (dtype, lora, zero_stage)
    # the stages shrink what the theory says they shrink (the last rank's results, fp32)
    by_stage = {stage: planned for dtype, lora, stage, planned, *_ in rank_results
                if dtype == "fp32"}
    assert by_stage[1]["optimizer"] < by_stage[0]["optimizer"]
    assert by_stage[2]["grads"] < by_stage[1]["grads"]
    assert by_stage[3]["params"] < by_stage[2]["params"]
    # LoRA: the base is held whole at every stage, with neither gradient nor optimizer state
    lora_rows = [planned for _, lora, _, planned, *_ in rank_results if lora]
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


def _activation_bytes_on_context_parallel_rank(rank: int, world_size: int, config: Z2allConfig,
                                               dtype: str, batch_size: int, seq_len: int) -> int:
    torch.manual_seed(0)
    model = Z2allForCausalLM(config).to(DTYPES[dtype])
    model.use_sequence_shard(ContextShard.of(dist.group.WORLD))  # trainer: shard_sequences
    ids = torch.randint(0, config.vocab_size, (batch_size, seq_len))
    return measure_activation_bytes(model, ids, labels=ids)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_activation_estimate_on_context_parallel_ranks(dtype):
    """Each rank of a CP2 pair saves the activations of its S/2 tokens, within the margin."""
    config = Z2allConfig(**CONFIG)
    plan = plan_memory(config, 2, 0, dtype, batch_size=2, max_seq_len=32, context_parallel=2)
    whole = plan_memory(config, 1, 0, dtype, batch_size=2, max_seq_len=32)
    assert plan.bytes_of("activations") < 0.6 * whole.bytes_of("activations")
    for measured in run_on_ranks(_activation_bytes_on_context_parallel_rank, config, dtype, 2,
                                 32, world_size=2):
        assert abs(plan.bytes_of("activations") - measured) <= ACTIVATION_MARGIN * measured


CONTEXT_PARALLEL_LAYOUTS = {name: layout.options for name, layout in GRID_LAYOUTS.items()
                            if any(flag.startswith("--context_parallel") for flag in layout.options)
                            and layout.resumed_from is None}
"""The context-parallel rows of the trainer's grid table (4 ranks)."""


@pytest.mark.parametrize("name", CONTEXT_PARALLEL_LAYOUTS)
def test_tool_plans_a_context_parallel_layout_as_the_trainer_does(name, capsys):
    """`python -m tools.memory_plan --context_parallel C ...` prints, for every rank, the plan
    the trainer prints at start-up for the same options (`trainer.memory_fit.memory_plan`)."""
    flags = [*CONTEXT_PARALLEL_LAYOUTS[name], "--batch_size=2", "--max_seq_len=64",
             "--gradient_accumulation_steps=2", "--activation_checkpointing"]
    options = TrainingOptions.from_dict(parse_command_line(flags)[1])
    parallel = options.parallel
    config = Z2allConfig.from_preset("tiny", vocab_size=512)
    for rank in range(4):
        assert memory_plan_tool.main([
            "--model_preset=tiny", "--vocab_size=512", "--world_size=4", "--dtype=fp32",
            f"--zero_stage={effective_zero_stage(parallel)}", "--batch_size=2",
            "--max_seq_len=64", "--gradient_accumulation_steps=2", "--activation_checkpointing",
            f"--tensor_parallel={parallel.tensor_parallel}",
            f"--pipeline_parallel={parallel.pipeline_parallel}",
            f"--context_parallel={parallel.context_parallel}",
            f"--pp_schedule={parallel.pp_schedule}", f"--rank={rank}"]) == 0
        expected = trainer_memory_plan(options, config, 4, rank, "fp32").render()
        assert expected in capsys.readouterr().out, (name, rank)


@pytest.mark.parametrize("argv, message", [
    (["--context_parallel=3", "--world_size=6", "--max_seq_len=64"],
     "--max_seq_len 64 is not divisible by 2 x --context_parallel 3"),
    (["--context_parallel=2", "--world_size=3"], "world size 3 is not divisible by"),
    (["--context_parallel=0"], "--context_parallel must be >= 1"),
])
def test_tool_refuses_a_context_parallel_layout_in_one_line(argv, message):
    with pytest.raises(ValueError, match=message) as error:
        memory_plan_tool.main(argv)
    assert "\n" not in str(error.value)
