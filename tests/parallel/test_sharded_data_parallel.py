"""ZeRO stages 0-3 on 2 gloo ranks against single-process references.

One 2-rank launch runs every check (spawning ranks is the slow part): each stage trains a small
z2all model (tied embeddings, activation checkpointing on) for 5 steps with clipping and 2
micro-batches per rank, and must equal torch AdamW on the whole batch in one process; stage 3
must also equal torch FSDP2 (`fully_shard`) on the same model and data, keep 1/W of the
parameters at rest, have at most two blocks gathered at any forward (current + prefetched),
leave no unit gathered after a step, and generate (KV cache) like the reference. On a deeper
model, stages 2 and 3 must keep at most `max_reductions_in_flight` reduce-scatters pending and
so at most that many units' whole gradients (plus the root's and the computing block's) alive.
"""

from __future__ import annotations

import contextlib
import functools

import numpy as np
import pytest
import torch

from optimizer.data_parallel_factory import build_data_parallel, check_zero_options
from parallel.distributed_data_parallel import DistributedDataParallelConfig
from parallel.local_ranks import run_on_ranks
from parallel.sharded_data_parallel import ShardedDataParallel
from parallel_plan.llama_units import zero_units
from tests.model.model_helpers import VOCAB, small_model
from tests.parallel.zero_helpers import (
    as_numpy,
    batches,
    make_optimizer_config,
    max_diff,
    new_model,
    train_step,
)

STEPS = 5


def reference_adamw(model: torch.nn.Module) -> torch.optim.AdamW:
    """torch AdamW with our weight-decay groups (no decay for vectors)."""
    config, params = make_optimizer_config(), list(model.parameters())
    return torch.optim.AdamW(
        [{"params": [p for p in params if p.ndim >= 2], "weight_decay": config.weight_decay},
         {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}],
        lr=config.lr, betas=(config.adam_beta1, config.adam_beta2), eps=config.adam_eps)


@functools.cache
def reference_run(world_size: int) -> tuple[dict, list[float]]:
    """Plain torch in one process: whole batch, clip_grad_norm_, AdamW."""
    model = new_model()
    adamw, norms = reference_adamw(model), []
    for input_ids, labels in batches(STEPS, world_size):
        adamw.zero_grad()
        model(input_ids, labels=labels).loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(
            model.parameters(), make_optimizer_config().clip_grad)))
        adamw.step()
    return {name: t.detach().clone() for name, t in model.state_dict().items()}, norms


def count_gathered_blocks(wrapped, seen: list[int]) -> None:
    """Record, at every block's forward, how many block units hold whole params."""
    for block in wrapped.module.model.layers:
        block.register_forward_hook(lambda *_: seen.append(
            sum(unit.is_gathered for unit in wrapped.units[1:])))


def our_run(rank: int, world_size: int, zero_stage: int) -> dict:
    model = new_model()
    wrapped, optimizer, _ = build_data_parallel(
        model, zero_stage, DistributedDataParallelConfig(bucket_size=3000),
        make_optimizer_config(), is_unit=zero_units(model))
    norms, gathered_after_step, gathered_in_forward = [], [], []
    if zero_stage == 3:
        count_gathered_blocks(wrapped, gathered_in_forward)
    for batch in batches(STEPS, world_size):
        norms.append(train_step(wrapped, optimizer, batch, rank, world_size))
        if zero_stage >= 2:  # the check after every step: which units still hold whole params
            gathered_after_step.append([u.name for u in wrapped.units
                                        if u.full_params.untyped_storage().nbytes() > 0])
    result = {"norms": norms, "gathered_after_step": gathered_after_step,
              "gathered_in_forward": list(gathered_in_forward)}  # training steps only
    if zero_stage >= 2:
        result["resident"] = wrapped.resident_bytes()
        result["state"] = wrapped.full_state_dict()
        prompt = torch.randint(0, VOCAB, (1, 4), generator=torch.Generator().manual_seed(1))
        result["generated"] = model.generate(prompt, max_new_tokens=6)  # gathers unit by unit
        with wrapped.gathered_params():  # the trainer's way: rank 0 alone generates samples
            if rank == 0:
                result["generated_on_rank0"] = model.generate(prompt, max_new_tokens=6)
        result["blocks_gathered_after_generate"] = [u.name for u in wrapped.units[1:]
                                                    if u.is_gathered]
    else:
        optimizer.finish_param_sync()
        result["state"] = {n: t.detach().clone() for n, t in model.state_dict().items()}
    return result


