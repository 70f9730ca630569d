"""Models by Hugging Face Hub id, from a local HF cache the test builds (HF_HUB_OFFLINE=1):
the trainer's --init_from (written with spaces), generate.py / convert_to_hf / tools.evaluate
--ckpt; the run records the id and snapshot, --resume refuses another snapshot; a local
directory of the same spelling wins; an id that is not there is one line, exit 2."""

from __future__ import annotations

import json

import pytest

import generate
import train_my_ddp
from model import convert_to_hf
from tests.hf_cache_helpers import use_offline_hf_cache
from tests.pretrained_helpers import put_in_hf_cache
from tools import evaluate, tiny_hf_model
from utils.cli_errors import run_main
from utils.hub import local_dir

REPO_ID, FIRST, SECOND = "tiny-org/tiny-llama", "a" * 40, "b" * 40
ARGS = ["--max_seq_len", "32", "--batch_size", "2", "--warmup_iters", "1", "--eval_iters", "1",
        "--max_new_tokens", "2", "--num_threads", "1", "--dtype", "fp32", "--tracker", "none",
        "--eval_prompts", '["Hi"]', "--task_type", "sft"]


@pytest.fixture
def hub_cache(tmp_path_factory, tiny_hf_tokenizer_dir, monkeypatch):
    """A cache holding REPO_ID at FIRST (refs/main); offline, as if downloaded earlier."""
    base = tmp_path_factory.mktemp("hf") / "base"
    tiny_hf_model.main(["--tokenizer_dir", str(tiny_hf_tokenizer_dir), "--out", str(base)])
    cache = use_offline_hf_cache(tmp_path_factory.mktemp("hf_home"), monkeypatch)
    put_in_hf_cache(base, cache, REPO_ID, FIRST)
    return cache, base


def test_finetune_from_a_hub_id_records_it_and_resume_keeps_its_snapshot(hub_cache, data,
                                                                           tmp_path, capsys):
    cache, base = hub_cache
    run = tmp_path / "run"
    common = [*ARGS, "--data_dir", str(data["sft"]), "--out_dir", str(run)]
    assert run_main(train_my_ddp.main, [*common, "--init_from", REPO_ID, "--max_iters", "2",
                                        "--stop_at_iter", "1"]) == 0
    config = json.loads((run / "config.json").read_text())
    snapshot = cache / f"models--tiny-org--tiny-llama/snapshots/{FIRST}"
    assert config["init_from"] == config["tokenizer_dir"] == str(snapshot)
    assert config["resolved"]["hub"]["init_from"] == {"id": REPO_ID, "snapshot": FIRST}

    put_in_hf_cache(base, cache, REPO_ID, SECOND)  # main moved on since the run started
    capsys.readouterr()
    assert run_main(train_my_ddp.main, [*common, "--resume", "--init_from", REPO_ID,
                                        "--max_iters", "2"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and f"snapshot {SECOND}, but the run started from" in error
    assert run_main(train_my_ddp.main, [*common, "--resume", "--init_from", REPO_ID,
                                        "--revision", FIRST, "--max_iters", "2"]) == 0


def test_model_tools_take_a_hub_id(hub_cache, tmp_path, capsys):
    generate.main(["--ckpt", REPO_ID, "--prompt", "Hi", "--max_new_tokens", "3",
                   "--device", "cpu", "--dtype", "fp32"])
    assert capsys.readouterr().out.strip()
    out = tmp_path / "exported"
    assert run_main(convert_to_hf.main, ["--ckpt", REPO_ID, "--out", str(out)]) == 0
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    capsys.readouterr()
    assert run_main(evaluate.main, ["--ckpt", REPO_ID, "--lm_eval", "x"]) == 2
    assert "give --report_dir DIR" in capsys.readouterr().err


def test_a_missing_id_is_one_line_and_a_local_dir_wins(hub_cache, tmp_path, monkeypatch,
                                                       capsys):
    assert run_main(train_my_ddp.main, ["--init_from", "nobody/nothing", "--task_type",
                                        "sft", "--out_dir", str(tmp_path / "r")]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: --init_from nobody/nothing: no such directory, and no "
                            "Hugging Face model 'nobody/nothing' in the HF cache "
                            "(HF_HUB_OFFLINE=1)") and error.count("\n") == 1
    assert not (tmp_path / "r").exists()
    monkeypatch.chdir(tmp_path)
    (tmp_path / REPO_ID).mkdir(parents=True)
    assert local_dir(REPO_ID, "--ckpt") == REPO_ID


def test_a_lora_adapter_of_a_hub_base_names_its_id_and_loads_by_it(hub_cache, data, tmp_path):
    """The exported peft adapter says `base_model_name_or_path: org/name` and the snapshot as
    `revision`: peft's AutoPeftModelForCausalLM loads the base by id from the cache, and the
    adapted logits equal the merged export's."""
    import torch
    from peft import AutoPeftModelForCausalLM
    from transformers import LlamaForCausalLM

    run = tmp_path / "lora_run"
    assert run_main(train_my_ddp.main, [*ARGS, "--data_dir", str(data["sft"]), "--out_dir",
                                        str(run), "--init_from", REPO_ID, "--lora_rank", "4",
                                        "--max_iters", "2"]) == 0
    adapter, merged = tmp_path / "adapter", tmp_path / "merged"
    assert run_main(convert_to_hf.main, ["--ckpt", str(run), "--out", str(adapter),
                                         "--adapter"]) == 0
    assert run_main(convert_to_hf.main, ["--ckpt", str(run), "--out", str(merged)]) == 0
    adapter_config = json.loads((adapter / "adapter_config.json").read_text())
    assert (adapter_config["base_model_name_or_path"], adapter_config["revision"]) == (
        REPO_ID, FIRST)
    input_ids = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        adapted = AutoPeftModelForCausalLM.from_pretrained(adapter)(input_ids).logits
        expected = LlamaForCausalLM.from_pretrained(merged)(input_ids).logits
    torch.testing.assert_close(adapted, expected, rtol=1e-5, atol=1e-5)
