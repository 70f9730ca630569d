"""Fine-tuning a pretrained HF model through the trainer: its own tokenizer, and LoRA.

The base is a random Llama-3-style `LlamaForCausalLM` with its own tokenizer and template,
written offline by tools/tiny_hf_model.py. Checked against references:
- SFT with --init_from and no --tokenizer_dir trains with the model's tokenizer (same
  fingerprint as loading the HF dir), the run keeps a copy, and generate.py runs the run from
  another working directory; a tokenizer that is not the model's is refused up front;
- LoRA SFT: 4 steps in one go == 2 steps + --resume (adapters bitwise equal), the checkpoints
  hold only adapters, the frozen base is untouched, and the --adapter export loads in `peft`
  with the logits of our merged model;
- LoRA DPO: the reference is the base (adapters off), so the first step's loss is log 2;
- LoRA on 2 ranks at ZeRO stages 0-3 takes the steps of one process, holds the adapters'
  gradients and optimizer state only, and resumes bitwise (stages 2 and 3).
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import LlamaForCausalLM

import generate
import train_my_ddp
from model import convert_to_hf
from model.loading import load_model, model_config_at
from model.lora import LoraConfig, weights_fingerprint
from model.lora_checkpoint import ADAPTERS_FILE, LORA_FILE
from parallel_plan.memory_plan import plan_memory
from tests.train_helpers import records, run_on_two_ranks, train_losses
from tests.trainer.test_train_stream import kill_all, torchrun
from tokenizer import load_tokenizer
from tools import tiny_hf_model
from utils.checkpoint import resolve_checkpoint
from utils.cli_errors import run_main

FINETUNE_ARGS = ["--max_seq_len=32", "--batch_size=2", "--warmup_iters=2", "--eval_iters=1",
                 "--log_interval=1", "--max_new_tokens=3", "--num_threads=1", "--dtype=fp32",
                 "--lr=3e-3", "--min_lr=3e-4", "--tracker=none",
                 '--eval_prompts=["What is 2 + 3?"]']
LORA_ARGS = ["--lora_rank=4", "--lora_alpha=8", "--lora_targets=q_proj,v_proj,down_proj"]


@pytest.fixture(scope="module")
def hf_base(tmp_path_factory, tiny_hf_tokenizer_dir):
    out = tmp_path_factory.mktemp("hf") / "llama3_base"
    tiny_hf_model.main(["--tokenizer_dir", str(tiny_hf_tokenizer_dir), "--style", "llama3",
                        "--out", str(out)])
    return out


def finetune(task, data, out_dir, *extra):
    argv = [*FINETUNE_ARGS, f"--task_type={task}", f"--data_dir={data[task]}",
            f"--out_dir={out_dir}", *extra]
    return run_main(train_my_ddp.main, argv)


def test_sft_uses_the_models_own_tokenizer_and_keeps_a_copy(data, hf_base, tmp_path,
                                                              monkeypatch, capsys):
    run_dir = tmp_path / "sft"
    assert finetune("sft", data, run_dir, f"--init_from={hf_base}", "--max_iters=3") == 0
    own = load_tokenizer(hf_base)
    assert json.loads((run_dir / "config.json").read_text())["tokenizer_dir"] == str(hf_base)
    assert load_tokenizer(run_dir / "tokenizer").fingerprint == own.fingerprint
    saved = json.loads((resolve_checkpoint(run_dir) / "config.json").read_text())
    assert saved["tokenizer_fingerprint"] == own.fingerprint
    assert saved["hf_config"]["rope_parameters"]["rope_type"] == "llama3"  # kept for the export
    # Eval samples stop at the model's own stop ids, rendered with its template.
    assert records(run_dir, "samples")[-1]["samples"][0]["prompt"] == "What is 2 + 3?"

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    generate.main(["--ckpt", str(run_dir), "--prompt", "Hi", "--chat", "--max_new_tokens", "4",
                   "--device", "cpu", "--dtype", "fp32"])
    assert capsys.readouterr().out.strip()


def error_lines(capsys):
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def test_a_tokenizer_that_is_not_the_models_is_refused_up_front(data, hf_base, tmp_path,
                                                                 tiny_hf_tokenizer_dir, capsys):
    run_dir = tmp_path / "refused"
    other = f"--tokenizer_dir={tiny_hf_tokenizer_dir}"
    assert finetune("sft", data, run_dir, f"--init_from={hf_base}", "--max_iters=2",
                    other) == 2
    error = error_lines(capsys)
    assert len(error) == 1 and "is not the one" in error[0], error
    assert not run_dir.exists()

    # On --resume: checked against the run's checkpoint, and nothing of the run is touched.
    assert finetune("sft", data, run_dir, f"--init_from={hf_base}", "--max_iters=1") == 0
    before = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
    capsys.readouterr()
    assert finetune("sft", data, run_dir, "--resume", "--max_iters=2", other) == 2
    error = error_lines(capsys)
    assert len(error) == 1 and "is not the one" in error[0], error
    after = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
    assert after == before


def test_lora_sft_resumes_bitwise_and_exports_a_peft_adapter(data, hf_base, tmp_path):
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    common = [f"--init_from={hf_base}", *LORA_ARGS, "--lora_dropout=0.1", "--max_iters=4",
              "--save_interval=2", "--eval_interval=2"]
    assert finetune("sft", data, whole, *common) == 0
    assert finetune("sft", data, halves, *common, "--stop_at_iter=2") == 0
    assert finetune("sft", data, halves, *common, "--resume") == 0
    assert train_losses(whole) == train_losses(halves)
    assert finetune("sft", data, halves, *common, "--resume", "--lora_rank=8") == 2  # fixed
    final = [run / "ckpt" / "step_000004" for run in (whole, halves)]
    assert (final[0] / ADAPTERS_FILE).read_bytes() == (final[1] / ADAPTERS_FILE).read_bytes()
    assert (final[0] / LORA_FILE).is_file() and not (final[0] / "model.safetensors").exists()
    # Only the adapters train: r x (in + out) per targeted projection (the formula).
    hf = json.loads((hf_base / "config.json").read_text())
    hidden, kv_rows = hf["hidden_size"], hf["num_key_value_heads"] * hf["head_dim"]
    per_layer = 4 * ((hidden + hidden) + (hidden + kv_rows) + (hf["intermediate_size"] + hidden))
    trainable = records(whole, "run")[0]["trainable_params"]
    assert trainable == hf["num_hidden_layers"] * per_layer

    # The base is frozen: the merged model minus the base is the adapters' update only.
    base, _ = load_model(hf_base)
    tuned, _ = load_model(whole)  # merged, as generate.py / serve.py run it
    assert weights_fingerprint(tuned) != weights_fingerprint(base)
    for (name, tuned_param), base_param in zip(tuned.named_parameters(), base.parameters()):
        changed = not torch.equal(tuned_param, base_param)
        assert changed == any(key in name for key in ("qkv_proj", "down_proj")), name

    adapter_dir = tmp_path / "adapter"
    assert run_main(convert_to_hf.main, ["--ckpt", str(whole), "--out", str(adapter_dir),
                                         "--adapter"]) == 0
    peft_model = PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(hf_base),
                                           adapter_dir).eval()
    input_ids = torch.randint(0, tuned.config.vocab_size, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(peft_model(input_ids).logits,
                                   tuned.eval()(input_ids).logits, rtol=1e-5, atol=1e-5)


def test_lora_dpo_uses_the_base_as_reference(data, hf_base, tmp_path):
    run_dir = tmp_path / "dpo"
    assert finetune("dpo", data, run_dir, f"--init_from={hf_base}", *LORA_ARGS,
                    "--max_iters=2", "--eval_interval=2", "--dpo_beta=0.5") == 0
    first = records(run_dir, "train")[0]
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-6)  # policy == base at B = 0
    assert first["rewards/margins"] == pytest.approx(0.0, abs=1e-6)
    assert (resolve_checkpoint(run_dir) / LORA_FILE).is_file()


ZERO_STAGES, RESUMED_STAGES = (0, 1, 2, 3), (2, 3)
CROSS_STAGES = ((0, 3), (2, 0))  # (stopped at, resumed at): a LoRA run changing its ZeRO stage


def test_lora_at_every_zero_stage_trains_like_one_process_and_resumes(data, hf_base, tmp_path):
    """LoRA SFT on 2 ranks (1 sequence each) at ZeRO stages 0-3 takes the steps of one
    process on the same 2-sequence batch as 2 micro-batches (each rank's loss is the mean over
    its own target tokens; so is each micro-batch's), to fp32 rounding: losses, adapters after
    3 steps. (The valid split has 1 sample: rank 1's ZeRO-3 evaluation joins rank 0's gathers
    with an uncounted forward, trainer/evaluation.py.) Only the
    adapters reach gradients, optimizer state and checkpoints: the memory measured after the
    first step is the plan for the adapters (the frozen base a line of its own, whole on every
    rank, also at stage 3), and the optimizer files name adapters only. Stages 2 and 3
    stopped at step 2 and resumed equal the uninterrupted run bitwise; a run stopped at one
    stage and resumed at another (the adapters' optimizer state by name, between ZeRO-0's
    optimizer.pt and ZeRO's shards) equals it to fp32 rounding."""
    common = [*FINETUNE_ARGS, "--task_type=sft", f"--data_dir={data['sft']}",
              f"--init_from={hf_base}", *LORA_ARGS, "--max_iters=3", "--eval_interval=3",
              "--eval_prompts=[]"]
    runs = [[*common, "--batch_size=1", f"--zero_stage={stage}",
             f"--out_dir={tmp_path / f'zero{stage}'}"] for stage in ZERO_STAGES]
    for stage in RESUMED_STAGES:
        cut = [*common, "--batch_size=1", f"--zero_stage={stage}",
               f"--out_dir={tmp_path / f'cut{stage}'}"]
        runs += [[*cut, "--stop_at_iter=2"], [*cut, "--resume"]]
    for saved, resumed in CROSS_STAGES:
        cut = [*common, "--batch_size=1", f"--out_dir={tmp_path / f'cut{saved}to{resumed}'}"]
        runs += [[*cut, f"--zero_stage={saved}", "--stop_at_iter=2"],
                 [*cut, f"--zero_stage={resumed}", "--resume"]]
    assert run_on_two_ranks(*runs) == [0] * len(runs)
    single = tmp_path / "single"
    assert run_main(train_my_ddp.main, [*common, "--batch_size=1",
                                        "--gradient_accumulation_steps=2",
                                        f"--out_dir={single}"]) == 0

    final = Path("ckpt") / "step_000003"
    expected = load_file(single / final / ADAPTERS_FILE)
    lora = LoraConfig(rank=4, alpha=8.0, targets="q_proj,v_proj,down_proj")  # LORA_ARGS
    for stage in ZERO_STAGES:
        run = tmp_path / f"zero{stage}"
        assert train_losses(run) == pytest.approx(train_losses(single), rel=1e-5), stage
        adapters = load_file(run / final / ADAPTERS_FILE)
        assert sorted(adapters) == sorted(expected)
        for name, tensor in expected.items():
            torch.testing.assert_close(adapters[name], tensor, rtol=1e-4, atol=1e-6)
        plan = plan_memory(model_config_at(hf_base), world_size=2, zero_stage=stage,
                           dtype="fp32", batch_size=1, max_seq_len=32, lora=lora)
        (measured,) = records(run, "memory")
        assert {key: measured[key] for key in plan.as_measured()} == plan.as_measured(), stage
        if stage > 0:  # ZeRO's shard files: adapters only
            saved = [torch.load(path, weights_only=True)
                     for path in (run / final / "optim").glob("zero1_rank*.pt")]
            assert {piece["name"] for state in saved for piece in state["pieces"]} == set(
                expected)
    for stage in RESUMED_STAGES:
        full, cut = tmp_path / f"zero{stage}", tmp_path / f"cut{stage}"
        assert train_losses(cut) == train_losses(full)
        assert ((cut / final / ADAPTERS_FILE).read_bytes()
                == (full / final / ADAPTERS_FILE).read_bytes())
        assert [r["step"] for r in records(cut, "resume")] == [2]
    for saved, resumed in CROSS_STAGES:
        full, cut = tmp_path / f"zero{saved}", tmp_path / f"cut{saved}to{resumed}"
        assert [r["step"] for r in records(cut, "resume")] == [2]
        assert train_losses(cut) == pytest.approx(train_losses(full), rel=1e-5)
        adapters = load_file(cut / final / ADAPTERS_FILE)
        for name, tensor in load_file(full / final / ADAPTERS_FILE).items():
            torch.testing.assert_close(adapters[name], tensor, rtol=1e-4, atol=1e-6)


def test_lora_options_out_of_range_are_refused_before_any_work(data, hf_base, tmp_path,
                                                                capsys):
    """A rank above min(in, out) of the smallest targeted projection only costs memory (B A
    cannot have a higher rank); alpha scales every update, so nan, 0 or < 0 is no training."""
    hf = json.loads((hf_base / "config.json").read_text())
    smallest = min(hf["hidden_size"], hf["num_key_value_heads"] * hf["head_dim"])  # v_proj
    run_dir = tmp_path / "refused"
    for bad, named in ((f"--lora_rank={smallest + 1}", f"--lora_rank <= {smallest}"),
                       ("--lora_alpha=nan", "--lora_alpha"), ("--lora_alpha=0", "--lora_alpha"),
                       ("--lora_alpha=-8", "--lora_alpha")):
        assert finetune("sft", data, run_dir, f"--init_from={hf_base}", *LORA_ARGS, bad,
                        "--max_iters=1") == 2, bad
        error = error_lines(capsys)
        assert len(error) == 1 and named in error[0], error
        assert not run_dir.exists()


def test_lora_alpha_without_lora_is_said_to_be_ignored(data, hf_base, tmp_path, capsys):
    with pytest.warns(UserWarning, match="--lora_alpha.* ignored.*--lora_rank=0") as caught:
        assert finetune("sft", data, tmp_path / "full", f"--init_from={hf_base}",
                        "--lora_alpha=32", "--max_iters=1", "--eval_prompts=[]") == 0
    assert len([w for w in caught if "lora" in str(w.message)]) == 1


def test_a_lora_resume_cannot_change_its_base(data, hf_base, tmp_path, capsys):
    """The adapters were trained on the base their checkpoint names: another --init_from on
    --resume is refused in one line, and the run's config still names its own base."""
    run_dir, other_base = tmp_path / "lora", tmp_path / "other_base"
    shutil.copytree(hf_base, other_base)
    common = [*LORA_ARGS, "--eval_prompts=[]"]
    assert finetune("sft", data, run_dir, f"--init_from={hf_base}", *common,
                    "--max_iters=1") == 0
    capsys.readouterr()
    assert finetune("sft", data, run_dir, f"--init_from={other_base}", *common, "--resume",
                    "--max_iters=2") == 2
    error = error_lines(capsys)
    assert len(error) == 1 and "--init_from" in error[0] and "cannot change" in error[0], error
    assert json.loads((run_dir / "config.json").read_text())["init_from"] == str(hf_base)


def _truncate_weights(model_dir: Path) -> str:
    weights = model_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])
    return str(weights)


