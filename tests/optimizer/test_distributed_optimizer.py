"""ZeRO-1 on 2 gloo ranks against single-process references (torch AdamW, our Float16 wrapper).

Every check builds the same seeded model on each rank, feeds rank r the r-th half of each
global batch (so DDP's average is the full-batch gradient) and compares with a reference run
inside the same process. All checks share one 2-rank launch (spawning ranks is the slow part);
each test asserts on its own check's results.
"""

from __future__ import annotations

import copy
import logging

import pytest
import torch

from optimizer import OptimizerConfig, get_optimizer
from parallel.distributed_data_parallel import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
)
from parallel.local_ranks import run_on_ranks
from tests.optimizer.helpers import (
    TinyNet,
    loss_fn,
    random_batches,
    reference_adamw,
    reference_step,
)

# Buckets of >= 50 elements split TinyNet's weights across the two ranks' shards (checked).
BUCKET_SIZE = 50


def make_config(**overrides) -> OptimizerConfig:
    settings = dict(lr=3e-2, weight_decay=0.1, clip_grad=0.3, use_distributed_optimizer=True,
                    loss_scale_window=2, hysteresis=1, initial_loss_scale=2.0**10)
    settings.update(overrides)
    return OptimizerConfig(**settings)


def wrap(model: torch.nn.Module, config: OptimizerConfig, grad_reduce_in_fp32: bool = True):
    ddp = DistributedDataParallel(model, DistributedDataParallelConfig(
        bucket_size=BUCKET_SIZE, use_distributed_optimizer=config.use_distributed_optimizer,
        grad_reduce_in_fp32=grad_reduce_in_fp32))
    return ddp, get_optimizer(config, ddp)


def train_step(ddp, optimizer, batch, rank: int, world_size: int) -> tuple[float, bool, float]:
    inputs, targets = batch
    optimizer.zero_grad()
    loss = loss_fn(ddp, (inputs.chunk(world_size)[rank], targets.chunk(world_size)[rank]))
    optimizer.scale_loss(loss).backward()
    ddp.finish_grad_sync()
    stepped, grad_norm = optimizer.step()
    return loss.item(), stepped, grad_norm


def owned_pieces(optimizer) -> list[tuple[str, int, int]]:
    return [(p.name, p.param_start, p.param_end)
            for shard in optimizer.bucket_shards for p in shard.pieces]


def _sharded_and_replicated_vs_torch_adamw(rank: int, world_size: int) -> dict:
    """ZeRO-1 and the replicated FP32Optimizer (all-reduce: every rank holds the whole gradient,
    whose norm must not be summed over ranks) vs torch AdamW on the full batch."""
    results = {}
    for sharded in (True, False):
        torch.manual_seed(0)
        model = TinyNet()
        reference = copy.deepcopy(model)
        config = make_config(use_distributed_optimizer=sharded)
        ddp, optimizer = wrap(model, config)
        reference_optimizer = reference_adamw(reference, config)
        norms = []
        for batch in random_batches(6, 16, seed=1):
            _, stepped, grad_norm = train_step(ddp, optimizer, batch, rank, world_size)
            reference_norm = reference_step(reference, reference_optimizer, batch,
                                            config.clip_grad)
            norms.append((stepped, grad_norm, reference_norm))
        max_diff = max(float((ours - theirs).detach().abs().max())
                       for ours, theirs in zip(model.parameters(), reference.parameters()))
        results["sharded" if sharded else "replicated"] = {
            "max_diff": max_diff, "norms": norms,
            "pieces": owned_pieces(optimizer) if sharded else None}
    return results


@pytest.mark.parametrize("kind", ["sharded", "replicated"])
def test_matches_single_process_adamw_with_clipping_and_decay_groups(rank_results, kind):
    for result in (result["adamw"][kind] for result in rank_results):
        assert result["max_diff"] < 1e-6
        for stepped, ours, reference in result["norms"]:  # clip_grad_norm_ of the full gradient
            assert stepped and abs(ours - reference) <= 1e-5 * reference
        assert max(reference for _, _, reference in result["norms"]) > 0.3  # clipping active


