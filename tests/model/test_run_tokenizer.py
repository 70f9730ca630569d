"""A model owns its tokenizer (model/run_tokenizer.py), and an HF Llama-3-style directory with
its own tokenizer and template goes through SFT steps, a run directory, generate.py and the
export, checked against transformers at each step."""

from __future__ import annotations

import json
import random

import pytest
import torch
from transformers import AutoTokenizer, LlamaForCausalLM

import generate
from model.convert_to_hf import main as convert_main
from model.loading import load_model
from model.run_tokenizer import (
    check_tokenizer_matches,
    default_tokenizer_dir,
    model_tokenizer,
    save_run_tokenizer,
)
from tests.model.hf_llama_dirs import random_hf_dir
from tests.model.model_helpers import small_model
from tests.pretrained_helpers import make_pretrained_tokenizer_dir, random_conversation
from tokenizer import load_tokenizer
from utils.checkpoint import save_checkpoint
from utils.cli_errors import run_main
from utils.conversation import build_generation_prompt, render_conversation, stop_ids
from utils.labels import IGNORE_INDEX
from utils.run_directory import RUN_MARKER


@pytest.fixture(scope="module")
def llama3_tokenizer_dir(tiny_hf_tokenizer_dir, tmp_path_factory):
    return make_pretrained_tokenizer_dir(
        tiny_hf_tokenizer_dir, tmp_path_factory.mktemp("tok") / "llama3", "llama3")


@pytest.fixture()
def hf_llama3_dir(tmp_path, llama3_tokenizer_dir):
    """A random Llama-3-style model (RoPE scaling, GQA) holding its own tokenizer files."""
    hf_model, directory = random_hf_dir(tmp_path, "llama3", vocab_size=520)
    for path in llama3_tokenizer_dir.iterdir():
        (directory / path.name).write_bytes(path.read_bytes())
    return hf_model, directory


def test_saved_run_tokenizer_is_the_same_tokenizer(tmp_path, tiny_hf_tokenizer_dir,
                                                   llama3_tokenizer_dir):
    for source in (tiny_hf_tokenizer_dir, llama3_tokenizer_dir):
        copy = save_run_tokenizer(load_tokenizer(source), tmp_path / source.name)
        original, saved = load_tokenizer(source), load_tokenizer(copy)
        assert type(saved) is type(original) and saved.fingerprint == original.fingerprint
        messages = random_conversation(random.Random(0))
        assert render_conversation(saved, messages) == render_conversation(original, messages)
        assert stop_ids(saved) == stop_ids(original)
        # transformers reads the copy as it reads the source
        reference = AutoTokenizer.from_pretrained(source).apply_chat_template(messages)
        assert AutoTokenizer.from_pretrained(copy).apply_chat_template(messages) == reference


def test_resaving_the_same_tokenizer_leaves_the_copy_other_ranks_read(
        tmp_path, tiny_hf_tokenizer_dir, llama3_tokenizer_dir):
    """A resumed run's rank 0 saves the tokenizer while the other ranks load the run's copy: the
    same tokenizer leaves every file as it was (a rewrite once removed it under a reader); a
    different one replaces it whole, leaving no staging folder behind."""
    run = tmp_path / "run"
    run.mkdir()
    (run / RUN_MARKER).touch()
    copy = save_run_tokenizer(load_tokenizer(tiny_hf_tokenizer_dir), run)
    before = {path.name: path.stat().st_ino for path in copy.iterdir()}
    save_run_tokenizer(load_tokenizer(tiny_hf_tokenizer_dir), run)
    assert {path.name: path.stat().st_ino for path in copy.iterdir()} == before
    save_run_tokenizer(load_tokenizer(llama3_tokenizer_dir), run)
    assert load_tokenizer(copy).fingerprint == load_tokenizer(llama3_tokenizer_dir).fingerprint
    assert sorted(path.name for path in run.iterdir()) == sorted([RUN_MARKER, "tokenizer"])


@pytest.mark.parametrize("foreign", ["my_tok.py", "notes/todo.txt", "vocab.txt"])
def test_a_run_tokenizer_holding_what_no_save_writes_is_never_replaced(
        tmp_path, tiny_hf_tokenizer_dir, llama3_tokenizer_dir, foreign):
    """Was: any tokenizer/ in a marked run was replaced whole, the user's files with it."""
    run = tmp_path / "run"
    run.mkdir()
    (run / RUN_MARKER).touch()
    copy = save_run_tokenizer(load_tokenizer(tiny_hf_tokenizer_dir), run)
    (copy / foreign).parent.mkdir(exist_ok=True)
    (copy / foreign).write_text("mine\n")
    before = {path: path.read_bytes() for path in run.rglob("*") if path.is_file()}
    with pytest.raises(ValueError, match=f"tokenizer/{foreign.split('/')[0]} is not a tokenizer"):
        save_run_tokenizer(load_tokenizer(llama3_tokenizer_dir), run)
    assert {path: path.read_bytes() for path in run.rglob("*") if path.is_file()} == before
    assert sorted(path.name for path in run.iterdir()) == sorted([RUN_MARKER, "tokenizer"])


