"""LoRA (`--lora_rank`) on tensor/pipeline/context grids, from the command line on 4 gloo
ranks.

Two bases: a tiny z2all model pretrained for one step, and a stock HF Llama-3 directory
(tools/tiny_hf_model.py: `LlamaForCausalLM` with rope_scaling llama3, tied embeddings and its
own tokenizer, whose odd vocabulary tensor parallelism pads: parallel/tensor_parallel/
sharding.py) for issue #30's done-when command, DP2xTP2 ZeRO-3 LoRA rank 8. One table, one row
per (task, layout, base), all rows in one spawn of 4 ranks: LoRA for 3 steps on every projection
(column-parallel q/k/v and gate/up: B sliced by rows; row-parallel o and down: A sliced by
columns, the adapter's partial product reduced with the base's); DPO's reference is the policy's
own stages with the adapters off; with context parallelism (CP2 x TP2, DP2 x CP2 ZeRO-3) each
rank's adapters compute on its two chunks of every sequence. Reference: the same command in one
process on the same global batch (trainer/global_batch.py: any split of it is one objective),
fp32. Compared: every step's loss, gradient norm (clipping uses the whole model's norm:
replicated adapter factors counted once) and DPO reward margin, the validation loss, and the
adapter file of step 3, gathered whole on rank 0: the one-process names and shapes, values to
fp32 rounding. A row that stops at `STOP` resumes on the same grid (bitwise the uninterrupted
row) or in one process (the optimizer state is layout-neutral). Then the grid run's adapters
load with our loader (merged) and, exported with `--adapter`, in peft, with the one-process
run's logits, and every rank's memory after the first step is its plan.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import LlamaForCausalLM

from model import convert_to_hf
from model.loading import load_model, model_config_at, resolve_model_dir
from model.lora_checkpoint import ADAPTERS_FILE
from parallel.local_ranks import run_on_ranks
from tests.parallel.grid_helpers import ADAM_EPS
from tests.train_helpers import TINY_ARGS, data_args, records, run_main, train_losses
from tests.trainer.test_train_grid import _runs_on_rank
from tools import tiny_hf_model
from trainer.config_files import load_config_file
from trainer.memory_fit import memory_plan
from trainer.options import TrainingOptions
from utils.cli_errors import run_main as run_cli

STEPS, STOP, ACCUMULATION = 3, 2, 2
BASE_SHAPE = ["--num_hidden_layers=2", "--num_key_value_heads=2"]  # splits by TP2 and PP2
LORA_ARGS = ["--lora_rank=4", "--lora_alpha=8"]  # every projection (the default targets)
TP2_PP2 = ["--tensor_parallel=2", "--pipeline_parallel=2"]
CP2_TP2 = ["--context_parallel=2", "--tensor_parallel=2"]
ONE_PROCESS = ["--tensor_parallel=1", "--pipeline_parallel=1", "--zero_stage=1"]
# name: (grid options, data-parallel size, task, where a run stopped at STOP resumes: None =
# not stopped, "grid" = on its own grid, "one process" = with ONE_PROCESS, base: BASES)
LAYOUTS = {
    "sft_tp2_pp2": (TP2_PP2, 1, "sft", None, "z2all"),
    "sft_tp2_pp2_resumed": (TP2_PP2, 1, "sft", "grid", "z2all"),
    "sft_tp2_pp2_resumed_in_one_process": (TP2_PP2, 1, "sft", "one process", "z2all"),
    "sft_dp2_tp2_sp": (["--tensor_parallel=2", "--sequence_parallel"], 2, "sft", None, "z2all"),
    "sft_dp2_pp2_zero1": (["--pipeline_parallel=2", "--zero_stage=1"], 2, "sft", None, "z2all"),
    "sft_dp2_pp2_zero3": (["--pipeline_parallel=2", "--zero_stage=3"], 2, "sft", None, "z2all"),
    "sft_dp2_tp2_zero3_hf_llama3": (["--tensor_parallel=2", "--zero_stage=3"], 2, "sft", None,
                                    "hf_llama3"),
    "dpo_tp2_pp2": (TP2_PP2, 1, "dpo", None, "z2all"),
    # context parallelism: each rank's adapters see its two chunks of every sequence
    "sft_cp2_tp2": (CP2_TP2, 1, "sft", None, "z2all"),
    "sft_dp2_cp2_zero3": (["--context_parallel=2", "--zero_stage=3"], 2, "sft", None, "z2all"),
    "dpo_cp2_tp2": (CP2_TP2, 1, "dpo", None, "z2all"),
}
# Adam's eps is raised as in test_train_grid_dpo.py: an adapter element whose gradient is
# rounding noise would otherwise move by a whole lr (DPO's gradients, a difference of sequence
# log-probs near log 2, are small everywhere)
TASK_OPTIONS = {"sft": [f"--adam_eps={ADAM_EPS}"],
                "dpo": ["--dpo_beta=0.5", f"--adam_eps={ADAM_EPS}"]}
TOLERANCE = {"sft": 1e-5, "dpo": 1e-4}  # relative, for every compared metric
# absolute: DPO's reward margin is beta x a difference of sequence log-prob sums (tens of
# nats); where ring attention merges blocks in another order than one process, those sums
# round differently by ~1e-6 (as in test_train_context_parallel.py)
ABSOLUTE = {"sft": 1e-7, "dpo": 1e-6}
COMPARED = ("loss", "grad_norm", "rewards/margins")  # per step, where the task logs it


def _base_args(root: Path, data, base: str) -> list[str]:
    """The base and its tokenizer (the z2all base's is the data's, an HF dir brings its own;
    the HF base takes the done-when command's LoRA rank)."""
    if base == "z2all":
        return [f"--init_from={root / base}", f"--tokenizer_dir={data['tokenizer']}"]
    return [f"--init_from={root / base}", "--lora_rank=8", "--lora_alpha=16"]


def _lora_args(data, root: Path, out_dir: Path, task: str, base: str, *extra: str
               ) -> list[str]:
    return [*TINY_ARGS, f"--task_type={task}", f"--data_dir={data[task]}",
            *TASK_OPTIONS[task], *LORA_ARGS, *_base_args(root, data, base),
            f"--max_iters={STEPS}", "--eval_interval=3", "--save_interval=100",
            "--eval_prompts=[]", "--batch_size=1", f"--out_dir={out_dir}", *extra]


def _reference(root: Path, task: str, data_parallel: int, base: str) -> Path:
    return root / f"single_{task}_dp{data_parallel}_{base}"


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory, tiny_hf_tokenizer_dir) -> Path:
    """The bases, every row of the table (one 4-rank spawn; a resume in one process after it)
    and the one-process references (the same global batch as ACCUMULATION x D micro-batches)."""
    root = tmp_path_factory.mktemp("grid_lora")
    assert run_main([*TINY_ARGS, *data_args(data, "pretrain"), *BASE_SHAPE, "--max_iters=1",
                     "--eval_prompts=[]", f"--out_dir={root / 'z2all'}"]) == 0
    tiny_hf_model.main(["--tokenizer_dir", str(tiny_hf_tokenizer_dir), "--style", "llama3",
                        "--out", str(root / "hf_llama3")])
    on_grid, in_one_process = [], []
    for name, (grid, _, task, resumed_on, base) in LAYOUTS.items():
        args = _lora_args(data, root, root / name, task, base,
                          f"--gradient_accumulation_steps={ACCUMULATION}")
        on_grid.append([*args, *grid] + ([f"--stop_at_iter={STOP}"] if resumed_on else []))
        if resumed_on == "grid":
            on_grid.append([*args, *grid, "--resume"])
        elif resumed_on == "one process":
            in_one_process.append([*args, *ONE_PROCESS, "--resume"])
    assert (run_on_ranks(_runs_on_rank, on_grid, world_size=4, timeout=900)
            == [[0] * len(on_grid)] * 4)
    assert [run_main(args) for args in in_one_process] == [0] * len(in_one_process)
    for data_parallel, task, base in sorted({(row[1], row[2], row[4])
                                             for row in LAYOUTS.values()}):
        assert run_main(_lora_args(
            data, root, _reference(root, task, data_parallel, base), task, base,
            f"--gradient_accumulation_steps={ACCUMULATION * data_parallel}")) == 0
    return root


