"""`model.loading.load_model`, the one resolver behind every `--ckpt`: a checkpoint named
directly is verified like one found in a run dir, so a damaged one is refused by every tool."""

from __future__ import annotations

import json

import pytest
import torch

import generate
from model import convert_to_hf
from model.loading import load_model
from tests.model.model_helpers import small_model
from tokenizer import load_tokenizer
from utils.checkpoint import CheckpointError, save_checkpoint
from utils.cli_errors import run_main


@pytest.fixture()
def run_dir(tmp_path, tiny_hf_tokenizer_dir):
    model = small_model("gqa", seed=5, vocab_size=len(load_tokenizer(tiny_hf_tokenizer_dir)))
    step_dir = save_checkpoint(tmp_path / "run" / "ckpt", 3, model.save_pretrained)
    (tmp_path / "run" / "config.json").write_text(json.dumps(
        {"tokenizer_dir": str(tiny_hf_tokenizer_dir)}))
    return tmp_path / "run", step_dir, model


def flip_one_byte(path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_every_kind_of_path_loads_the_same_weights(run_dir, tmp_path):
    run, step_dir, model = run_dir
    model.save_pretrained(tmp_path / "bare")  # a save_pretrained dir: nothing to verify
    for path in (run, run / "ckpt", step_dir, tmp_path / "bare"):
        loaded, _ = load_model(path)
        for (name, expected), got in zip(model.state_dict().items(),
                                         loaded.state_dict().values()):
            assert torch.equal(expected, got), (path, name)


def test_a_damaged_checkpoint_named_directly_is_refused_by_every_tool(run_dir, tmp_path,
                                                                      capsys):
    run, step_dir, _ = run_dir
    flip_one_byte(step_dir / "model.safetensors")
    with pytest.raises(CheckpointError, match="not usable"):
        load_model(step_dir)
    assert run_main(generate.main, ["--ckpt", str(step_dir), "--prompt", "hi",
                                    "--max_new_tokens", "2", "--dtype", "fp32"]) == 2
    assert run_main(convert_to_hf.main, ["--ckpt", str(step_dir),
                                         "--out", str(tmp_path / "hf")]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 2 and all(line.startswith("error: ") and "not usable" in line
                                    for line in errors)
    assert not (tmp_path / "hf").exists()


def test_a_run_checkpoint_without_its_manifest_is_refused_not_loaded_bare(
        run_dir, tmp_path, tiny_hf_tokenizer_dir, capsys):
    """Removing manifest.json must not turn ckpt/step_N (or ckpt/best) into a trusted
    `save_pretrained` dir; a bare save outside a run still loads (the reference)."""
    run, _, model = run_dir
    scored = save_checkpoint(run / "ckpt", 5, model.save_pretrained, val_loss=1.5)
    assert (run / "ckpt" / "best").resolve() == scored
    (scored / "manifest.json").unlink()
    for path in (scored, run / "ckpt" / "best"):
        with pytest.raises(CheckpointError, match="no manifest.json"):
            load_model(path)
        assert run_main(generate.main, ["--ckpt", str(path), "--prompt", "hi",
                                        "--max_new_tokens", "2", "--dtype", "fp32"]) == 2
        assert "no manifest.json" in capsys.readouterr().err
    assert run_main(convert_to_hf.main, ["--ckpt", str(scored),
                                         "--out", str(tmp_path / "hf")]) == 2
    assert not (tmp_path / "hf").exists()
    model.save_pretrained(tmp_path / "bare")
    loaded, _ = load_model(tmp_path / "bare")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 loaded.state_dict().values()))
