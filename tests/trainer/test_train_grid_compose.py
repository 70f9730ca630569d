"""Options that compose with a tensor/pipeline/context grid, from the command line on 4 gloo
ranks: ZeRO-1/2/3 (the optimizer state, then the gradients, then the weights sharded over the
grid's data-parallel group), ZeRO-1's bf16-compressed reduce-scatter, compiled decoder blocks,
and context parallelism with data, tensor and pipeline parallelism and every ZeRO stage (the
states then sharded over the dp x cp group), and on 4 ranks alone (2-rank context-parallel
runs: test_train_context_parallel.py).

One table, one row per layout; all rows train in one spawn of 4 ranks (a spawn costs more
than a run). Reference: the same command in one process on the same global batch (the
grid's data-parallel size D reads --batch_size, one process --batch_size x D). Compared: every
step's loss, the gradient norm (clipping uses the whole model's: with ZeRO each rank holds
only its shard's gradients) and the final model.safetensors, to fp32 rounding. A row with
a "resumed from" entry stops at step 2 with those options and resumes with its own: on the
same grid ZeRO-1 <-> replicated (the ZeRO-1 state, spread over the dp group, saved whole and
read by a replicated optimizer, and the other way); ZeRO-3 on DP2 x PP2 and ZeRO-1 on
CP2 x TP2 resumed on the same layout, bit for bit the uninterrupted row; and the same stop
resumed in one process
(ZeRO-3 reading the grid's one optimizer file, --batch_size x 2).

bf16: each rank's gradient is rounded to bf16 (8-bit mantissa, relative error 2^-9) before the
sum, so it agrees with fp32 only to that rounding (BF16_ATOL), and must differ from the same
layout in fp32 (else no compression ran).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from model.modeling_z2all import Z2allForCausalLM
from parallel.local_ranks import run_on_ranks
from tests.train_helpers import records, run_main, train_losses
from tests.trainer.test_train_grid import _args, _runs_on_rank
from tests.trainer.test_train_resume import _assert_identical
from trainer.config_files import load_config_file
from trainer.memory_fit import memory_plan
from trainer.option_validation import check_options
from trainer.options import TrainingOptions

STEPS, STOP = 3, 2
DP2_TP2, DP2_PP2 = ["--tensor_parallel=2"], ["--pipeline_parallel=2"]
ONE_PROCESS = ["--tensor_parallel=1", "--pipeline_parallel=1"]
CP2 = ["--context_parallel=2"]
BF16_ATOL = 1e-2
"""Adam moves an element whose gradient is rounding noise by up to lr (3e-3) per step: bf16
noise there is fp32 rounding's x 2^14, so such weights differ by up to a few lr."""
# afab: the last stage's final norm is needed in both backwards after both forwards, which
# ZeRO-3 keeps gathered through the schedule's no_sync() (1f1b alternates F and B there).
DP2_PP2_ZERO3 = [*DP2_PP2, "--zero_stage=3", "--pp_schedule=afab"]
CP2_TP2_ZERO1 = [*CP2, *DP2_TP2, "--zero_stage=1"]


@dataclass(frozen=True)
class Layout:
    """One row: trained with `options` (on 4 ranks, or in one process) for STEPS steps."""

    options: list[str]
    data_parallel: int
    """The grid's D: the one-process reference reads --batch_size x D."""
    loss_rel: float = 1e-5
    weight_atol: float = 1e-5
    resumed_from: list[str] | None = None
    """Stopped at step STOP with these options (on 4 ranks), then resumed with `options`."""
    bitwise_twin: str | None = None
    """The uninterrupted row this resume equals bit for bit (the same layout)."""

    @property
    def in_one_process(self) -> bool:
        return self.options[:2] == ONE_PROCESS