def _adapters(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "ckpt" / f"step_{STEPS:06d}" / ADAPTERS_FILE)


@pytest.mark.parametrize("name", LAYOUTS)
def test_lora_on_the_grid_trains_like_one_process(trained, name):
    _, data_parallel, task, resumed_on, base = LAYOUTS[name]
    single, run = _reference(trained, task, data_parallel, base), trained / name
    steps, expected_steps = records(run, "train"), records(single, "train")
    assert len(steps) == len(expected_steps) == STEPS
    for key in [key for key in COMPARED if key in expected_steps[0]]:
        assert ([step[key] for step in steps] == pytest.approx(
            [step[key] for step in expected_steps], rel=TOLERANCE[task], abs=ABSOLUTE[task])), key
    if task == "dpo":  # the reference is the base: the adapters start at B = 0
        assert steps[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert (records(run, "eval")[-1]["val_loss"] == pytest.approx(
        records(single, "eval")[-1]["val_loss"], rel=TOLERANCE[task]))
    assert (records(run, "run")[0]["trainable_params"]
            == records(single, "run")[0]["trainable_params"])
    expected, saved = _adapters(single), _adapters(run)
    assert {key: t.shape for key, t in saved.items()} == {k: t.shape for k, t in expected.items()}
    for key in expected:
        torch.testing.assert_close(saved[key], expected[key], rtol=1e-4, atol=1e-5,
                                   msg=lambda message, key=key: f"{name}: {key}: {message}")
    if resumed_on is not None:
        assert [r["step"] for r in records(run, "resume")] == [STOP]
    if resumed_on == "grid":  # bitwise
        uninterrupted = trained / name.removesuffix("_resumed")
        assert train_losses(run) == train_losses(uninterrupted)
        assert ((run / "ckpt" / f"step_{STEPS:06d}" / ADAPTERS_FILE).read_bytes()
                == (uninterrupted / "ckpt" / f"step_{STEPS:06d}" / ADAPTERS_FILE).read_bytes())


@pytest.mark.parametrize("name", [name for name, row in LAYOUTS.items() if row[3] is None])
def test_memory_on_every_rank_is_as_planned(trained, name):
    """After the first step each rank holds, measured to the byte, what its plan says: its
    slices of the adapters with their gradients and Adam state, and its part of the frozen
    base (ZeRO-3: the adapters sharded, the base whole)."""
    run = trained / name
    options = TrainingOptions.from_dict(load_config_file(run / "config.json"))
    config = model_config_at(resolve_model_dir(trained / LAYOUTS[name][4]))
    (measured,) = records(run, "memory")
    assert len(measured["per_rank"]) == 4
    for rank, held in enumerate(measured["per_rank"]):
        plan = memory_plan(options, config, 4, rank, "fp32")
        assert held == plan.as_measured(), (name, rank)
        assert held["frozen_base"] > held["params"] > 0  # the base held, and adapters


def test_the_grids_adapter_loads_like_one_process(trained, tmp_path):
    """Our loader (adapters merged on load) and peft on the `--adapter` export give the
    one-process run's logits."""
    run, single = trained / "sft_tp2_pp2", _reference(trained, "sft", 1, "z2all")
    ours, reference = (load_model(directory)[0].eval() for directory in (run, single))
    input_ids = torch.randint(0, ours.config.vocab_size, (2, 12))
    with torch.no_grad():
        expected = reference(input_ids).logits
        torch.testing.assert_close(ours(input_ids).logits, expected, rtol=1e-4, atol=1e-5)
    adapter_dir = tmp_path / "adapter"
    assert run_cli(convert_to_hf.main, ["--ckpt", str(run), "--out", str(adapter_dir),
                                        "--adapter"]) == 0
    base = LlamaForCausalLM.from_pretrained(adapter_dir / "base_model")
    peft_model = PeftModel.from_pretrained(base, adapter_dir).eval()
    with torch.no_grad():
        torch.testing.assert_close(peft_model(input_ids).logits,
                                   expected, rtol=1e-4, atol=1e-5)
