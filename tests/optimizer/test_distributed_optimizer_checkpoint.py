"""ZeRO-1 checkpoints across world sizes: 2 ranks save -> 1 rank loads -> saves -> 2 ranks load.

The chain must end with the parameters of an uninterrupted 2-rank run (same data, same global
batches). fp32 checks the re-cut Adam state and main params; fp16 also carries the loss scaler.
The "via ZeRO-0" variants run the one-rank phase with the replicated optimizer instead: it
reads the ZeRO-1 shards gathered whole into its param-group order (vectors after matrices, so
not the module's order) and saves `optimizer.pt`, which the 2 ZeRO-1 ranks then cut again.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from optimizer.distributed_optimizer.zero1_checkpoint import find_shard_files, load_resharded_state
from parallel.local_ranks import run_on_ranks
from tests.optimizer.helpers import TinyNet, random_batches
from tests.optimizer.test_distributed_optimizer import make_config, train_step, wrap

NUM_STEPS = 6
DTYPES = {"fp32": torch.float32, "fp16": torch.float16}
# variant -> (params_dtype, whether the one-rank phase runs ZeRO-0)
VARIANTS = {"fp32": ("fp32", False), "fp16": ("fp16", False),
            "fp32 via ZeRO-0": ("fp32", True), "fp16 via ZeRO-0": ("fp16", True)}


def _train_phase(rank: int, world_size: int, load_dir: str | None, save_dir: str | None,
                 first_step: int, save_after_step: int | None) -> dict:
    """Train steps first_step..NUM_STEPS-1 of each variant, optionally resuming from
    `load_dir` and saving (model + optimizer) after `save_after_step` into `save_dir`."""
    results = {}
    for variant, (params_dtype, zero0_alone) in VARIANTS.items():
        dtype = DTYPES[params_dtype]
        torch.manual_seed(0)
        model = TinyNet().to(dtype)
        if load_dir is not None:
            model.load_state_dict(torch.load(Path(load_dir, variant, "model.pt"),
                                             weights_only=True))
        ddp, optimizer = wrap(model, make_config(
            params_dtype=params_dtype,
            use_distributed_optimizer=not (zero0_alone and world_size == 1)))
        if load_dir is not None:
            optimizer.load_checkpoint(Path(load_dir, variant, "optim"))
        batches = random_batches(NUM_STEPS, 16, seed=7)
        for step in range(first_step, NUM_STEPS):
            inputs, targets = batches[step]
            train_step(ddp, optimizer, (inputs.to(dtype), targets), rank, world_size)
            if step == save_after_step:
                Path(save_dir, variant, "optim").mkdir(parents=True, exist_ok=True)
                optimizer.save_checkpoint(Path(save_dir, variant, "optim"))
                if rank == 0:
                    torch.save(model.state_dict(), Path(save_dir, variant, "model.pt"))
                dist.barrier()
        # Plain lists: tensors would travel between processes as shared memory that dies with
        # the rank process.
        results[variant] = {"params": [p.detach().float().tolist() for p in model.parameters()],
                            "loss_scale": optimizer.loss_scale}
    return results


@pytest.fixture(scope="module")
def chain(tmp_path_factory) -> dict:
    two_ranks_dir = tmp_path_factory.mktemp("saved_by_2")
    one_rank_dir = tmp_path_factory.mktemp("saved_by_1")
    # Uninterrupted 2-rank run that also saves after step 1.
    straight = run_on_ranks(_train_phase, None, str(two_ranks_dir), 0, 1, world_size=2)
    # 1 rank resumes the 2-rank checkpoint at step 2, saves after step 3.
    one_rank = run_on_ranks(_train_phase, str(two_ranks_dir), str(one_rank_dir), 2, 3,
                            world_size=1)
    # 2 ranks resume the 1-rank checkpoint at step 4.
    two_ranks = run_on_ranks(_train_phase, str(one_rank_dir), None, 4, None, world_size=2)
    return {"straight": straight[0], "one_rank": one_rank[0], "two_ranks": two_ranks,
            "dirs": (two_ranks_dir, one_rank_dir)}


# Tolerances: the 1-rank phase computes the full-batch mean where 2 ranks average two half-batch
# means (a rounding difference); fp16 params can then differ by ~1 fp16 ulp at magnitude ~1.
TOLERANCE = {"fp32": 1e-6, "fp16": 2e-3}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_two_to_one_to_two_ranks_resume_matches_uninterrupted(chain, variant):
    params_dtype = VARIANTS[variant][0]
    straight = chain["straight"][variant]
    for resumed in [chain["one_rank"][variant]] + [r[variant] for r in chain["two_ranks"]]:
        assert resumed["loss_scale"] == straight["loss_scale"]
        for ours, expected in zip(resumed["params"], straight["params"]):
            torch.testing.assert_close(torch.tensor(ours), torch.tensor(expected), rtol=0,
                                       atol=TOLERANCE[params_dtype])
    assert chain["straight"]["fp16"]["loss_scale"] > make_config().initial_loss_scale  # grew


def test_one_file_per_rank_and_incomplete_sets_are_refused(chain):
    two_ranks_dir, one_rank_dir = chain["dirs"]
    assert len(find_shard_files(two_ranks_dir / "fp32" / "optim")) == 2
    assert len(find_shard_files(one_rank_dir / "fp32" / "optim")) == 1
    (two_ranks_dir / "fp32" / "optim" / "zero1_rank00001_of00002.pt").unlink()
    with pytest.raises(ValueError, match="incomplete or mixed"):
        find_shard_files(two_ranks_dir / "fp32" / "optim")


def test_resharding_refuses_another_model_and_uncovered_elements(chain):
    optim_dir = chain["dirs"][1] / "fp16" / "optim"
    saved = torch.load(find_shard_files(optim_dir)[0], weights_only=True)
    shapes = saved["param_shapes"]
    numel = {name: int(torch.tensor(shape).prod()) for name, shape in shapes.items()}
    whole_params = [(name, 0, n) for name, n in numel.items()]
    state = load_resharded_state(optim_dir, whole_params, shapes, rank=0, world_size=1,
                                 trainable=shapes)
    assert state["grad_scaler"] == saved["grad_scaler"] and state["pieces"][0]["step"] == 4
    with pytest.raises(ValueError, match="different model; parameters differ: \\['gain'\\]"):
        load_resharded_state(optim_dir, whole_params, {**shapes, "gain": [3]}, 0, 1, shapes)
    with pytest.raises(ValueError, match="not covered exactly once"):
        load_resharded_state(optim_dir, [("gain", 0, numel["gain"] + 1)], shapes, 0, 1,
                             shapes)