LAYOUTS = {
    "dp2_tp2_zero1": Layout([*DP2_TP2, "--zero_stage=1"], 2),
    "dp2_pp2_zero1": Layout([*DP2_PP2, "--use_distributed_optimizer"], 2),
    "dp2_tp2_zero1_bf16": Layout([*DP2_TP2, "--zero_stage=1", "--comm_hook=bf16"], 2,
                                 loss_rel=1e-3, weight_atol=BF16_ATOL),
    "tp2_pp2_compile": Layout([*DP2_TP2, *DP2_PP2, "--compile"], 1),
    "dp2_tp2_zero1_from_zero0": Layout([*DP2_TP2, "--zero_stage=1"], 2, resumed_from=DP2_TP2),
    "dp2_pp2_zero0_from_zero1": Layout(DP2_PP2, 2, resumed_from=[*DP2_PP2, "--zero_stage=1"]),
    "dp2_tp2_zero2": Layout([*DP2_TP2, "--zero_stage=2"], 2),
    "dp2_tp2_zero3": Layout([*DP2_TP2, "--zero_stage=3"], 2),
    # Sequence parallelism's norm weights: replicated, each rank's gradient partial (summed over
    # the TP group in backward) before ZeRO reduce-scatters it over the dp group.
    "dp2_tp2_sp_zero2": Layout([*DP2_TP2, "--sequence_parallel", "--zero_stage=2"], 2),
    "dp2_tp2_sp_zero3": Layout([*DP2_TP2, "--sequence_parallel", "--zero_stage=3"], 2),
    "dp2_pp2_zero2": Layout([*DP2_PP2, "--zero_stage=2"], 2),
    "dp2_pp2_zero3": Layout(DP2_PP2_ZERO3, 2),
    "dp2_pp2_zero3_resumed": Layout(DP2_PP2_ZERO3, 2, resumed_from=DP2_PP2_ZERO3,
                                    bitwise_twin="dp2_pp2_zero3"),
    # The grid's one optimizer file, read by ZeRO-3 in one process (the same global batch).
    "dp2_pp2_zero3_to_one_process": Layout([*ONE_PROCESS, "--zero_stage=3", "--batch_size=4"],
                                           2, resumed_from=DP2_PP2_ZERO3),
    "dp2_cp2_zero1": Layout([*CP2, "--zero_stage=1"], 2),  # ZeRO-1 over dp x cp
    "cp2_tp2_sp": Layout([*CP2, *DP2_TP2, "--sequence_parallel"], 1),
    # The grid optimizer sharded over dp x cp (here the two cp ranks of each tp shard): its
    # norm and its saved state summed over that group (a resume is bitwise)
    "cp2_tp2_zero1": Layout(CP2_TP2_ZERO1, 1),
    "cp2_tp2_zero1_resumed": Layout(CP2_TP2_ZERO1, 1, resumed_from=CP2_TP2_ZERO1,
                                    bitwise_twin="cp2_tp2_zero1"),
    "cp2_tp2_zero3": Layout([*CP2, *DP2_TP2, "--zero_stage=3"], 1),
    "dp2_cp2_zero3": Layout([*CP2, "--zero_stage=3"], 2),  # units sharded over dp x cp
    "cp2_pp2": Layout([*CP2, *DP2_PP2], 1),  # the stages exchange each rank's two chunks
    "cp4": Layout(["--context_parallel=4"], 1),  # 8 chunks of 4 tokens, a ring of 4
}


def _layout_args(data, grid: list[str], *extra: str) -> list[str]:
    return [*_args(data, f"--max_iters={STEPS}", "--eval_prompts=[]", *extra), *grid]