def fsdp2_run(rank: int, world_size: int) -> dict:
    """torch FSDP2 on the same model and data: each decoder block and the root sharded."""
    from torch.distributed.fsdp import fully_shard

    model = new_model()
    for block in model.model.layers:
        fully_shard(block)
    fully_shard(model)
    adamw = reference_adamw(model)
    for batch in batches(STEPS, world_size):
        input_ids, labels = batch
        adamw.zero_grad()
        for ids, lab in zip(input_ids.chunk(world_size)[rank].chunk(2),
                            labels.chunk(world_size)[rank].chunk(2)):
            (model(ids, labels=lab).loss / 2).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), make_optimizer_config().clip_grad)
        adamw.step()
    return {name: t.full_tensor().detach().clone() for name, t in model.state_dict().items()}


def bf16_run(rank: int, world_size: int, zero_stage: int) -> dict:
    """bf16 params: stage 3 keeps fp32 master shards (checked) and must track stage 0's
    full fp32 master copy."""
    model = new_model().to(torch.bfloat16)
    config = make_optimizer_config()
    config.params_dtype = "bf16"
    wrapped, optimizer, _ = build_data_parallel(
        model, zero_stage, DistributedDataParallelConfig(bucket_size=3000), config,
        is_unit=zero_units(model))
    for batch in batches(3, world_size):
        train_step(wrapped, optimizer, batch, rank, world_size)
    if zero_stage == 3:
        assert all(s.main_param_shard.dtype == torch.float32 and
                   s.model_param_shard.dtype == torch.bfloat16 for s in optimizer.bucket_shards)
        return {n: t.float() for n, t in wrapped.full_state_dict().items()}
    return {n: t.detach().float() for n, t in model.state_dict().items()}


def whole_grads_run(rank: int, world_size: int, zero_stage: int, in_flight: int) -> dict:
    """One step's backwards (2 micro-batches) of a 6-block model; at every gradient hook, after
    the wrapper's own: the reduce-scatters pending and the bytes of whole unit gradients alive
    (the wrapper's grads minus its persistent shards)."""
    model = small_model(seed=3, num_hidden_layers=6, tie_word_embeddings=True)
    wrapped = ShardedDataParallel(model, zero_stage, is_unit=zero_units(model),
                                  max_reductions_in_flight=in_flight)
    shard_bytes = sum(u.grad_shard.numel() * u.grad_shard.element_size() for u in wrapped.units)
    pending, whole_bytes = [], []

    def sample(_) -> None:
        pending.append(sum(unit.is_reducing for unit in wrapped.units))
        whole_bytes.append(wrapped.resident_bytes()["grads"] - shard_bytes)
    for param in model.parameters():
        param.register_post_accumulate_grad_hook(sample)
    input_ids, labels = batches(1, world_size)[0]
    for index, (ids, lab) in enumerate(zip(input_ids.chunk(world_size)[rank].chunk(2),
                                           labels.chunk(world_size)[rank].chunk(2))):
        with wrapped.no_sync() if index == 0 else contextlib.nullcontext():
            wrapped(ids, labels=lab).loss.backward()
    unit_bytes = [u.numel * u.grad_shard.element_size() for u in wrapped.units]
    return {"pending": pending, "whole_bytes": whole_bytes, "unit_bytes": unit_bytes,
            "grad_shards": [u.grad_shard.numpy().copy() for u in wrapped.units]}


def all_checks(rank: int, world_size: int) -> dict:
    results = {stage: our_run(rank, world_size, stage) for stage in (0, 1, 2, 3)}
    results["whole_grads"] = {(stage, in_flight): whole_grads_run(rank, world_size, stage,
                                                                  in_flight)
                              for stage in (2, 3) for in_flight in (1, 2)}
    results["fsdp2"] = fsdp2_run(rank, world_size)
    results["bf16"] = {stage: bf16_run(rank, world_size, stage) for stage in (0, 3)}
    return as_numpy(results)


@pytest.fixture(scope="module")
def two_ranks():
    return run_on_ranks(all_checks, world_size=2, timeout=300)