def test_run_dir_tokenizer_found_from_any_directory_and_others_refused(
        tmp_path, monkeypatch, tiny_hf_tokenizer_dir, tiny_sp_tokenizer_dir):
    model = small_model("gqa", vocab_size=512,
                        tokenizer_fingerprint=load_tokenizer(tiny_hf_tokenizer_dir).fingerprint)
    step_dir = save_checkpoint(tmp_path / "run" / "ckpt", 3, model.save_pretrained)
    save_run_tokenizer(load_tokenizer(tiny_hf_tokenizer_dir), tmp_path / "run")
    monkeypatch.chdir(tmp_path / "run" / "ckpt")  # anywhere but where the run started
    for ckpt in (tmp_path / "run", step_dir):
        tokenizer = model_tokenizer(ckpt, model.config, load_model(ckpt)[1])
        assert tokenizer.fingerprint == model.config.tokenizer_fingerprint
    # Same size, other tokenizer (the loss-11 case): refused in one line.
    with pytest.raises(ValueError, match="fingerprint") as error:
        model_tokenizer(step_dir, model.config, step_dir, tiny_sp_tokenizer_dir)
    assert "\n" not in str(error.value)
    # The same through a tool's command line: exit code 2, one error line.
    assert run_main(generate.main, ["--ckpt", str(tmp_path / "run"), "--prompt", "hi",
                                    "--tokenizer_dir", str(tiny_sp_tokenizer_dir)]) == 2


def test_older_run_falls_back_to_its_recorded_relative_path(tmp_path, monkeypatch,
                                                            tiny_hf_tokenizer_dir):
    """A run from before tokenizer copies records tokenizer_dir relative to where it started
    (the run's grandparent for out/<run>): found from any working directory."""
    root = tmp_path / "project"
    (root / "tok").mkdir(parents=True)
    for path in tiny_hf_tokenizer_dir.iterdir():
        (root / "tok" / path.name).write_bytes(path.read_bytes())
    model = small_model("gqa", vocab_size=512)
    step_dir = save_checkpoint(root / "out" / "run" / "ckpt", 1, model.save_pretrained)
    (root / "out" / "run" / "config.json").write_text(json.dumps({"tokenizer_dir": "tok"}))
    monkeypatch.chdir(tmp_path)
    found = default_tokenizer_dir(root / "out" / "run", step_dir)
    assert found == (root / "tok").absolute()


def test_vocabulary_larger_than_the_embedding_is_refused(tiny_hf_tokenizer_dir):
    model = small_model("gqa", vocab_size=256)  # the tokenizer has 512 ids
    with pytest.raises(ValueError, match="512 tokens"):
        check_tokenizer_matches(model.config, load_tokenizer(tiny_hf_tokenizer_dir), "model")


def test_hf_dir_uses_its_own_tokenizer_and_refuses_another(hf_llama3_dir, capsys,
                                                           tiny_hf_tokenizer_dir):
    hf_model, hf_dir = hf_llama3_dir
    # generate.py --chat on the HF dir: the model's template, BOS and stop ids, and the
    # greedy reply of transformers' own generate on apply_chat_template's prompt.
    generate.main(["--ckpt", str(hf_dir), "--dtype", "fp32", "--prompt", "hello", "--chat",
                   "--temperature", "0", "--max_new_tokens", "6"])
    printed = capsys.readouterr().out
    hf_tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    prompt = hf_tokenizer.apply_chat_template([{"role": "user", "content": "hello"}],
                                              add_generation_prompt=True, return_dict=False)
    ours = load_tokenizer(hf_dir)
    assert build_generation_prompt(ours, [{"role": "user", "content": "hello"}]) == prompt
    output = hf_model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False,
                               eos_token_id=stop_ids(ours), pad_token_id=ours.pad_token_id)
    reply = [i for i in output[0, len(prompt):].tolist() if i not in stop_ids(ours)]
    assert printed == ours.decode(reply) + "\n"
    assert run_main(generate.main, ["--ckpt", str(hf_dir), "--prompt", "hi",
                                    "--tokenizer_dir", str(tiny_hf_tokenizer_dir)]) == 2
    assert "fingerprint" in capsys.readouterr().err


def test_sft_steps_then_export_match_transformers(hf_llama3_dir, tmp_path):
    """The trainer's path in miniature: load the HF dir, a few SFT steps on template-rendered
    conversations (loss on the assistant mask), a run dir with checkpoint and tokenizer copy,
    export with the defaults: stock LlamaForCausalLM gives our logits, the config.json is the
    source's, and AutoTokenizer renders with the source's template."""
    _, hf_dir = hf_llama3_dir
    model, _ = load_model(hf_dir)
    tokenizer = load_tokenizer(hf_dir)
    model.config.tokenizer_fingerprint = tokenizer.fingerprint
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rng = random.Random(5)
    for _ in range(3):
        ids, mask = render_conversation(tokenizer, random_conversation(rng))
        labels = [token if trained else IGNORE_INDEX for token, trained in zip(ids[1:], mask[1:])]
        loss = model(torch.tensor([ids[:-1]]), labels=torch.tensor([labels])).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    run = tmp_path / "run"
    save_checkpoint(run / "ckpt", 3, model.save_pretrained)
    save_run_tokenizer(tokenizer, run)
    convert_main(["--ckpt", str(run), "--out", str(tmp_path / "export")])
    exported = LlamaForCausalLM.from_pretrained(tmp_path / "export").eval()
    input_ids = torch.randint(0, 300, (2, 90))
    with torch.no_grad():
        assert (exported(input_ids).logits - model.eval()(input_ids).logits).abs().max() <= 1e-5
        assert (exported.model.embed_tokens.weight
                - LlamaForCausalLM.from_pretrained(hf_dir).model.embed_tokens.weight
                ).abs().max() > 0  # the steps did change the weights
    source_config = json.loads((hf_dir / "config.json").read_text())
    assert json.loads((tmp_path / "export" / "config.json").read_text()) == source_config
    messages = random_conversation(rng)
    assert (AutoTokenizer.from_pretrained(tmp_path / "export").apply_chat_template(messages)
            == AutoTokenizer.from_pretrained(hf_dir).apply_chat_template(messages))