def _runs(data, root: Path) -> tuple[list[list[str]], list[list[str]]]:
    """(the runs on 4 ranks, the runs in one process after them)."""
    on_ranks, one_process = [], []
    for name, layout in LAYOUTS.items():
        out = f"--out_dir={root / name}"
        if layout.resumed_from is not None:
            on_ranks.append(_layout_args(data, layout.resumed_from, out, f"--stop_at_iter={STOP}"))
        resume = ["--resume"] if layout.resumed_from else []
        (one_process if layout.in_one_process else on_ranks).append(
            _layout_args(data, layout.options, out, *resume))
    return on_ranks, one_process


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory) -> Path:
    """Every layout of the table trained (one 4-rank spawn, then the one-process resumes),
    and the one-process references (single_dp1, single_dp2)."""
    root = tmp_path_factory.mktemp("compose")
    on_ranks, one_process = _runs(data, root)
    assert (run_on_ranks(_runs_on_rank, on_ranks, world_size=4, timeout=900)
            == [[0] * len(on_ranks)] * 4)
    for argv in one_process:
        with pytest.warns(UserWarning, match="batch_size changed 2 -> 4"):
            assert run_main(argv) == 0
    for data_parallel in sorted({layout.data_parallel for layout in LAYOUTS.values()}):
        assert run_main([*_layout_args(data, [], f"--batch_size={2 * data_parallel}"),
                         f"--out_dir={root / f'single_dp{data_parallel}'}"]) == 0
    return root


@pytest.mark.parametrize("name", LAYOUTS)
def test_layout_is_accepted_and_trains_like_one_process(trained, name):
    layout = LAYOUTS[name]
    rel, atol = layout.loss_rel, layout.weight_atol
    single, run = trained / f"single_dp{layout.data_parallel}", trained / name
    reference, losses = train_losses(single), train_losses(run)
    assert len(losses) == STEPS and losses == pytest.approx(reference, rel=rel)
    assert ([r["grad_norm"] for r in records(run, "train")] == pytest.approx(
        [r["grad_norm"] for r in records(single, "train")], rel=rel))
    got, expected_val = ({r["step"]: r["val_loss"] for r in records(run_dir, "eval")}
                         for run_dir in (run, single))
    # (a stopped run also evaluates at its stop: compare the reference's steps)
    assert {step: got[step] for step in expected_val} == pytest.approx(expected_val, rel=rel)
    if layout.resumed_from is not None:
        assert [r["step"] for r in records(run, "resume")] == [STOP]
    final = Path("ckpt") / f"step_{STEPS:06d}" / "model.safetensors"
    expected, saved = load_file(single / final), load_file(run / final)
    assert sorted(saved) == sorted(expected)
    for key in expected:
        torch.testing.assert_close(saved[key], expected[key], rtol=10 * atol, atol=atol,
                                   msg=lambda message, key=key: f"{name}: {key}: {message}")


@pytest.mark.parametrize("name", [name for name, layout in LAYOUTS.items()
                                  if layout.bitwise_twin])
def test_resume_on_the_same_layout_is_bitwise(trained, name):
    _assert_identical(trained / LAYOUTS[name].bitwise_twin, trained / name, STEPS, STOP)


@pytest.mark.parametrize("name", [name for name, layout in LAYOUTS.items()
                                  if not layout.resumed_from and not layout.in_one_process])
def test_memory_on_every_rank_is_as_planned(trained, name):
    """After the first step each rank's params, grads and Adam state, measured, equal the plan
    for that rank (its stage, its tensor slices, its data-parallel shard), to the byte."""
    run = trained / name
    options = TrainingOptions.from_dict(load_config_file(run / "config.json"))
    config = Z2allForCausalLM.from_pretrained(run / "ckpt" / f"step_{STEPS:06d}").config
    (measured,) = records(run, "memory")
    assert len(measured["per_rank"]) == 4
    for rank, held in enumerate(measured["per_rank"]):
        assert held == memory_plan(options, config, 4, rank, "fp32").as_measured(), (name, rank)


def test_bf16_compression_ran(trained):
    """The bf16 row differs from the same layout in fp32: the compressed hook was used."""
    assert (train_losses(trained / "dp2_tp2_zero1_bf16")
            != train_losses(trained / "dp2_tp2_zero1"))


@pytest.mark.parametrize("name", LAYOUTS)
def test_option_check_accepts_the_layout(name):
    """Before this slice each row was refused ("... is not supported yet")."""
    options = TrainingOptions()
    for flag in LAYOUTS[name].options:
        key, _, value = flag.removeprefix("--").partition("=")
        group = next(g for g in (options.parallel, options.system, options.optimization)
                     if hasattr(g, key))
        setattr(group, key, type(getattr(group, key))(value) if value else True)
    check_options(options)
