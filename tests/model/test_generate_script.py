"""generate.py end to end: run dir -> checkpoint + recorded tokenizer -> streamed text."""

from __future__ import annotations

import json

import pytest
import torch

import generate
from tests.model.model_helpers import small_model
from tokenizer import load_tokenizer
from utils.checkpoint import save_checkpoint


@pytest.fixture
def run_dir(tmp_path, tiny_hf_tokenizer_dir):
    """A run dir as the trainer leaves it: config.json naming the tokenizer + a checkpoint."""
    tokenizer = load_tokenizer(tiny_hf_tokenizer_dir)
    model = small_model("gqa", vocab_size=len(tokenizer)).eval()
    run = tmp_path / "run"
    save_checkpoint(run / "ckpt", 3, model.save_pretrained)
    (run / "config.json").write_text(json.dumps({"tokenizer_dir": str(tiny_hf_tokenizer_dir)}))
    return run, model, tokenizer


def test_plain_prompt_streams_the_greedy_continuation(run_dir, capsys):
    run, model, tokenizer = run_dir
    generate.main(["--ckpt", str(run), "--dtype", "fp32",
                   "--prompt", "the cat", "--temperature", "0",
                   "--max_new_tokens", "12"])
    prompt = tokenizer.encode("the cat")  # no BOS: the text's own ids
    stop = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")]
    expected = model.generate(torch.tensor([prompt]), 12, eos_token_id=stop)
    new_ids = [i for i in expected[0, len(prompt):].tolist() if i not in stop]
    assert capsys.readouterr().out == "the cat" + tokenizer.decode(new_ids) + "\n"


def test_chat_prompt_uses_the_template(run_dir, capsys):
    from utils.conversation import build_generation_prompt

    run, model, tokenizer = run_dir
    generate.main(["--ckpt", str(run), "--dtype", "fp32",
                   "--chat", "--prompt", "hi", "--temperature", "0",
                   "--max_new_tokens", "8", "--system", "be brief"])
    prompt = build_generation_prompt(tokenizer, [{"role": "user", "content": "hi"}],
                                     system="be brief")
    stop = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")]
    expected = model.generate(torch.tensor([prompt]), 8, eos_token_id=stop)
    new_ids = [i for i in expected[0, len(prompt):].tolist() if i not in stop]
    assert capsys.readouterr().out == tokenizer.decode(new_ids) + "\n"


def test_streaming_never_prints_half_a_character(tiny_hf_tokenizer_dir, capsys):
    tokenizer = load_tokenizer(tiny_hf_tokenizer_dir)
    text = "naïve 你好 🙂 ok"
    ids = tokenizer.encode(text)
    assert len(ids) > len(text.split())  # multi-byte characters span several tokens here
    generate.print_streaming(tokenizer, iter(ids), stop=[tokenizer.eos_token_id])
    printed = capsys.readouterr().out
    assert printed == text + "\n" and "\ufffd" not in printed
