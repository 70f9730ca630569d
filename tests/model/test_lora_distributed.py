"""LoRA under our DDP, ZeRO-1, ZeRO-2 and ZeRO-3 on 2 gloo ranks = plain single-process AdamW.

Only the adapters are trainable, so only they may reach DDP's buckets, ZeRO-1's shards and
ZeRO-2/3's units (and so the optimizer state); the frozen base must come out of training
bitwise unchanged, and under ZeRO-3 it stays whole on every rank (it is in no unit). Each rank
feeds its half of every global batch (no ignored labels, so the mean of the two halves' losses
is the full-batch loss) and compares with a reference trained on the full batch in-process.
A LoRA checkpoint (adapters + base reference, and the optimizer's own files) resumes bitwise
under ZeRO-1 and ZeRO-3.
"""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from model.loading import load_lora_checkpoint, load_model, lora_base_reference
from model.lora import LoraConfig, apply_lora, is_adapter_name, lora_state_dict
from model.lora_checkpoint import save_lora_checkpoint
from optimizer import OptimizerConfig
from optimizer.data_parallel_factory import build_data_parallel
from parallel.distributed_data_parallel import DistributedDataParallelConfig
from parallel.local_ranks import run_on_ranks
from parallel_plan.llama_units import zero_units
from tests.model.model_helpers import VOCAB, small_model

STEPS, GLOBAL_BATCH, SEQ_LEN = 4, 4, 12
LORA = LoraConfig(rank=4, alpha=8.0, targets="q_proj,v_proj,down_proj")
STAGES = {"replicated": 0, "zero1": 1, "zero2": 2, "zero3": 3}
RESUMED_STAGES = (1, 3)


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(5)
    return [tuple(torch.randint(0, VOCAB, (GLOBAL_BATCH, SEQ_LEN), generator=generator)
                  for _ in range(2)) for _ in range(STEPS)]


def _on_ranks(rank: int, world_size: int, directory: str) -> dict:
    """Every check in one launch (spawning the ranks is the slow part)."""
    results = {stage: _train(rank, world_size, stage) for stage in STAGES.values()}
    for stage in RESUMED_STAGES:
        results[("resume", stage)] = _resume_is_bitwise(rank, world_size,
                                                        Path(directory) / str(stage), stage)
    return results


def optimizer_config() -> OptimizerConfig:
    return OptimizerConfig(lr=1e-2, weight_decay=0.1, clip_grad=0.05)


def wrap(model, zero_stage: int):
    """(the data-parallel wrapper, its optimizer) for `zero_stage`, as the trainer builds them."""
    wrapped, optimizer, _ = build_data_parallel(
        model, zero_stage, DistributedDataParallelConfig(bucket_size=2000), optimizer_config(),
        is_unit=zero_units(model))
    return wrapped, optimizer


def whole(wrapped):
    """ZeRO-3 keeps only shards of the adapters between steps: gather them to read them."""
    return (wrapped.gathered_params() if hasattr(wrapped, "gathered_params")
            else contextlib.nullcontext())


