"""End-to-end tiny runs of the trainer: every task, 1 process and 2 ranks, against references.

- pretraining reduces the loss and leaves a complete run dir;
- 2 ranks × batch 2 take the same steps as 1 process × batch 4 (same global batch): this holds
  only if the ranks read disjoint halves of the same global order and DDP averages correctly;
- SFT from the pretrained checkpoint (and from its HF export: same first loss) lowers the loss;
  packed SFT samples (--pack_samples) take the same steps as padded ones;
- DPO starts at loss log 2 with zero rewards (policy == reference), then improves.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from model import modeling_z2all
from tests.train_helpers import (
    TINY_ARGS,
    data_args,
    records,
    run_main,
    run_on_two_ranks,
    train_losses,
)
from utils.checkpoint import resolve_checkpoint


@pytest.fixture(scope="module")
def pretrained(data, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("runs") / "pretrain"
    rc = run_main([*TINY_ARGS, *data_args(data, "pretrain"), f"--out_dir={run_dir}",
                   "--max_iters=30", "--eval_interval=15", "--save_interval=15", "--lr=1e-2"])
    assert rc == 0
    return run_dir


def _mean(values):
    return sum(values) / len(values)


def test_pretrain_reduces_loss_and_writes_the_run_dir(pretrained):
    losses = list(train_losses(pretrained).values())
    assert len(losses) == 30 and _mean(losses[-5:]) < _mean(losses[:5]) - 0.5
    evals = records(pretrained, "eval")
    assert [e["step"] for e in evals] == [0, 15, 30]
    vocab_size = json.loads((resolve_checkpoint(pretrained) / "config.json").read_text())[
        "vocab_size"]
    assert evals[0]["val_loss"] == pytest.approx(math.log(vocab_size), abs=0.3)  # untrained
    assert evals[2]["val_loss"] < evals[1]["val_loss"] < evals[0]["val_loss"] - 1.0
    assert evals[2]["val_bpb"] > 0 and evals[2]["val_ppl"] == pytest.approx(
        math.exp(evals[2]["val_loss"]), rel=1e-6)
    for name in ("config.json", "exp_config.py", "report.md", "heartbeat"):
        assert (pretrained / name).is_file(), name
    assert json.loads((pretrained / "heartbeat").read_text())["step"] == 30
    assert resolve_checkpoint(pretrained).name == "step_000030"
    assert records(pretrained, "samples")[-1]["samples"][0]["prompt"] == "What is 2 + 3?"
    report = (pretrained / "report.md").read_text()
    assert "## Final metrics" in report and "dtype fp32 (as requested)" in report
    resolved = json.loads((pretrained / "config.json").read_text())["resolved"]
    assert resolved["precision"]["dtype"] == "fp32"
    # the kernel line names each op's implementation and why a faster one is not used
    assert "kernels attention=torch-sdpa (" in report and ", adamw=torch-foreach (cpu" in report
    assert records(pretrained, "run")[0]["kernels"].startswith("kernels: attention=")


@pytest.mark.parametrize("verbose", [False, True])
def test_verbose_logs_the_ddp_bucket_map(data, tmp_path, caplog, capsys, monkeypatch, verbose):
    monkeypatch.setattr(modeling_z2all, "_logged_kernel_choices", set())
    assert run_main([*TINY_ARGS, *data_args(data, "pretrain"), f"--out_dir={tmp_path}",
                     "--max_iters=1", "--eval_at_start=false", f"--verbose={verbose}",
                     "--bucket_size=2000"]) == 0
    bucket_maps = [m for m in caplog.messages if "bucket 1 [" in m]
    assert len(bucket_maps) == (1 if verbose else 0)
    # The kernel line once: the trainer's (it names the optimizer too), not the model's again.
    assert capsys.readouterr().out.count("attention=torch-sdpa") == 1
    assert not any(m.startswith("model kernels on") for m in caplog.messages)


def test_sft_then_dpo(data, pretrained, tmp_path):
    sft_dir = tmp_path / "sft"
    assert run_main([*TINY_ARGS, *data_args(data, "sft"), f"--out_dir={sft_dir}",
                     f"--init_from={pretrained}", "--max_iters=20", "--eval_interval=20",
                     "--save_interval=20", "--batch_size=4"]) == 0
    losses = list(train_losses(sft_dir).values())
    assert _mean(losses[-5:]) < _mean(losses[:5])

    dpo_dir = tmp_path / "dpo"
    assert run_main([*TINY_ARGS, *data_args(data, "dpo"), f"--out_dir={dpo_dir}",
                     f"--init_from={sft_dir}", "--max_iters=15", "--eval_interval=15",
                     "--save_interval=15", "--batch_size=4", "--lr=3e-3", "--dpo_beta=0.5"]) == 0
    steps = records(dpo_dir, "train")
    # Step 1's loss is computed before any update: the policy is the reference.
    assert steps[0]["loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert steps[0]["rewards/chosen"] == pytest.approx(0, abs=1e-5)
    assert steps[0]["rewards/margins"] == pytest.approx(0, abs=1e-5)
    assert _mean([s["loss"] for s in steps[-5:]]) < math.log(2)
    assert _mean([s["rewards/margins"] for s in steps[-5:]]) > 0


def test_packed_sft_takes_the_same_steps_as_padded_sft(data, tmp_path):
    """--pack_samples changes the cost of a step, not the step: same losses, fewer tokens.
    From a fresh model: the pretrained one only knows 32 positions."""
    common = [*TINY_ARGS, *data_args(data, "sft"), "--max_iters=4", "--eval_interval=4",
              "--save_interval=4", "--batch_size=6", "--max_seq_len=96"]  # room for several
    assert run_main([*common, f"--out_dir={tmp_path / 'padded'}"]) == 0
    assert run_main([*common, f"--out_dir={tmp_path / 'packed'}", "--pack_samples"]) == 0
    padded, packed = records(tmp_path / "padded", "train"), records(tmp_path / "packed", "train")
    assert [r["loss"] for r in packed] == pytest.approx([r["loss"] for r in padded], rel=1e-5)
    assert packed[-1]["tokens"] < padded[-1]["tokens"]


def test_sft_init_from_hf_export_matches_z2all_checkpoint(data, pretrained, tmp_path):
    from model.convert_to_hf import export_hf
    from model.modeling_z2all import Z2allForCausalLM

    export_hf(Z2allForCausalLM.from_pretrained(resolve_checkpoint(pretrained)), tmp_path / "hf")
    common = [*TINY_ARGS, *data_args(data, "sft"), "--max_iters=2", "--eval_interval=2",
              "--save_interval=2"]
    assert run_main([*common, f"--out_dir={tmp_path / 'a'}", f"--init_from={pretrained}"]) == 0
    assert run_main([*common, f"--out_dir={tmp_path / 'b'}",
                     f"--init_from={tmp_path / 'hf'}"]) == 0
    a, b = train_losses(tmp_path / "a"), train_losses(tmp_path / "b")
    assert a[1] == pytest.approx(b[1], rel=1e-5)


def test_two_ranks(data, pretrained, tmp_path):
    """One spawn of 2 ranks runs pretrain (vs 1 process × batch 4), then SFT and DPO, which
    must lower their losses too."""
    common = [*TINY_ARGS, "--max_iters=4", "--eval_interval=4", "--save_interval=4"]
    one, two = tmp_path / "one", tmp_path / "two"
    sft_dir, dpo_dir = tmp_path / "sft", tmp_path / "dpo"
    assert run_main([*common, *data_args(data, "pretrain"), f"--out_dir={one}",
                     "--batch_size=4"]) == 0
    tuning = [*TINY_ARGS, "--max_iters=12", "--eval_interval=12", "--save_interval=12"]
    assert run_on_two_ranks(
        [*common, *data_args(data, "pretrain"), f"--out_dir={two}", "--batch_size=2"],
        [*tuning, *data_args(data, "sft"), f"--out_dir={sft_dir}", f"--init_from={pretrained}"],
        [*tuning, *data_args(data, "dpo"), f"--out_dir={dpo_dir}", f"--init_from={sft_dir}",
         "--dpo_beta=0.5"],
    ) == [0, 0, 0]

    # Same global batch => same steps, only if ranks read disjoint halves of one global order.
    torch.testing.assert_close(list(train_losses(two).values()),
                               list(train_losses(one).values()), rtol=1e-4, atol=1e-5)
    run_info = records(two, "run")[0]
    assert run_info["effective_batch"] == 4 and run_info["world_size"] == 2
    assert records(two, "train")[-1]["tokens"] == records(one, "train")[-1]["tokens"] == 4 * 4 * 32

    sft_losses = list(train_losses(sft_dir).values())
    assert _mean(sft_losses[-3:]) < _mean(sft_losses[:3])
    dpo_losses = list(train_losses(dpo_dir).values())
    assert dpo_losses[0] == pytest.approx(math.log(2), abs=1e-5)
    dpo_eval = records(dpo_dir, "eval")[-1]  # held-out pairs: chosen now beats rejected
    assert dpo_eval["val_loss"] < math.log(2) - 0.01 and dpo_eval["val_rewards/margins"] > 0
    assert resolve_checkpoint(dpo_dir).name == "step_000012"
