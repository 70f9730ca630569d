"""Options that compose with a tensor/pipeline/context grid, from the command line on 4 gloo
ranks: ZeRO-1 (the optimizer state sharded over the grid's data-parallel group), its
bf16-compressed reduce-scatter, compiled decoder blocks, and context parallelism with data and
tensor parallelism (2-rank context-parallel runs: test_train_context_parallel.py).

One table, one row per layout; all rows train in one spawn of 4 ranks (a spawn costs more
than a run). Reference: the same command in one process on the same global batch (the
grid's data-parallel size D reads --batch_size, one process --batch_size x D). Compared: every
step's loss, the gradient norm (clipping uses the whole model's: with ZeRO-1 each rank holds
only its shard's gradients) and the final model.safetensors, to fp32 rounding. A row with
a "resumed from" entry stops at step 2 with those options and resumes with its own, on the same
grid, ZeRO-1 <-> replicated: the ZeRO-1 state, spread over the dp group, saved whole and
read by a replicated optimizer, and the other way.

bf16: each rank's gradient is rounded to bf16 (8-bit mantissa, relative error 2^-9) before the
sum, so it agrees with fp32 only to that rounding (BF16_ATOL), and must differ from the same
layout in fp32 (else no compression ran).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from parallel.local_ranks import run_on_ranks
from tests.train_helpers import records, run_main, train_losses
from tests.trainer.test_train_grid import _args, _runs_on_rank
from trainer.option_validation import check_options
from trainer.options import TrainingOptions

STEPS, STOP = 3, 2
DP2_TP2, DP2_PP2 = ["--tensor_parallel=2"], ["--pipeline_parallel=2"]
CP2 = ["--context_parallel=2"]
BF16_ATOL = 1e-2
"""Adam moves an element whose gradient is rounding noise by up to lr (3e-3) per step: bf16
noise there is fp32 rounding's x 2^14, so such weights differ by up to a few lr."""
# name: (grid options, data-parallel size, loss rel, weight atol, resumed from: options or None)
LAYOUTS = {
    "dp2_tp2_zero1": ([*DP2_TP2, "--zero_stage=1"], 2, 1e-5, 1e-5, None),
    "dp2_pp2_zero1": ([*DP2_PP2, "--use_distributed_optimizer"], 2, 1e-5, 1e-5, None),
    "dp2_tp2_zero1_bf16": ([*DP2_TP2, "--zero_stage=1", "--comm_hook=bf16"], 2, 1e-3,
                           BF16_ATOL, None),
    "tp2_pp2_compile": ([*DP2_TP2, *DP2_PP2, "--compile"], 1, 1e-5, 1e-5, None),
    "dp2_tp2_zero1_from_zero0": ([*DP2_TP2, "--zero_stage=1"], 2, 1e-5, 1e-5, DP2_TP2),
    "dp2_pp2_zero0_from_zero1": (DP2_PP2, 2, 1e-5, 1e-5, [*DP2_PP2, "--zero_stage=1"]),
    "dp2_cp2_zero1": ([*CP2, "--zero_stage=1"], 2, 1e-5, 1e-5, None),  # ZeRO-1 over dp x cp
    "cp2_tp2_sp": ([*CP2, *DP2_TP2, "--sequence_parallel"], 1, 1e-5, 1e-5, None),
}


def _layout_args(data, grid: list[str], *extra: str) -> list[str]:
    return [*_args(data, f"--max_iters={STEPS}", "--eval_prompts=[]", *extra), *grid]


def _runs(data, root: Path) -> list[list[str]]:
    runs = []
    for name, (grid, _, _, _, resume_from) in LAYOUTS.items():
        out = f"--out_dir={root / name}"
        if resume_from is not None:
            runs.append(_layout_args(data, resume_from, out, f"--stop_at_iter={STOP}"))
        runs.append(_layout_args(data, grid, out, *(["--resume"] if resume_from else [])))
    return runs


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory) -> Path:
    """Every layout of the table trained (one 4-rank spawn), and the one-process references
    (single_dp1, single_dp2)."""
    root = tmp_path_factory.mktemp("compose")
    runs = _runs(data, root)
    assert run_on_ranks(_runs_on_rank, runs, world_size=4, timeout=900) == [[0] * len(runs)] * 4
    for data_parallel in sorted({row[1] for row in LAYOUTS.values()}):
        assert run_main([*_layout_args(data, [], f"--batch_size={2 * data_parallel}"),
                         f"--out_dir={root / f'single_dp{data_parallel}'}"]) == 0
    return root


@pytest.mark.parametrize("name", LAYOUTS)
def test_layout_is_accepted_and_trains_like_one_process(trained, name):
    _, data_parallel, rel, atol, resume_from = LAYOUTS[name]
    single, run = trained / f"single_dp{data_parallel}", trained / name
    reference, losses = train_losses(single), train_losses(run)
    assert len(losses) == STEPS and losses == pytest.approx(reference, rel=rel)
    assert ([r["grad_norm"] for r in records(run, "train")] == pytest.approx(
        [r["grad_norm"] for r in records(single, "train")], rel=rel))
    got, expected_val = ({r["step"]: r["val_loss"] for r in records(run_dir, "eval")}
                         for run_dir in (run, single))
    # (a stopped run also evaluates at its stop: compare the reference's steps)
    assert {step: got[step] for step in expected_val} == pytest.approx(expected_val, rel=rel)
    if resume_from is not None:
        assert [r["step"] for r in records(run, "resume")] == [STOP]
    final = Path("ckpt") / f"step_{STEPS:06d}" / "model.safetensors"
    expected, saved = load_file(single / final), load_file(run / final)
    assert sorted(saved) == sorted(expected)
    for key in expected:
        torch.testing.assert_close(saved[key], expected[key], rtol=10 * atol, atol=atol,
                                   msg=lambda message, key=key: f"{name}: {key}: {message}")


def test_bf16_compression_ran(trained):
    """The bf16 row differs from the same layout in fp32: the compressed hook was used."""
    assert (train_losses(trained / "dp2_tp2_zero1_bf16")
            != train_losses(trained / "dp2_tp2_zero1"))


@pytest.mark.parametrize("name", LAYOUTS)
def test_option_check_accepts_the_layout(name):
    """Before this slice each row was refused ("... is not supported yet")."""
    grid = LAYOUTS[name][0]
    options = TrainingOptions()
    for flag in grid:
        key, _, value = flag.removeprefix("--").partition("=")
        group = next(g for g in (options.parallel, options.system) if hasattr(g, key))
        setattr(group, key, type(getattr(group, key))(value) if value else True)
    check_options(options)