def test_shards_split_parameters_and_own_every_element_once(rank_results):
    pieces_0, pieces_1 = (result["adamw"]["sharded"]["pieces"] for result in rank_results)
    straddling = {name for name, _, _ in pieces_0} & {name for name, _, _ in pieces_1}
    assert straddling  # some parameter is split between the two ranks' shards
    owned = sorted(pieces_0 + pieces_1)
    for name, param in TinyNet().named_parameters():
        ranges = [(start, end) for piece_name, start, end in owned if piece_name == name]
        assert ranges[0][0] == 0 and ranges[-1][1] == param.numel()
        assert all(end == next_start for (_, end), (next_start, _) in zip(ranges, ranges[1:]))


def _zero1_16bit_vs_replicated(rank: int, world_size: int, params_dtype: str,
                               grad_reduce_in_fp32: bool = True) -> dict:
    """ZeRO-1 vs Float16OptimizerWithFloat16Params (itself tested against AdamW) on the same
    16-bit model and data; fp16 then injects an inf into rank 1's shard only."""
    torch.manual_seed(0)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[params_dtype]
    model = TinyNet().to(dtype)
    replicated_model = copy.deepcopy(model)
    ddp, optimizer = wrap(model, make_config(params_dtype=params_dtype), grad_reduce_in_fp32)
    replicated_ddp, replicated = wrap(replicated_model, make_config(
        params_dtype=params_dtype, use_distributed_optimizer=False), grad_reduce_in_fp32)
    stepped = []
    for inputs, targets in random_batches(4, 16, seed=2):
        batch = (inputs.to(dtype), targets)
        stepped.append(train_step(ddp, optimizer, batch, rank, world_size)[1])
        stepped.append(train_step(replicated_ddp, replicated, batch, rank, world_size)[1])
    main_by_name = dict(zip([name for name, _ in replicated_model.named_parameters()],
                            replicated.main_params))
    main_diff, model_is_rounded_main = 0.0, True
    for shard in optimizer.bucket_shards:
        for piece, main in zip(shard.pieces, shard.main_pieces):
            expected = main_by_name[piece.name].view(-1)[piece.param_start:piece.param_end]
            main_diff = max(main_diff, float((main - expected).abs().max()))
            model_piece = piece.param.detach().view(-1)[piece.param_start:piece.param_end]
            model_is_rounded_main &= torch.equal(model_piece, main.to(dtype))
    result = {"all_stepped": all(stepped), "main_diff": main_diff,
              "model_is_rounded_main": model_is_rounded_main}
    if params_dtype == "fp16":
        before = [p.detach().clone() for p in model.parameters()]
        scale = optimizer.loss_scale
        optimizer.zero_grad()
        loss_fn(ddp, (inputs.chunk(2)[rank].half(), targets.chunk(2)[rank])).backward()
        ddp.finish_grad_sync()
        if rank == 1:  # an overflow that only rank 1's shard sees
            shard = optimizer.bucket_shards[0]
            shard.model_grad_shard[shard.pieces[0].shard_start] = float("inf")
        result["inf_step"] = optimizer.step()[0]
        result["inf_params_unchanged"] = all(
            torch.equal(b, p) for b, p in zip(before, model.parameters()))
        result["inf_scale_ratio"] = optimizer.loss_scale / scale
    return result


@pytest.mark.parametrize("variant", ["bf16", "fp16", "bf16, grads reduced in bf16"])
def test_zero1_16bit_main_params_equal_replicated_mixed_precision(rank_results, variant):
    for result in (result[variant] for result in rank_results):
        assert result["all_stepped"]
        assert result["main_diff"] < 1e-6
        assert result["model_is_rounded_main"]


def test_zero1_fp16_inf_on_one_rank_skips_the_step_on_all_ranks(rank_results):
    for result in (result["fp16"] for result in rank_results):
        assert result["inf_step"] is False
        assert result["inf_params_unchanged"]
        assert result["inf_scale_ratio"] == 0.5


def _overlap_and_offload_equal_blocking(rank: int, world_size: int):
    torch.manual_seed(0)
    variants = {"blocking": make_config(), "overlap": make_config(overlap_param_gather=True),
                "offload": make_config(cpu_offload=True)}
    initial = TinyNet()
    runs = {name: wrap(copy.deepcopy(initial), config) for name, config in variants.items()}
    losses = {name: [] for name in variants}
    for batch in random_batches(5, 16, seed=3):
        for name, (ddp, optimizer) in runs.items():
            losses[name].append(train_step(ddp, optimizer, batch, rank, world_size)[0])
        overlap_ddp, overlap_optimizer = runs["overlap"]
        assert overlap_optimizer._pending_gathers  # the gathers were left in flight...
        overlap_ddp(batch[0][:2])
        assert not overlap_optimizer._pending_gathers  # ...and the forward pre-hooks waited
    for _, optimizer in runs.values():
        optimizer.finish_param_sync()
    params = {name: list(ddp.module.parameters()) for name, (ddp, _) in runs.items()}
    return {name: (losses[name] == losses["blocking"],
                   all(torch.equal(a, b) for a, b in zip(params[name], params["blocking"])))
            for name in variants}


