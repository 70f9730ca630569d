"""A LoRA checkpoint (model/lora_checkpoint.py) through `load_model` and `model.convert_to_hf`:
the merged export and the peft adapter export (loaded by peft itself) give the logits of the
live LoRA model; reloading is bitwise; a changed base is refused."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from peft import PeftModel
from transformers import LlamaForCausalLM

import generate
from model import convert_to_hf
from model.convert_to_hf import export_hf
from model.loading import load_lora_checkpoint, load_model, lora_base_reference
from model.lora import LoraConfig, apply_lora, lora_state_dict
from model.lora_checkpoint import save_lora_checkpoint
from model.run_tokenizer import save_run_tokenizer
from tests.model.model_helpers import small_model
from tokenizer import load_tokenizer
from tools.tiny_hf_model import write_pretrained_tokenizer
from utils.checkpoint import CheckpointError, save_checkpoint
from utils.cli_errors import run_main

LORA = LoraConfig(rank=4, alpha=8.0, dropout=0.1, targets="q_proj,v_proj,o_proj,up_proj,down_proj")


def make_lora_run(tmp_path, base_kind: str, tokenizer_dir=None, **model_overrides):
    """A base saved as an HF dir or as a z2all checkpoint, and a run whose checkpoint holds
    trained-looking adapters (random A and B) on it. With `tokenizer_dir` the HF base gets a
    ChatML tokenizer made from it, and the run a copy, as the trainer keeps one."""
    base = small_model("gqa", seed=3, **model_overrides)
    if base_kind == "hf":
        export_hf(base, tmp_path / "base")
        base_path = tmp_path / "base"
        if tokenizer_dir is not None:
            write_pretrained_tokenizer(tokenizer_dir, base_path, "chatml")
    else:
        base_path = save_checkpoint(tmp_path / "base_run" / "ckpt", 7, base.save_pretrained)
    model, model_dir = load_model(base_path)
    reference = lora_base_reference(model, model_dir)
    apply_lora(model, LORA)
    torch.manual_seed(11)
    with torch.no_grad():
        for param in lora_state_dict(model).values():
            param.normal_(0, 0.05)
    save_checkpoint(tmp_path / "run" / "ckpt", 20, lambda tmp_dir: save_lora_checkpoint(
        model, LORA, reference, tmp_dir))
    if tokenizer_dir is not None:
        save_run_tokenizer(load_tokenizer(base_path), tmp_path / "run")
    return model.eval(), base_path, tmp_path / "run"


def hf_logits(model, input_ids):
    with torch.no_grad():
        return model.eval()(input_ids).logits


@pytest.mark.parametrize("base_kind", ["hf", "z2all"])
def test_merged_and_peft_adapter_exports_give_the_lora_models_logits(tmp_path, base_kind,
                                                                      tiny_hf_tokenizer_dir):
    vocab_size = len(load_tokenizer(tiny_hf_tokenizer_dir))
    lora_model, base_path, run = make_lora_run(tmp_path, base_kind, vocab_size=vocab_size)
    tokenizer = ["--tokenizer_dir", str(tiny_hf_tokenizer_dir)]  # the run recorded none
    input_ids = torch.randint(0, vocab_size, (2, 10))
    expected = hf_logits(lora_model, input_ids)

    merged, _ = load_model(run)  # what generate.py / serve.py run
    torch.testing.assert_close(hf_logits(merged, input_ids), expected, rtol=1e-5, atol=1e-5)

    assert run_main(convert_to_hf.main, ["--ckpt", str(run), "--out",
                                         str(tmp_path / "merged"), *tokenizer]) == 0
    merged_hf = LlamaForCausalLM.from_pretrained(tmp_path / "merged")
    merged_logits = hf_logits(merged_hf, input_ids)
    torch.testing.assert_close(merged_logits, expected, rtol=1e-5, atol=1e-5)

    assert run_main(convert_to_hf.main, ["--ckpt", str(run), "--out", str(tmp_path / "adapter"),
                                         "--adapter", *tokenizer]) == 0
    adapter_config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    base_dir = adapter_config["base_model_name_or_path"]
    expected_base = tmp_path / ("base" if base_kind == "hf" else "adapter/base_model")
    assert base_dir == str(expected_base.resolve())
    peft_model = PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(base_dir),
                                           tmp_path / "adapter")
    torch.testing.assert_close(hf_logits(peft_model, input_ids), merged_logits,
                               rtol=1e-5, atol=1e-5)
    with peft_model.disable_adapter():  # and the base under the adapter is the base
        base_model, _ = load_model(base_path)
        torch.testing.assert_close(hf_logits(peft_model, input_ids),
                                   hf_logits(base_model, input_ids), rtol=1e-5, atol=1e-5)


def test_reloading_a_lora_checkpoint_is_bitwise(tmp_path):
    lora_model, _, run = make_lora_run(tmp_path, "z2all")
    reloaded, config, base = load_lora_checkpoint(next((run / "ckpt").glob("step_*")))
    assert config == LORA
    assert base["path"].endswith("step_000007")
    for (name, saved), (reloaded_name, value) in zip(lora_model.state_dict().items(),
                                                     reloaded.state_dict().items()):
        assert name == reloaded_name and torch.equal(saved, value)
    assert [n for n, p in reloaded.named_parameters() if p.requires_grad] \
        == [n for n, p in lora_model.named_parameters() if p.requires_grad]


def test_changed_base_and_adapter_export_of_a_full_model_are_refused(tmp_path, capsys):
    _, base_path, run = make_lora_run(tmp_path, "hf")
    changed = small_model("gqa", seed=4)
    export_hf(changed, base_path)
    assert run_main(convert_to_hf.main, ["--ckpt", str(run), "--out",
                                         str(tmp_path / "merged")]) == 2
    assert run_main(convert_to_hf.main, ["--ckpt", str(base_path), "--out",
                                         str(tmp_path / "adapter"), "--adapter"]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 2
    assert "has changed since the LoRA run" in errors[0]
    assert "--adapter" in errors[1] and "not a LoRA checkpoint" in errors[1]
    assert not (tmp_path / "merged").exists() and not (tmp_path / "adapter").exists()


def test_generate_runs_a_lora_run_as_its_merged_export(tmp_path, tiny_hf_tokenizer_dir, capsys):
    tokenizer_dir = str(tiny_hf_tokenizer_dir)
    _, _, run = make_lora_run(tmp_path, "hf",
                              vocab_size=len(load_tokenizer(tiny_hf_tokenizer_dir)))
    assert run_main(convert_to_hf.main, ["--ckpt", str(run), "--out", str(tmp_path / "merged"),
                                         "--tokenizer_dir", tokenizer_dir]) == 0
    capsys.readouterr()
    outputs = []
    for ckpt in (run, tmp_path / "merged"):
        assert run_main(generate.main, ["--ckpt", str(ckpt), "--tokenizer_dir", tokenizer_dir,
                                        "--prompt", "the cat", "--max_new_tokens", "12",
                                        "--temperature", "0", "--dtype", "fp32"]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0].strip() and outputs[0] == outputs[1]


def test_an_export_never_writes_into_its_source_its_base_or_a_foreign_directory(
        tmp_path, tiny_hf_tokenizer_dir, capsys):
    _, base_path, run = make_lora_run(tmp_path, "hf",
                                      vocab_size=len(load_tokenizer(tiny_hf_tokenizer_dir)))
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "todo.txt").write_text("keep me")
    before = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    step_dir = next((run / "ckpt").glob("step_*"))
    for out, reason in ((base_path, "LoRA base"), (run, "source"), (step_dir, "source"),
                        (step_dir / "hf", "source"), (foreign, "not an empty directory")):
        assert run_main(convert_to_hf.main, ["--ckpt", str(run), "--out", str(out), "--adapter",
                                             "--tokenizer_dir", str(tiny_hf_tokenizer_dir)]) == 2
        error = capsys.readouterr().err
        assert error.count("\n") == 1 and "--out" in error and reason in error, error
    assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == before


def set_base_field(base_path, change: str, tokenizer_dir) -> None:
    """Edit the HF base in place: its tokenizer, or one config.json field (rope_theta is
    written twice by transformers 5.x: top level and inside rope_parameters)."""
    if change == "tokenizer":
        write_pretrained_tokenizer(tokenizer_dir, base_path, "zephyr")
        return
    config = json.loads((base_path / "config.json").read_text())
    config[change] *= 10
    if change == "rope_theta":
        config["rope_parameters"]["rope_theta"] *= 10
    (base_path / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("change", ["rope_theta", "rms_norm_eps", "tokenizer"])
def test_a_base_whose_config_or_tokenizer_changed_is_refused(tmp_path, change,
                                                              tiny_hf_tokenizer_dir, capsys):
    """Same weights, another model: the weights fingerprint alone would let these through."""
    _, base_path, run = make_lora_run(tmp_path, "hf", tiny_hf_tokenizer_dir, vocab_size=512)
    set_base_field(base_path, change, tiny_hf_tokenizer_dir)
    assert run_main(convert_to_hf.main, ["--ckpt", str(run), "--out",
                                         str(tmp_path / "merged")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "has changed since the LoRA run" in error, error
    assert change in error
    assert not (tmp_path / "merged").exists()


def test_a_version_1_lora_checkpoint_still_loads_with_its_weights_verified(tmp_path):
    """Written before the base's config and tokenizer were recorded: weights still checked."""
    lora_model, base_path, run = make_lora_run(tmp_path, "hf")
    step_dir = next((run / "ckpt").glob("step_*"))
    record = json.loads((step_dir / "lora.json").read_text())
    record["version"] = 1
    record["base"] = {key: record["base"][key] for key in ("path", "fingerprint")}

    def save_old(tmp_dir):
        save_lora_checkpoint(lora_model, LORA, record["base"], tmp_dir)
        (tmp_dir / "lora.json").write_text(json.dumps(record))
    old = save_checkpoint(tmp_path / "old_run" / "ckpt", 20, save_old)
    with pytest.warns(UserWarning, match="records only its base's weights"):
        merged, _ = load_model(old)
    input_ids = torch.randint(0, 64, (1, 8))
    torch.testing.assert_close(hf_logits(merged, input_ids), hf_logits(lora_model, input_ids))
    export_hf(small_model("gqa", seed=4), base_path)
    with pytest.raises(CheckpointError, match="weights fingerprint"):
        load_model(old)


