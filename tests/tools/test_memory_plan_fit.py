"""`python -m tools.memory_plan --init_from <dir|Hub id> --device_memory 80GB`: the plan of a
model named as the trainer names it (read from its config.json alone; a Hub id from the local HF
cache, nothing downloaded), whether it fits the device, and which options would make it fit."""

from __future__ import annotations

import json
import re

import huggingface_hub
import pytest

from tests.pretrained_helpers import put_in_hf_cache
from tools import memory_plan

# Llama-3.2-1B's shapes (its published config.json, less the token ids): 1.24B parameters.
LLAMA_1B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
            "intermediate_size": 8192, "num_attention_heads": 32, "num_hidden_layers": 16,
            "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": True,
            "rope_scaling": {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192, "rope_type": "llama3"},
            "torch_dtype": "bfloat16", "vocab_size": 128256}
SMALL_RUN = ["--batch_size", "4", "--max_seq_len", "512"]
COMMIT = "1b" + "0" * 38


@pytest.fixture
def llama_dirs(tmp_path, monkeypatch):
    """{"dir": an HF dir holding only config.json, "id": the same as a Hub id in a local HF
    cache}; HF_HUB_OFFLINE is unset, so only the tool's own rule keeps it from downloading."""
    directory = tmp_path / "llama-1b"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(LLAMA_1B))
    cache = tmp_path / "hf" / "hub"
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    put_in_hf_cache(directory, cache, "meta-llama/Llama-3.2-1B", COMMIT)
    return {"dir": str(directory), "id": "meta-llama/Llama-3.2-1B"}


@pytest.mark.parametrize("model, argv, expected", [
    ("dir", ["--device_memory", "24GB"],
     [r"does not fit: \S+ GiB planned of 24.00 GiB device memory; options that cut memory:",
      r"--activation_checkpointing +-> +\S+ GiB  still too big",
      r"--lora_rank 8 +-> +\S+ GiB  fits", r"--zero_stage 3 --world_size 8 +-> +\S+ GiB  fits"]),
    ("id", ["--device-memory=24GiB"], [r"^model meta-llama/Llama-3.2-1B,", r"does not fit"]),
    ("dir", ["--device_memory", "80GB"], [r"^fits: \S+ GiB planned of 80.00 GiB"]),
    ("dir", ["--device_memory", "7.5GB", "--lora_rank", "8"],
     [r"fits, but tight: .*; options that cut memory:", r"--activation_checkpointing"]),
    ("dir", ["--device_memory", "12GB", "--max_seq_len", "4096"],
     [r"does not fit", r"together: --activation_checkpointing --lora_rank 8 -> \S+ GiB  fits"]),
], ids=["dir-too-big", "hub-id", "fits", "tight", "only-together"])
def test_the_plan_says_whether_it_fits_and_what_to_change(llama_dirs, model, argv, expected,
                                                          capsys):
    assert memory_plan.main(["--init_from", llama_dirs[model], *SMALL_RUN, *argv]) == 0
    out = capsys.readouterr().out
    assert " = 1,235,814,400" in out  # Llama-3.2-1B's parameters, from config.json alone
    for pattern in expected:
        assert any(re.search(pattern, line) for line in out.splitlines()), \
            (pattern, out)


def test_a_hub_id_not_in_the_cache_is_refused_without_downloading(llama_dirs):
    with pytest.raises(ValueError, match=r"--init_from org/absent: .*nothing is downloaded"):
        memory_plan.main(["--init_from", "org/absent", "--device_memory", "80GB"])


@pytest.mark.parametrize("size, expected", [("80GB", 80 * 2**30), ("80GiB", 80 * 2**30),
                                            ("141g", 141 * 2**30), ("512MB", 512 * 2**20),
                                            ("1e9", 10**9)])
def test_device_sizes_count_as_gpu_makers_do(size, expected):
    assert memory_plan.memory_size(size) == expected
