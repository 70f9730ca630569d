"""`--task_type=dpo` on a tensor x pipeline grid (4 gloo ranks: TP2 x PP2, DP2 x PP2, and
ZeRO-2/3 over the data-parallel group of DP2 x TP2 and DP2 x PP2).

Reference: the same DPO command in one process on the same global batch (a TP2 x PP2 grid
has one data-parallel replica: the same --batch_size; DP2 x PP2 has two: the single process
reads --batch_size x 2), starting from the same SFT-stand-in model, which is also the frozen
reference. Compared to fp32 rounding: every step's loss, gradient norm and DPO metrics
(rewards, accuracies, margins, the chosen answers' NLL), the validation metrics (policy and
reference forward-only through the stages) and the final model.safetensors (gathered whole).
Under ZeRO the policy's gradients (2) and weights (3) are sharded over the data-parallel group;
the frozen reference is cut into the same stage and tensor slices (trainer/model_parallel.py
`split_reference`) and held whole on each data-parallel rank.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from parallel.local_ranks import run_on_ranks
from tests.parallel.grid_helpers import ADAM_EPS  # rounding noise not blown up to a whole lr
from tests.train_helpers import TINY_ARGS, data_args, records, run_main
from tests.trainer.test_train_grid import GRID_MODEL, _runs_on_rank

DPO_METRICS = ("loss", "grad_norm", "dpo_loss", "chosen_nll", "rewards/chosen",
               "rewards/rejected", "rewards/accuracies", "rewards/margins")
# RPO's NLL term (and the chosen_nll metric) is a mean over the global batch's chosen tokens
# (trainer/global_batch.py), equal on one replica and on two.
GRIDS = {"tp2_pp2": (["--tensor_parallel=2", "--pipeline_parallel=2", "--dpo_nll_weight=0.2"],
                     1),
         "dp2_pp2": (["--pipeline_parallel=2", "--dpo_nll_weight=0.2"], 2),
         "dp2_tp2_zero2": (["--tensor_parallel=2", "--zero_stage=2"], 2),
         "dp2_pp2_zero3": (["--pipeline_parallel=2", "--zero_stage=3"], 2)}


def _dpo_args(data, init, *extra) -> list[str]:
    return [*TINY_ARGS, *data_args(data, "dpo"), *GRID_MODEL, "--max_iters=3",
            f"--init_from={init}", "--dpo_beta=0.5", "--lr=1e-2",
            "--eval_prompts=[]", f"--adam_eps={ADAM_EPS}", *extra]


def test_dpo_on_a_grid_equals_one_process(data, tmp_path):
    init = tmp_path / "init"  # the starting policy and the frozen reference
    assert run_main([*TINY_ARGS, *data_args(data, "pretrain"), *GRID_MODEL, "--max_iters=2",
                     f"--out_dir={init}"]) == 0
    runs = [_dpo_args(data, init, *grid, f"--out_dir={tmp_path / name}")
            for name, (grid, _) in GRIDS.items()]
    nll_weight = {name: [arg for arg in grid if "nll" in arg] for name, (grid, _) in GRIDS.items()}
    assert run_on_ranks(_runs_on_rank, runs, world_size=4, timeout=600) == [[0] * len(runs)] * 4

    for name, (_, data_parallel) in GRIDS.items():
        single = tmp_path / f"single_dp{data_parallel}{'_nll' * bool(nll_weight[name])}"
        if not single.exists():  # (one reference per global batch and loss)
            assert run_main(_dpo_args(data, init, f"--batch_size={2 * data_parallel}",
                                      *nll_weight[name], f"--out_dir={single}")) == 0
        grid_steps, single_steps = records(tmp_path / name, "train"), records(single, "train")
        assert len(grid_steps) == len(single_steps) == 3
        # the policy moved away from the reference: rewards are not all 0
        assert any(abs(step["rewards/margins"]) > 1e-4 for step in single_steps[1:])
        for key in DPO_METRICS:
            assert ([step[key] for step in grid_steps] == pytest.approx(
                [step[key] for step in single_steps], rel=1e-4, abs=1e-6)), (name, key)
        grid_eval, single_eval = records(tmp_path / name, "eval")[-1], records(single, "eval")[-1]
        assert grid_eval["step"] == single_eval["step"] == 3
        for key in ("val_loss", "val_rewards/margins", "val_rewards/accuracies"):
            assert grid_eval[key] == pytest.approx(single_eval[key], rel=1e-4, abs=1e-6), key
        expected = load_file(single / "ckpt" / "step_000003" / "model.safetensors")
        saved = load_file(tmp_path / name / "ckpt" / "step_000003" / "model.safetensors")
        assert sorted(saved) == sorted(expected)
        for key in expected:
            torch.testing.assert_close(saved[key], expected[key], rtol=1e-4, atol=1e-5,
                                       msg=f"{name}: {key}")
