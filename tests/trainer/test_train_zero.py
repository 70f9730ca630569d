"""`--zero_stage 2/3` from the command line, on 2 gloo ranks.

Reference: the same command at `--zero_stage 0` (our DDP, itself equal to torch DDP): every
stage averages the same gradients, so each step's loss agrees to fp32 rounding (the sums run in
another order), for pretraining, SFT and DPO. Resume: a run stopped at step 3 and resumed
equals the uninterrupted run bitwise (losses and model.safetensors), at stages 2 and 3, and so
does a torchrun run killed with SIGKILL at a random step and resumed. The
memory plan printed at start-up equals the measured bytes of the params, grads and Adam state
(rank 0, after the first step). Eval samples run at stage 3 (rank 0 generates inside the
collective gather: without it the run would hang).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from model.modeling_z2all import Z2allForCausalLM
from parallel_plan.memory_plan import plan_memory
from tests.train_helpers import (
    TINY_ARGS,
    data_args,
    records,
    run_main,
    run_on_two_ranks,
    train_losses,
)
from tests.trainer.test_train_resume import _assert_identical, _pretrain_args, _three_runs
from tests.trainer.test_train_stream import kill9_and_resume
from trainer.option_validation import check_options
from trainer.options import TrainingOptions

STAGES = (2, 3)
ACCUMULATION = "--gradient_accumulation_steps=2"  # ZeRO-2/3 reduce every micro-batch


def _task_args(data: dict[str, Path], task: str, init: Path) -> list[str]:
    args = [*TINY_ARGS, *data_args(data, task), "--max_iters=3", "--eval_interval=3",
            "--save_interval=3", ACCUMULATION]
    return [*args, f"--init_from={init}"] if task == "dpo" else args


def test_zero_stages_train_like_ddp_and_resume_bitwise(data, tmp_path):
    init = tmp_path / "init"  # DPO's starting policy and reference
    assert run_main([*_pretrain_args(data), f"--out_dir={init}", "--max_iters=2"]) == 0
    runs = []
    for stage in STAGES:
        runs += _three_runs(_pretrain_args(data, f"--zero_stage={stage}", ACCUMULATION),
                            tmp_path / f"resume{stage}", total=6, stop=3)
    for task in ("pretrain", "sft", "dpo"):
        runs += [[*_task_args(data, task, init), f"--zero_stage={stage}",
                  f"--out_dir={tmp_path / f'{task}{stage}'}"] for stage in (0, *STAGES)]
    assert run_on_two_ranks(*runs) == [0] * len(runs)

    for stage in STAGES:
        _assert_identical(tmp_path / f"resume{stage}" / "full", tmp_path / f"resume{stage}" / "cut",
                          6, 3)
    for task in ("pretrain", "sft", "dpo"):
        reference = train_losses(tmp_path / f"{task}0")
        assert len(reference) == 3
        for stage in STAGES:
            run_dir = tmp_path / f"{task}{stage}"
            assert train_losses(run_dir) == pytest.approx(reference, rel=1e-5), (task, stage)
            assert records(run_dir, "samples"), (task, stage)  # generated (stage 3: gathered)
            _assert_memory_as_planned(run_dir, stage)


def _assert_memory_as_planned(run_dir: Path, stage: int) -> None:
    """Rank 0's measured bytes after step 1 equal the plan computed from the saved config."""
    config = Z2allForCausalLM.from_pretrained(run_dir / "ckpt" / "step_000003").config
    plan = plan_memory(config, world_size=2, zero_stage=stage, dtype="fp32", batch_size=2,
                       max_seq_len=32, rank=0)
    (measured,) = records(run_dir, "memory")
    assert measured["params"] == plan.bytes_of("params")
    assert measured["grads"] == plan.bytes_of("grads")
    assert measured["optimizer"] == plan.bytes_of("adam_state")  # fp32: no master copy


@pytest.mark.parametrize("changes, expected", [
    ({"zero_stage": 3, "compile": True}, "--compile cannot be combined with --zero_stage=3"),
    ({"zero_stage": 2, "comm_hook": "powersgd"}, "--comm_hook=powersgd cannot be combined"),
    ({"zero_stage": 2, "use_distributed_optimizer": True}, "--use_distributed_optimizer means"),
    ({"zero_stage": 4}, "--zero_stage must be one of"),
])
def test_impossible_zero_combinations_are_refused_in_one_line(changes, expected):
    options = TrainingOptions()
    for name, value in changes.items():
        group = options.parallel if hasattr(options.parallel, name) else options.system
        setattr(group, name, value)
    with pytest.raises(ValueError, match=expected) as error:
        check_options(options)
    assert "\n" not in str(error.value)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds torchrun's ranks via /proc")
@pytest.mark.parametrize("stage", STAGES)
def test_kill9_mid_run_then_resume_is_bitwise(data, tmp_path, stage):
    """torchrun with 2 ranks, SIGKILL to every process at a random step after the first
    checkpoint, then --resume: the same losses and final weights as the uninterrupted run."""
    total = 12
    args = [*TINY_ARGS, *data_args(data, "pretrain"), f"--zero_stage={stage}", ACCUMULATION,
            f"--max_iters={total}", "--save_interval=3", "--keep_last=20",
            "--eval_interval=1000", "--eval_prompts=[]"]
    kill9_and_resume(args, tmp_path, total, first_kill=4)
