"""generate.py end to end: run dir -> checkpoint + recorded tokenizer -> streamed text."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import generate
from data.toy_corpus import multilingual_corpus
from tests.model.model_helpers import small_model
from tokenizer import load_tokenizer
from tokenizer.train_tokenizer import build_tokenizer
from utils.checkpoint import save_checkpoint

REPO = Path(__file__).resolve().parents[2]


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


def test_the_kernel_log_line_is_not_glued_into_the_output(run_dir):
    """The model's kernel line goes to stderr, and before the output starts: stdout and
    stderr together (`2>&1`, a terminal) show it on its own line, and the text on its own."""
    run, model, tokenizer = run_dir
    merged = subprocess.run(
        [sys.executable, "generate.py", "--ckpt", str(run), "--dtype", "fp32", "--prompt",
         "the cat", "--temperature", "0", "--max_new_tokens", "6"], cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=True).stdout
    prompt = tokenizer.encode("the cat")
    stop = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")]
    expected = model.generate(torch.tensor([prompt]), 6, eos_token_id=stop)
    new_ids = [i for i in expected[0, len(prompt):].tolist() if i not in stop]
    lines = merged.splitlines()
    assert "the cat" + tokenizer.decode(new_ids) in lines, merged
    assert any(line.startswith("model.modeling_z2all: model kernels on cpu") for line in lines)


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


@pytest.fixture(scope="module")
def padded_run(tmp_path_factory):
    """A 500-token tokenizer, so the model's vocabulary is padded to 512; the 12 padding rows
    are scaled up so that their logits would win if they were not masked."""

    root = tmp_path_factory.mktemp("padded")
    tokenizer = build_tokenizer("hf", iter(multilingual_corpus()), 500, root / "tok",
                                show_progress=False)
    model = small_model("gqa", vocab_size=len(tokenizer)).eval()
    assert model.config.vocab_size == 512
    with torch.no_grad():
        model.lm_head.weight[500:] *= 50
    save_checkpoint(root / "run" / "ckpt", 1, model.save_pretrained)
    (root / "run" / "config.json").write_text(json.dumps({"tokenizer_dir": str(root / "tok")}))
    return root / "run", model, tokenizer


@pytest.mark.parametrize("temperature", ["0", "1e-40"])  # 1e-40: greedy, not NaN
def test_padded_vocabulary_ids_are_never_printed(padded_run, temperature, capsys):
    run, model, tokenizer = padded_run
    generate.main(["--ckpt", str(run), "--dtype", "fp32", "--prompt", "the cat",
                   "--temperature", temperature, "--max_new_tokens", "10"])
    prompt = torch.tensor([tokenizer.encode("the cat")])
    assert (model.generate(prompt, 10)[0, prompt.shape[1]:] >= 500).any()  # unmasked: padding
    expected = model.generate(prompt, 10, real_vocab_size=500)[0, prompt.shape[1]:].tolist()
    stop = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")]
    expected = expected[:min([expected.index(s) for s in stop if s in expected], default=10)]
    assert capsys.readouterr().out == "the cat" + tokenizer.decode(expected) + "\n"


def test_sampling_for_many_seeds_stays_in_the_vocabulary(padded_run, capsys):
    run, _, tokenizer = padded_run
    for seed in range(3):
        generate.main(["--ckpt", str(run), "--dtype", "fp32", "--prompt", "a",
                       "--temperature", "1", "--max_new_tokens", "40", f"--seed={seed}"])
    assert capsys.readouterr().out.count("\n") >= 3  # every run printed to its end


def test_max_new_tokens_past_the_context_is_refused(run_dir):
    run, _, tokenizer = run_dir
    size = len(tokenizer.encode("the cat"))
    with pytest.raises(ValueError, match=f"--max_new_tokens 100: the prompt has {size} tokens and"
                                         f" the model's context is 64, so at most {64 - size} new"):
        generate.main(["--ckpt", str(run), "--dtype", "fp32", "--prompt", "the cat",
                       "--max_new_tokens", "100"])