def train_step(ddp, optimizer, batch, rank: int, world_size: int) -> float:
    """One step on this rank's half of the global batch; returns the global grad norm."""
    input_ids, labels = batch
    optimizer.zero_grad()
    rows = slice(rank * GLOBAL_BATCH // world_size, (rank + 1) * GLOBAL_BATCH // world_size)
    ddp(input_ids[rows], labels=labels[rows]).loss.backward()
    ddp.finish_grad_sync()
    return optimizer.step()[1]


def _trained_params(wrapped) -> set[str]:
    """The names of the parameters the wrapper reduces gradients of (buckets or units)."""
    groups = getattr(wrapped, "units", None) or wrapped.param_and_grad_buffers
    return {wrapped.param_names[p] for group in groups for p in group.params}


def _train(rank: int, world_size: int, zero_stage: int) -> dict:
    torch.manual_seed(0)
    model = apply_lora(small_model("gqa", seed=0), LORA)
    reference = copy.deepcopy(model)
    base_before = {n: p.clone() for n, p in model.named_parameters() if not p.requires_grad}
    config = optimizer_config()
    ddp, optimizer = wrap(model, zero_stage)
    trainable = [p for p in reference.parameters() if p.requires_grad]
    reference_optimizer = torch.optim.AdamW(trainable, lr=config.lr,
                                            weight_decay=config.weight_decay,
                                            betas=(config.adam_beta1, config.adam_beta2),
                                            eps=config.adam_eps)
    norms = []
    for input_ids, labels in batches():
        grad_norm = train_step(ddp, optimizer, (input_ids, labels), rank, world_size)
        reference_optimizer.zero_grad()
        reference(input_ids, labels=labels).loss.backward()
        reference_norm = torch.nn.utils.clip_grad_norm_(trainable, config.clip_grad)
        reference_optimizer.step()
        norms.append((grad_norm, float(reference_norm)))
    optimizer.finish_param_sync()
    pieces = ({piece.name for shard in optimizer.bucket_shards for piece in shard.pieces}
              if zero_stage > 0 else set())
    with whole(ddp):
        max_diff = max(float((ours - theirs).detach().abs().max()) for ours, theirs in
                       zip(model.parameters(), reference.parameters()))
    return {
        "in_buckets": _trained_params(ddp), "pieces": pieces,
        "adapters": {n for n in dict(model.named_parameters()) if is_adapter_name(n)},
        "max_diff": max_diff,
        "base_unchanged": all(torch.equal(p, base_before[n])
                              for n, p in model.named_parameters() if n in base_before),
        "norms": norms}


def _resume_is_bitwise(rank: int, world_size: int, directory: Path, zero_stage: int) -> bool:
    """Train 2 steps at `zero_stage`, checkpoint, train 2 more; a fresh start from the
    checkpoint (base reloaded and verified, adapters and optimizer shards loaded) must train
    the same 2 steps bitwise."""
    if rank == 0:
        small_model("gqa", seed=0).save_pretrained(directory / "base")
    dist.barrier()

    def lora_model_on_base():
        model, model_dir = load_model(directory / "base")
        return apply_lora(model, LORA), lora_base_reference(model, model_dir)

    torch.manual_seed(rank)  # different adapter inits per rank: the wrapper broadcasts rank 0's
    model, base_reference = lora_model_on_base()
    ddp, optimizer = wrap(model, zero_stage)
    checkpoint, steps = directory / "ckpt", batches()
    for batch in steps[:2]:
        train_step(ddp, optimizer, batch, rank, world_size)
    with whole(ddp):
        if rank == 0:
            save_lora_checkpoint(model, LORA, base_reference, checkpoint)
    (checkpoint / "optim").mkdir(parents=True, exist_ok=True)
    optimizer.save_checkpoint(checkpoint / "optim")
    dist.barrier()
    for batch in steps[2:]:
        train_step(ddp, optimizer, batch, rank, world_size)

    resumed, _, _ = load_lora_checkpoint(checkpoint)
    resumed_ddp, resumed_optimizer = wrap(resumed, zero_stage)
    resumed_optimizer.load_checkpoint(checkpoint / "optim")
    for batch in steps[2:]:
        train_step(resumed_ddp, resumed_optimizer, batch, rank, world_size)
    with whole(ddp), whole(resumed_ddp):
        continued, restarted = lora_state_dict(model), lora_state_dict(resumed)
        return continued.keys() == restarted.keys() and all(
            torch.equal(continued[name], restarted[name]) for name in continued)


@pytest.fixture(scope="module")
def rank_results(tmp_path_factory):
    return run_on_ranks(_on_ranks, str(tmp_path_factory.mktemp("lora_resume")), world_size=2)


@pytest.mark.parametrize("layout", STAGES)
def test_lora_under_our_ddp_and_zero_equals_single_process_adamw(rank_results, layout):
    stage = STAGES[layout]
    for results in rank_results:
        result = results[stage]
        assert result["in_buckets"] == result["adapters"]  # nothing frozen in buckets/units
        assert result["base_unchanged"]
        assert result["max_diff"] < 1e-6
        for ours, reference in result["norms"]:
            assert abs(ours - reference) <= 1e-5 * reference
        assert max(reference for _, reference in result["norms"]) > 0.05  # clipping active
    if stage > 0:  # the two ranks' shards cover exactly the adapters
        pieces = [results[stage]["pieces"] for results in rank_results]
        assert pieces[0] | pieces[1] == rank_results[0][stage]["adapters"]


@pytest.mark.parametrize("stage", RESUMED_STAGES)
def test_a_lora_checkpoint_resumes_bitwise_under_zero(rank_results, stage):
    assert [results[("resume", stage)] for results in rank_results] == [True, True]
