"""HF Llama-family directories in and out: our logits = transformers' for Llama-2, Llama-3
(RoPE scaling), linear scaling, tied embeddings (SmolLM-style), an explicit head_dim and MQA;
the export writes the source config.json back unchanged; what we cannot represent is refused
in one line naming the field."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from model import convert_to_hf
from model.convert_to_hf import export_hf
from model.loading import load_model
from tests.model.hf_llama_dirs import HF_VOCAB as VOCAB
from tests.model.hf_llama_dirs import VARIANTS, random_hf_dir
from utils.cli_errors import run_main

TOLERANCE = 1e-5
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_load_and_export_match_hf(variant, tmp_path):
    # A 100 kB shard limit makes transformers write several shards and an index.
    hf_model, hf_dir = random_hf_dir(tmp_path, variant, max_shard_size="100KB")
    assert (hf_dir / "model.safetensors.index.json").is_file()
    model, model_dir = load_model(hf_dir)
    assert model_dir == hf_dir and model.config.vocab_size == VOCAB
    input_ids = torch.randint(0, VOCAB, (2, 150))  # beyond the llama3 original length 64
    export_hf(model, tmp_path / "export")
    exported = LlamaForCausalLM.from_pretrained(tmp_path / "export").eval()
    with torch.no_grad():
        reference = hf_model(input_ids).logits
        assert (model.eval()(input_ids).logits - reference).abs().max() <= TOLERANCE
        assert (exported(input_ids).logits - reference).abs().max() <= TOLERANCE
    source = json.loads((hf_dir / "config.json").read_text())
    assert json.loads((tmp_path / "export" / "config.json").read_text()) == source


def test_rope_scaling_changes_the_model(tmp_path):
    """The scaled variants would pass the parity test vacuously if scaling did nothing."""
    scaled, _ = random_hf_dir(tmp_path, "llama3")
    plain_config = scaled.config.to_dict()
    plain_config["rope_parameters"] = {"rope_type": "default", "rope_theta": 100.0}
    plain = LlamaForCausalLM(LlamaConfig(**plain_config)).eval()
    plain.load_state_dict(scaled.state_dict())
    input_ids = torch.randint(0, VOCAB, (1, 150))
    with torch.no_grad():
        assert (plain(input_ids).logits - scaled(input_ids).logits).abs().max() > 1e-3


@pytest.mark.parametrize("field, value", [
    ("attention_bias", True), ("mlp_bias", True), ("sliding_window", 4096),
    ("hidden_act", "gelu"), ("model_type", "mistral"),
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}),
])
def test_unrepresentable_fields_are_refused_in_one_line(field, value, tmp_path):
    _, hf_dir = random_hf_dir(tmp_path, "llama2")
    config = json.loads((hf_dir / "config.json").read_text())
    config[field] = value
    (hf_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=field) as error:
        load_model(hf_dir)
    assert "\n" not in str(error.value)


def test_only_the_files_transformers_reads_are_loaded(tmp_path, capsys):
    """A stray `model_backup.safetensors` (another model's weights) beside `model.safetensors`
    is ignored, as transformers ignores it; a directory where transformers and an index would
    disagree, or with weights under neither name, is refused in one line."""
    hf_model, hf_dir = random_hf_dir(tmp_path, "llama2", seed=0)
    _, other_dir = random_hf_dir(tmp_path / "other", "llama2", seed=1)
    shutil.copy(other_dir / "model.safetensors", hf_dir / "model_backup.safetensors")
    model, _ = load_model(hf_dir)
    input_ids = torch.randint(0, VOCAB, (1, 20))
    with torch.no_grad():
        assert (model.eval()(input_ids).logits
                - hf_model(input_ids).logits).abs().max() <= TOLERANCE

    _, sharded_dir = random_hf_dir(tmp_path / "sharded", "llama2", max_shard_size="100KB")
    shutil.copy(other_dir / "model.safetensors", sharded_dir / "model.safetensors")
    (hf_dir / "model.safetensors").rename(hf_dir / "weights.safetensors")
    capsys.readouterr()  # transformers' progress bars
    for directory, reason in ((sharded_dir, "both"), (hf_dir, "neither")):
        assert run_main(convert_to_hf.main, ["--ckpt", str(directory),
                                             "--out", str(tmp_path / "out")]) == 2
        error = capsys.readouterr().err
        assert error.count("\n") == 1 and "model.safetensors.index.json" in error, error
        assert reason in error
    assert not (tmp_path / "out").exists()
