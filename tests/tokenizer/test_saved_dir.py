"""A saved tokenizer directory is data only: stock `AutoTokenizer` loads it offline, without remote
code, from any working directory, in a process that cannot import z2all, with our ids (and the HF
convention for special-token strings); our loader refuses it when its files disagree."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import tokenizers

from data.toy_corpus import multilingual_corpus
from tests.conftest import TINY_VOCAB_SIZE
from tokenizer import load_tokenizer
from tokenizer.train_tokenizer import build_tokenizer
from tokenizer.z2all_tokenizer import with_special_tokens

SAMPLES = ["Hello, world!", "你好，世界。", "def f(x):\n\treturn x ** 2", "12345 😀 ",
           "say <|im_end|> now"]

FRESH_PROCESS = """
import json, sys
from transformers import AutoTokenizer
try:
    import tokenizer  # z2all's package must not be needed (nor importable) here
    sys.exit("z2all's tokenizer package is importable: the test proves nothing")
except ImportError:
    pass
samples = json.loads(sys.argv[1])
report = []
for directory in sys.argv[2:]:
    tok = AutoTokenizer.from_pretrained(directory)  # no trust_remote_code
    report.append({"class": type(tok).__module__.split(".")[0],
                   "ids": [tok.encode(text) for text in samples],
                   "specials": [tok.convert_tokens_to_ids(t)
                                for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")],
                   "eos_pad": [tok.eos_token_id, tok.pad_token_id],
                   "decoded": [tok.decode(tok.encode(text)) for text in samples],
                   "length": len(tok)})
print(json.dumps(report))
"""


def test_fresh_process_offline_other_cwd_gives_same_ids(tiny_hf_tokenizer_dir,
                                                        tiny_sp_tokenizer_dir, tmp_path):
    saved_dirs = [tiny_hf_tokenizer_dir, tiny_sp_tokenizer_dir]
    moved_dirs = [tmp_path / "elsewhere" / f"my tokenizer {i}" for i in range(2)]  # with a space
    for saved, moved in zip(saved_dirs, moved_dirs):
        shutil.copytree(saved, moved)
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf_home"))  # empty module cache
    result = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS, json.dumps(SAMPLES), *map(str, moved_dirs)],
        cwd=workdir, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    fresh_reports = json.loads(result.stdout.strip().splitlines()[-1])

    for saved, fresh in zip(saved_dirs, fresh_reports):
        in_memory = load_tokenizer(saved)
        vocab_size = len(in_memory)
        ours = [in_memory.encode(text) for text in SAMPLES]
        # HF's convention: a special-token string in text is the special id; ours: text.
        im_end = vocab_size - 1
        pieces = SAMPLES[-1].split("<|im_end|>")
        hf_last = [*in_memory.encode(pieces[0]), im_end, *in_memory.encode(pieces[1])]
        assert fresh["class"] == "transformers"
        assert fresh["ids"] == [*ours[:-1], hf_last]
        assert fresh["decoded"] == SAMPLES
        assert fresh["specials"] == [vocab_size - 3, vocab_size - 2, vocab_size - 1]
        assert fresh["eos_pad"] == [vocab_size - 3] * 2
        assert fresh["length"] == vocab_size


@pytest.mark.parametrize("kind", ["hf", "sp"])
def test_a_loaded_tokenizer_saves_again_identically(kind, request, tmp_path):
    loaded = load_tokenizer(request.getfixturevalue(f"tiny_{kind}_tokenizer_dir"))
    loaded.save_pretrained(tmp_path / "again")
    again = load_tokenizer(tmp_path / "again")
    assert again.fingerprint == loaded.fingerprint
    assert [again.encode(text) for text in SAMPLES] == [loaded.encode(text) for text in SAMPLES]


def test_inconsistent_directory_is_refused(tiny_hf_tokenizer_dir, tiny_sp_tokenizer_dir,
                                           tmp_path):
    shifted = tmp_path / "shifted"
    shutil.copytree(tiny_hf_tokenizer_dir, shifted)
    config = json.loads((shifted / "tokenizer_config.json").read_text())
    config["z2all"]["special_token_ids"]["<|im_end|>"] += 1
    (shifted / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="special_token_ids"):
        load_tokenizer(shifted)

    other = build_tokenizer("sp", multilingual_corpus(seed=1), TINY_VOCAB_SIZE, tmp_path / "other",
                            show_progress=False)
    swapped = tmp_path / "swapped"  # the tokenizer.json of another tokenizer of the same kind
    shutil.copytree(tiny_sp_tokenizer_dir, swapped)
    shutil.copy(tmp_path / "other" / "tokenizer.json", swapped / "tokenizer.json")
    assert other.fingerprint != load_tokenizer(tiny_sp_tokenizer_dir).fingerprint
    with pytest.raises(ValueError, match="fingerprint"):
        load_tokenizer(swapped)


def test_a_base_vocabulary_spelling_a_special_token_is_refused():
    clashing = tokenizers.Tokenizer(tokenizers.models.WordLevel(
        {"a": 0, "<|im_end|>": 1}, unk_token="a"))
    with pytest.raises(ValueError, match="contains the special token"):
        with_special_tokens(clashing)


def test_a_tokenizer_json_with_other_added_tokens_is_refused(tiny_hf_tokenizer_dir, tmp_path):
    extended = tmp_path / "extended"
    shutil.copytree(tiny_hf_tokenizer_dir, extended)
    backend = tokenizers.Tokenizer.from_file(str(extended / "tokenizer.json"))
    backend.add_tokens(["<tool>"])
    backend.save(str(extended / "tokenizer.json"))
    with pytest.raises(ValueError, match="must add exactly"):
        load_tokenizer(extended)


def test_a_directory_without_our_files_is_refused_with_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.train_tokenizer"):
        load_tokenizer(tmp_path)
