"""LoRA (`--lora_rank`) on tensor/pipeline grids, from the command line on 4 gloo ranks.

The base is a tiny z2all model pretrained for one step (an HF test base has an odd
vocabulary, which tensor parallelism cannot split). One table, one row per layout, all rows
in one spawn of 4 ranks: LoRA SFT for 3 steps on every projection (column-split q/k/v and
gate/up: B sliced by rows; row-split o and down: A sliced by columns, the adapter's partial
product reduced with the base's). Reference: the same command in one process, each sequence
a micro-batch of its own (--batch_size=1: a data-parallel rank's loss is the mean over its own
tokens, and so is each micro-batch's), fp32. Compared: every step's loss and gradient norm
(clipping uses the whole model's norm: replicated adapter factors counted once) and the
adapter file of step 3, gathered whole on rank 0: the one-process names and shapes, values to
fp32 rounding. The row with `STOP` stops there and resumes on the same grid: bitwise the
uninterrupted row. Then the grid run's adapters load with our loader (merged) and, exported
with `--adapter`, in peft, with the one-process run's logits.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import LlamaForCausalLM

from model import convert_to_hf
from model.loading import load_model
from model.lora_checkpoint import ADAPTERS_FILE
from parallel.local_ranks import run_on_ranks
from tests.train_helpers import TINY_ARGS, data_args, records, run_main, train_losses
from tests.trainer.test_train_grid import _runs_on_rank
from utils.cli_errors import run_main as run_cli

STEPS, STOP, ACCUMULATION = 3, 2, 2
BASE_SHAPE = ["--num_hidden_layers=2", "--num_key_value_heads=2"]  # splits by TP2 and PP2
LORA_ARGS = ["--lora_rank=4", "--lora_alpha=8"]  # every projection (the default targets)
# name: (grid options, data-parallel size, stop at STOP and resume)
LAYOUTS = {
    "tp2_pp2": (["--tensor_parallel=2", "--pipeline_parallel=2"], 1, False),
    "tp2_pp2_resumed": (["--tensor_parallel=2", "--pipeline_parallel=2"], 1, True),
    "dp2_tp2_sp": (["--tensor_parallel=2", "--sequence_parallel"], 2, False),
    "dp2_pp2_zero1": (["--pipeline_parallel=2", "--zero_stage=1"], 2, False),
}


def _sft_args(data, base: Path, *extra: str) -> list[str]:
    return [*TINY_ARGS, *data_args(data, "sft"), f"--init_from={base}", *LORA_ARGS,
            f"--max_iters={STEPS}", "--eval_interval=3", "--save_interval=100",
            "--eval_prompts=[]", "--batch_size=1", *extra]


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory) -> Path:
    """The base, every row of the table (one 4-rank spawn) and the one-process references
    (single_dp1, single_dp2: the same global batch as ACCUMULATION x D micro-batches)."""
    root = tmp_path_factory.mktemp("grid_lora")
    assert run_main([*TINY_ARGS, *data_args(data, "pretrain"), *BASE_SHAPE, "--max_iters=1",
                     "--eval_prompts=[]", f"--out_dir={root / 'base'}"]) == 0
    runs = []
    for name, (grid, _, resumed) in LAYOUTS.items():
        args = _sft_args(data, root / "base", *grid, f"--out_dir={root / name}",
                         f"--gradient_accumulation_steps={ACCUMULATION}")
        runs += [[*args, f"--stop_at_iter={STOP}"], [*args, "--resume"]] if resumed else [args]
    assert run_on_ranks(_runs_on_rank, runs, world_size=4, timeout=900) == [[0] * len(runs)] * 4
    for data_parallel in sorted({row[1] for row in LAYOUTS.values()}):
        assert run_main(_sft_args(
            data, root / "base", f"--gradient_accumulation_steps={ACCUMULATION * data_parallel}",
            f"--out_dir={root / f'single_dp{data_parallel}'}")) == 0
    return root


def _adapters(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "ckpt" / f"step_{STEPS:06d}" / ADAPTERS_FILE)


@pytest.mark.parametrize("name", LAYOUTS)
def test_lora_on_the_grid_trains_like_one_process(trained, name):
    _, data_parallel, resumed = LAYOUTS[name]
    single, run = trained / f"single_dp{data_parallel}", trained / name
    assert train_losses(run) == pytest.approx(train_losses(single), rel=1e-5)
    assert len(train_losses(run)) == STEPS
    assert ([r["grad_norm"] for r in records(run, "train")] == pytest.approx(
        [r["grad_norm"] for r in records(single, "train")], rel=1e-5))
    assert (records(run, "run")[0]["trainable_params"]
            == records(single, "run")[0]["trainable_params"])
    expected, saved = _adapters(single), _adapters(run)
    assert {key: t.shape for key, t in saved.items()} == {k: t.shape for k, t in expected.items()}
    for key in expected:
        torch.testing.assert_close(saved[key], expected[key], rtol=1e-4, atol=1e-5,
                                   msg=lambda message, key=key: f"{name}: {key}: {message}")
    if resumed:
        assert [r["step"] for r in records(run, "resume")] == [STOP]
        uninterrupted = trained / name.removesuffix("_resumed")
        assert train_losses(run) == train_losses(uninterrupted)
        assert ((run / "ckpt" / f"step_{STEPS:06d}" / ADAPTERS_FILE).read_bytes()
                == (uninterrupted / "ckpt" / f"step_{STEPS:06d}" / ADAPTERS_FILE).read_bytes())


def test_the_grids_adapter_loads_like_one_process(trained, tmp_path):
    """Our loader (adapters merged on load) and peft on the `--adapter` export give the
    one-process run's logits."""
    run, single = trained / "tp2_pp2", trained / "single_dp1"
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