def test_overlapped_param_gather_and_cpu_offload_give_identical_parameters(rank_results):
    for result in (result["overlap"] for result in rank_results):
        assert result == {name: (True, True) for name in ("blocking", "overlap", "offload")}


class _ReadsChildWeights(TinyNet):
    """Breaks the contract overlap_param_gather relies on: the parent reads `out`'s params
    itself, so `out`'s forward pre-hook (which waits for their gather) never runs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (torch.tanh(self.inp(x)) * self.gain) @ self.out.weight.T + self.out.bias


def _unwaited_gather_warnings(rank: int, world_size: int) -> dict[str, list[str]]:
    """Warnings of the overlapped optimizer over 3 steps, for a model that keeps the contract
    (TinyNet) and one that does not."""
    captured: dict[str, list[str]] = {}
    logger = logging.getLogger("optimizer.distributed_optimizer.distributed_optimizer")
    for name, model_class in (("tiny_net", TinyNet), ("reads_child_weights", _ReadsChildWeights)):
        torch.manual_seed(0)
        handler = _ListHandler()
        logger.addHandler(handler)
        ddp, optimizer = wrap(model_class(), make_config(overlap_param_gather=True))
        for batch in random_batches(3, 16, seed=5):
            train_step(ddp, optimizer, batch, rank, world_size)
        logger.removeHandler(handler)
        captured[name] = handler.messages
    return captured


class _ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_a_gather_no_forward_waited_for_is_reported_once(rank_results):
    for warnings in (result["unwaited"] for result in rank_results):
        assert warnings["tiny_net"] == []
        assert len(warnings["reads_child_weights"]) == 1
        assert "out.weight" in warnings["reads_child_weights"][0]
        assert "inp.weight" not in warnings["reads_child_weights"][0]


def _state_bytes_ratios(rank: int, world_size: int) -> dict[str, float]:
    """ZeRO-1's optimizer-state bytes on this rank / the unsharded wrapper's, per dtype."""
    torch.manual_seed(0)
    ratios = {}
    for params_dtype, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        model = TinyNet(width=256).to(dtype)
        inputs, targets = random_batches(1, 8, seed=4)[0]
        sizes = {}
        for sharded in (True, False):
            ddp, optimizer = wrap(copy.deepcopy(model), make_config(
                params_dtype=params_dtype, use_distributed_optimizer=sharded))
            train_step(ddp, optimizer, (inputs.to(dtype), targets), rank, world_size)
            sizes[sharded] = optimizer.state_bytes()  # Adam state exists after a step
        ratios[params_dtype] = sizes[True] / sizes[False]
    return ratios


def test_optimizer_state_per_rank_is_one_over_world_size(rank_results):
    for ratios in (result["state_bytes"] for result in rank_results):
        for params_dtype, ratio in ratios.items():
            assert abs(ratio - 0.5) < 0.01, (params_dtype, ratio)


def _all_checks(rank: int, world_size: int) -> dict:
    return {"adamw": _sharded_and_replicated_vs_torch_adamw(rank, world_size),
            "bf16": _zero1_16bit_vs_replicated(rank, world_size, "bf16"),
            "fp16": _zero1_16bit_vs_replicated(rank, world_size, "fp16"),
            "bf16, grads reduced in bf16": _zero1_16bit_vs_replicated(rank, world_size, "bf16",
                                                                      grad_reduce_in_fp32=False),
            "overlap": _overlap_and_offload_equal_blocking(rank, world_size),
            "unwaited": _unwaited_gather_warnings(rank, world_size),
            "state_bytes": _state_bytes_ratios(rank, world_size)}


@pytest.fixture(scope="module")
def rank_results() -> list[dict]:
    return run_on_ranks(_all_checks, world_size=2, timeout=300)