@pytest.mark.parametrize("base_kind", ["hf", "z2all"])
def test_base_path_relative_lets_adapter_and_base_move_together(tmp_path, base_kind,
                                                                tiny_hf_tokenizer_dir):
    vocab_size = len(load_tokenizer(tiny_hf_tokenizer_dir))
    lora_model, _, run = make_lora_run(tmp_path / "work", base_kind, vocab_size=vocab_size)
    assert run_main(convert_to_hf.main, [
        "--ckpt", str(run), "--out", str(tmp_path / "work" / "adapter"), "--adapter",
        "--base_path_relative", "--tokenizer_dir", str(tiny_hf_tokenizer_dir)]) == 0
    shutil.move(tmp_path / "work", tmp_path / "moved")  # the base travels with the adapter
    adapter_dir = tmp_path / "moved" / "adapter"
    relative = json.loads((adapter_dir / "adapter_config.json").read_text()
                          )["base_model_name_or_path"]
    assert relative == ("../base" if base_kind == "hf" else "base_model")
    peft_model = PeftModel.from_pretrained(
        LlamaForCausalLM.from_pretrained(adapter_dir / relative), adapter_dir)
    input_ids = torch.randint(0, vocab_size, (2, 10))
    torch.testing.assert_close(hf_logits(peft_model, input_ids), hf_logits(lora_model, input_ids),
                               rtol=1e-5, atol=1e-5)
    assert run_main(convert_to_hf.main, ["--ckpt", str(tmp_path / "moved" / "run"), "--out",
                                         str(tmp_path / "merged"), "--base_path_relative"]) == 2
