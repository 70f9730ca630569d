"""One global batch is one objective on every layout (docs/design.md section 3.2).

Each row splits one global batch of 4 sequences differently (over micro-batches, data-parallel
ranks, tensor or pipeline stages, context-parallel shards, ZeRO-3 shards) and must give what
one process gives with --batch_size 4: every step's loss and gradient norm, DPO's metrics, the
validation metrics and the final weights, to fp32 rounding. SFT samples differ in length, so
a mean of per-micro-batch means (the bug this table caught: 6.3059 on DP2, 6.2791 with
accumulation, 6.2902 in one process) differs from the global batch's token mean; DPO's RPO
term is a mean over the chosen answers' tokens, and its pair terms a mean over pairs.
Padded rows, packed rows (--pack_samples) and DPO pairs; the 2-rank rows train in one spawn.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from parallel.local_ranks import run_on_ranks
from tests.train_helpers import TINY_ARGS, data_args, records, run_main
from tests.trainer.test_train_grid import _runs_on_rank

STEPS = 2
# rewards are beta x differences of sums of ~30 log-probs: fp32 rounding leaves ~1e-7
MODEL = ["--num_hidden_layers=2", "--num_key_value_heads=2", f"--max_iters={STEPS}",
         f"--eval_interval={STEPS}", "--save_interval=100", "--eval_prompts=[]",
         "--adam_eps=1e-6"]  # (rounding noise in a gradient is not blown up to a whole lr)
# name -> (ranks, options): each a split of the same global batch of 4 sequences
LAYOUTS = {
    "ga2": (1, ["--batch_size=2", "--gradient_accumulation_steps=2"]),
    "ga4": (1, ["--batch_size=1", "--gradient_accumulation_steps=4"]),
    "dp2": (2, ["--batch_size=2"]),
    "dp2_ga2": (2, ["--batch_size=1", "--gradient_accumulation_steps=2"]),
    "dp2_zero3": (2, ["--batch_size=2", "--zero_stage=3"]),
    "tp2_ga2": (2, ["--tensor_parallel=2", "--batch_size=2", "--gradient_accumulation_steps=2"]),
    "pp2_ga2": (2, ["--pipeline_parallel=2", "--batch_size=2",
                    "--gradient_accumulation_steps=2"]),
    "cp2_ga2": (2, ["--context_parallel=2", "--batch_size=2", "--gradient_accumulation_steps=2"]),
}
TASKS = {"sft": ("sft", []), "sft_packed": ("sft", ["--pack_samples"]),
         "dpo": ("dpo", ["--dpo_beta=0.5", "--dpo_nll_weight=0.2"])}
METRICS = {"sft": ("loss", "grad_norm"),
           "dpo": ("loss", "grad_norm", "dpo_loss", "chosen_nll", "rewards/chosen",
                   "rewards/rejected", "rewards/accuracies", "rewards/margins")}
EVAL_METRICS = {"sft": ("val_loss", "val_tokens"),
                "dpo": ("val_loss", "val_chosen_nll", "val_rewards/margins",
                        "val_rewards/accuracies")}


def _args(data, init: Path, task: str, out: Path, *layout: str) -> list[str]:
    data_task, extra = TASKS[task]
    init_from = [f"--init_from={init}"] if data_task == "dpo" else []
    return [*TINY_ARGS, *data_args(data, data_task), *MODEL, *extra, *init_from,
            f"--out_dir={out}", *layout]


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory) -> Path:
    """Every (task, layout) trained, and each task's one-process reference (`<task>/one`)."""
    root = tmp_path_factory.mktemp("global_batch")
    init = root / "init"  # DPO's starting policy and frozen reference
    assert run_main([*TINY_ARGS, *data_args(data, "pretrain"), *MODEL,
                     f"--out_dir={init}"]) == 0
    on_two_ranks = []
    for task in TASKS:
        assert run_main(_args(data, init, task, root / task / "one", "--batch_size=4")) == 0
        for name, (ranks, layout) in LAYOUTS.items():
            argv = _args(data, init, task, root / task / name, *layout)
            if ranks == 1:
                assert run_main(argv) == 0
            else:
                on_two_ranks.append(argv)
    assert (run_on_ranks(_runs_on_rank, on_two_ranks, world_size=2, timeout=900)
            == [[0] * len(on_two_ranks)] * 2)
    return root


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("task", TASKS)
def test_every_split_of_the_global_batch_trains_like_one_process(trained, task, layout):
    kind = TASKS[task][0]
    single, run = trained / task / "one", trained / task / layout
    expected, got = records(single, "train"), records(run, "train")
    assert len(got) == len(expected) == STEPS
    for key in METRICS[kind]:
        assert [step[key] for step in got] == pytest.approx(
            [step[key] for step in expected], rel=1e-5, abs=1e-6), key
    expected_eval, got_eval = records(single, "eval")[-1], records(run, "eval")[-1]
    assert got_eval["step"] == expected_eval["step"] == STEPS
    for key in EVAL_METRICS[kind]:
        assert got_eval[key] == pytest.approx(expected_eval[key], rel=1e-5, abs=1e-6), key
    final = Path("ckpt") / f"step_{STEPS:06d}" / "model.safetensors"
    reference, saved = load_file(single / final), load_file(run / final)
    assert sorted(saved) == sorted(reference)
    for key in reference:
        torch.testing.assert_close(saved[key], reference[key], rtol=1e-4, atol=1e-5,
                                   msg=lambda message, key=key: f"{key}: {message}")