@pytest.mark.parametrize("zero_stage", [0, 1, 2, 3])
def test_every_stage_equals_whole_batch_adamw(two_ranks, zero_stage):
    reference_state, reference_norms = reference_run(2)
    assert max_diff(new_model().state_dict(), reference_state) > 1e-3  # training moved weights
    for rank_result in two_ranks:
        result = rank_result[zero_stage]
        assert max_diff(result["state"], reference_state) < 2e-5
        assert result["norms"] == pytest.approx(reference_norms, rel=1e-4)


def test_stage3_equals_fsdp2(two_ranks):
    for rank_result in two_ranks:
        assert max_diff(rank_result[3]["state"], rank_result["fsdp2"]) < 2e-5


def test_stage3_bf16_with_fp32_master_shards_tracks_stage0(two_ranks):
    initial = {n: t.float() for n, t in new_model().to(torch.bfloat16).state_dict().items()}
    for rank_result in two_ranks:
        stage0, stage3 = rank_result["bf16"][0], rank_result["bf16"][3]
        assert max_diff(stage0, initial) > 1e-3
        assert max_diff(stage3, stage0) <= 2 ** -7  # at most about one bf16 rounding step


def test_stage3_gathers_one_block_plus_prefetch_and_frees_after(two_ranks):
    for rank_result in two_ranks:
        seen = rank_result[3]["gathered_in_forward"]
        assert seen and max(seen) <= 2
        assert all(names == [] for names in rank_result[3]["gathered_after_step"])
        assert rank_result[3]["blocks_gathered_after_generate"] == []
        # stage 2 keeps every param whole by design
        assert all(len(names) == 4 for names in rank_result[2]["gathered_after_step"])


@pytest.mark.parametrize("zero_stage", [2, 3])
@pytest.mark.parametrize("in_flight", [1, 2])
def test_whole_gradients_alive_are_bounded_by_reductions_in_flight(two_ranks, zero_stage,
                                                                   in_flight):
    for rank_result in two_ranks:
        run = rank_result["whole_grads"][zero_stage, in_flight]
        root, blocks = run["unit_bytes"][0], run["unit_bytes"][1:]
        # in flight, the block whose gradients are arriving, and the root (module docstring)
        bound = root + (in_flight + 1) * max(blocks)
        assert bound < sum(run["unit_bytes"])  # deep enough that the bound means something
        assert max(run["pending"]) == in_flight
        assert 0 < max(run["whole_bytes"]) <= bound
        # waiting earlier for a reduce-scatter leaves the same sums in the shards
        fewest = rank_result["whole_grads"][zero_stage, 1]["grad_shards"]
        assert all(np.array_equal(a, b) for a, b in zip(run["grad_shards"], fewest))


def test_stage3_params_at_rest_are_one_over_w(two_ranks):
    whole = sum(p.numel() * p.element_size() for p in new_model().parameters())
    for rank_result in two_ranks:
        # padding adds < W elements (4 bytes each) to each of the 4 units
        assert whole / 2 <= rank_result[3]["resident"]["params"] <= whole / 2 + 4 * 4
        assert whole <= rank_result[2]["resident"]["params"] <= whole + 4 * 4


def test_stage3_generation_equals_reference(two_ranks):
    model = new_model()
    model.load_state_dict(reference_run(2)[0])
    prompt = torch.randint(0, VOCAB, (1, 4), generator=torch.Generator().manual_seed(1))
    expected = model.generate(prompt, max_new_tokens=6)
    for rank_result in two_ranks:
        assert torch.equal(torch.as_tensor(rank_result[3]["generated"]), expected)
        assert torch.equal(torch.as_tensor(two_ranks[0][3]["generated_on_rank0"]), expected)


@pytest.mark.parametrize("options", [
    dict(zero_stage=2, comm_hook="powersgd"), dict(zero_stage=3, comm_hook="overlap_optim"),
    dict(zero_stage=3, cpu_offload=True), dict(zero_stage=2, use_distributed_optimizer=True),
    dict(zero_stage=4)])
def test_impossible_combinations_are_refused_in_one_line(options):
    with pytest.raises(ValueError) as error:
        check_zero_options(**options)
    assert "\n" not in str(error.value) and "zero_stage" in str(error.value)


def test_use_distributed_optimizer_is_stage_1():
    assert check_zero_options(0, use_distributed_optimizer=True) == 1
    assert check_zero_options(3) == 3
