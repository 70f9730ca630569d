"""LoRA under our DDP and ZeRO-1 on 2 gloo ranks = plain single-process torch AdamW.

Only the adapters are trainable, so only they may reach DDP's buckets and ZeRO-1's shards;
the frozen base must come out of training bitwise unchanged. Each rank feeds its half of
every global batch (no ignored labels, so the mean of the two halves' losses is the
full-batch loss) and compares with a reference trained on the full batch in-process.
A LoRA checkpoint (adapters + base reference, and the optimizer's own files) resumes bitwise.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from model.loading import load_lora_checkpoint, load_model, lora_base_reference
from model.lora import LoraConfig, apply_lora, is_adapter_name, lora_state_dict
from model.lora_checkpoint import save_lora_checkpoint
from optimizer import OptimizerConfig, get_optimizer
from parallel.distributed_data_parallel import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
)
from parallel.local_ranks import run_on_ranks
from tests.model.model_helpers import VOCAB, small_model

STEPS, GLOBAL_BATCH, SEQ_LEN = 4, 4, 12
LORA = LoraConfig(rank=4, alpha=8.0, targets="q_proj,v_proj,down_proj")


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(5)
    return [tuple(torch.randint(0, VOCAB, (GLOBAL_BATCH, SEQ_LEN), generator=generator)
                  for _ in range(2)) for _ in range(STEPS)]


def _on_ranks(rank: int, world_size: int, directory: str) -> dict:
    """Every check in one launch (spawning the ranks is the slow part)."""
    results = {sharded: _train(rank, world_size, sharded) for sharded in (True, False)}
    results["resume"] = _resume_is_bitwise(rank, world_size, Path(directory))
    return results


def optimizer_config(sharded: bool) -> OptimizerConfig:
    return OptimizerConfig(lr=1e-2, weight_decay=0.1, clip_grad=0.05,
                           use_distributed_optimizer=sharded)


def wrap(model, sharded: bool):
    ddp = DistributedDataParallel(model, DistributedDataParallelConfig(
        bucket_size=2000, use_distributed_optimizer=sharded))
    return ddp, get_optimizer(optimizer_config(sharded), ddp)


def train_step(ddp, optimizer, batch, rank: int, world_size: int) -> float:
    """One step on this rank's half of the global batch; returns the global grad norm."""
    input_ids, labels = batch
    optimizer.zero_grad()
    rows = slice(rank * GLOBAL_BATCH // world_size, (rank + 1) * GLOBAL_BATCH // world_size)
    ddp(input_ids[rows], labels=labels[rows]).loss.backward()
    ddp.finish_grad_sync()
    return optimizer.step()[1]


def _train(rank: int, world_size: int, sharded: bool) -> dict:
    torch.manual_seed(0)
    model = apply_lora(small_model("gqa", seed=0), LORA)
    reference = copy.deepcopy(model)
    base_before = {n: p.clone() for n, p in model.named_parameters() if not p.requires_grad}
    config = optimizer_config(sharded)
    ddp, optimizer = wrap(model, sharded)
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
    names = ddp.param_names
    in_buckets = {names[p] for buffer in ddp.param_and_grad_buffers for p in buffer.params}
    pieces = ({piece.name for shard in optimizer.bucket_shards for piece in shard.pieces}
              if sharded else set())
    return {
        "in_buckets": in_buckets, "pieces": pieces,
        "adapters": {n for n in dict(model.named_parameters()) if is_adapter_name(n)},
        "max_diff": max(float((ours - theirs).detach().abs().max()) for ours, theirs in
                        zip(model.parameters(), reference.parameters())),
        "base_unchanged": all(torch.equal(p, base_before[n])
                              for n, p in model.named_parameters() if n in base_before),
        "norms": norms}


def _resume_is_bitwise(rank: int, world_size: int, directory: Path) -> bool:
    """Train 2 steps with ZeRO-1, checkpoint, train 2 more; a fresh start from the
    checkpoint (base reloaded and verified, adapters and optimizer shards loaded) must train
    the same 2 steps bitwise."""
    if rank == 0:
        small_model("gqa", seed=0).save_pretrained(directory / "base")
    dist.barrier()

    def lora_model_on_base():
        model, model_dir = load_model(directory / "base")
        return apply_lora(model, LORA), lora_base_reference(model, model_dir)

    torch.manual_seed(rank)  # different adapter inits per rank: DDP broadcasts rank 0's
    model, base_reference = lora_model_on_base()
    ddp, optimizer = wrap(model, sharded=True)
    checkpoint, steps = directory / "ckpt", batches()
    for batch in steps[:2]:
        train_step(ddp, optimizer, batch, rank, world_size)
    if rank == 0:
        save_lora_checkpoint(model, LORA, base_reference, checkpoint)
    (checkpoint / "optim").mkdir(parents=True, exist_ok=True)
    optimizer.save_checkpoint(checkpoint / "optim")
    dist.barrier()
    for batch in steps[2:]:
        train_step(ddp, optimizer, batch, rank, world_size)

    resumed, _, _ = load_lora_checkpoint(checkpoint)
    resumed_ddp, resumed_optimizer = wrap(resumed, sharded=True)
    resumed_optimizer.load_checkpoint(checkpoint / "optim")
    for batch in steps[2:]:
        train_step(resumed_ddp, resumed_optimizer, batch, rank, world_size)
    continued, restarted = lora_state_dict(model), lora_state_dict(resumed)
    return continued.keys() == restarted.keys() and all(
        torch.equal(continued[name], restarted[name]) for name in continued)


@pytest.fixture(scope="module")
def rank_results(tmp_path_factory):
    per_rank = run_on_ranks(_on_ranks, str(tmp_path_factory.mktemp("lora_resume")),
                            world_size=2)
    return {key: [result[key] for result in per_rank] for key in (True, False, "resume")}


@pytest.mark.parametrize("sharded", [True, False], ids=["zero1", "replicated"])
def test_lora_under_our_ddp_equals_single_process_adamw(rank_results, sharded):
    for result in rank_results[sharded]:
        assert result["in_buckets"] == result["adapters"]  # nothing frozen in the buckets
        assert result["base_unchanged"]
        assert result["max_diff"] < 1e-6
        for ours, reference in result["norms"]:
            assert abs(ours - reference) <= 1e-5 * reference
        assert max(reference for _, reference in result["norms"]) > 0.05  # clipping active
    if sharded:  # the two ranks' ZeRO-1 shards cover exactly the adapters
        pieces = [result["pieces"] for result in rank_results[sharded]]
        assert pieces[0] | pieces[1] == rank_results[sharded][0]["adapters"]


def test_a_lora_checkpoint_resumes_bitwise_under_zero1(rank_results):
    assert rank_results["resume"] == [True, True]