def _set_config_value(model_dir: Path, field: str, text: str) -> str:
    """config.json with `field`'s value replaced by the JSON text `text` (kept a text edit,
    so that it can also make the file invalid JSON)."""
    config = model_dir / "config.json"
    edited, count = re.subn(rf'"{field}": [^,\n]+', f'"{field}": {text}', config.read_text())
    assert count == 1
    config.write_text(edited)
    return str(config)


@pytest.mark.parametrize("damage, expected", [
    (_truncate_weights, "not a complete safetensors file"),
    (lambda d: _set_config_value(d, "hidden_size", "1e30"),
     r"hidden_size must be a whole number in \[1, 16777216\], got 1e\+30"),
    (lambda d: _set_config_value(d, "num_hidden_layers", '"4"'),
     "num_hidden_layers must be a whole number in .*, got '4'"),
    (lambda d: _set_config_value(d, "rms_norm_eps", "-1"),
     "rms_norm_eps must be a finite number > 0, got -1"),
    (lambda d: _set_config_value(d, "hidden_size", "128 128"),
     r":\d+: invalid JSON: Expecting ',' delimiter"),
])
def test_a_damaged_init_from_model_is_one_line_naming_its_file(data, hf_base, tmp_path, capsys,
                                                               damage, expected):
    """A truncated download, a config value of the wrong type or range, a config that is not
    JSON: refused before any work in one line naming the file (before: a SafetensorError,
    TypeError or bare JSON traceback, on every rank)."""
    damaged = tmp_path / "damaged"
    shutil.copytree(hf_base, damaged)
    named = damage(damaged)
    run_dir = tmp_path / "run"
    assert finetune("sft", data, run_dir, f"--init_from={damaged}", "--max_iters=1") == 2
    error = error_lines(capsys)
    assert len(error) == 1 and error[0].startswith(f"error: {named}"), error
    assert re.search(expected, error[0]), error
    assert not run_dir.exists()


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds torchrun's ranks via /proc")
def test_a_damaged_init_from_model_is_said_once_per_run_not_per_rank(data, hf_base, tmp_path):
    damaged = tmp_path / "damaged"
    shutil.copytree(hf_base, damaged)
    named = _truncate_weights(damaged)
    process = torchrun([*FINETUNE_ARGS, "--task_type=sft", f"--data_dir={data['sft']}",
                        f"--init_from={damaged}", "--max_iters=1"], tmp_path / "run")
    try:
        _, stderr = process.communicate(timeout=300)
    finally:
        kill_all(process)
    errors = [line for line in stderr.decode().splitlines() if line.startswith("error:")]
    assert errors == [f"error: {named}: not a complete safetensors file (Error while "
                      "deserializing header: incomplete metadata, file not fully covered); it "
                      "may be truncated: download or copy it again"], stderr.decode()[-3000:]
    assert not (tmp_path / "run").exists()
