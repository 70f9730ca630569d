"""The sentencepiece kind encodes in bulk through sentencepiece itself (its saved
`sentencepiece.model`), with exactly the ids of its tokenizer.json; a directory without that file
still loads and encodes through tokenizer.json; a damaged or foreign model file is refused in
one line. (Speed is measured by `python -m bench.bench_tokenizer`, never asserted here.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from data.toy_corpus import multilingual_corpus
from data_preprocess import pretokenize_pretrain_data as pretokenize_module
from tokenizer import load_tokenizer
from tokenizer.train_tokenizer import build_tokenizer
from tokenizer.z2all_tokenizer import SENTENCEPIECE_FILE
from utils.cli_errors import run_main

# Everything the two paths could disagree on: scripts, characters no piece covers (byte
# fallback), whitespace runs, special-token strings as text, sentencepiece's own markers.
VARIED_TEXTS = {
    "latin": "The quick brown fox jumps over the lazy dog.",
    "chinese": "你好，世界。我们的模型在训练数据上学习。",
    "japanese+korean": "日本語のテキスト と 한국어 문장",
    "rare scripts (bytes)": "ऋग्वेद ⵜⴰⵎⴰⵣⵉⵖⵜ ꯃꯩꯇꯩ 𓀀",
    "emoji": "emoji 😀🚀👩‍👩‍👧 and 🇫🇷 flags",
    "whitespace runs": "  a   b\t\t c\n\n\n    d \r\n\u00a0\u3000end  ",
    "code": "def f(x):\n    return x ** 2  # 12345\n",
    "digits": "2024-11-29 3.14159 1,000,000",
    "special strings": "<|im_start|>user\nhi<|im_end|><|endoftext|> <|im_end",
    "sentencepiece markers": "<unk><s></s><0x41> a▁b ▁▁c",
    "combining marks": "e\u0301 a\u0308 \u200b\ufeff",
    "empty": "",
}


@pytest.fixture(scope="module")
def without_model_file(tiny_sp_tokenizer_dir, tmp_path_factory) -> Path:
    """The same tokenizer saved before the .model was used: tokenizer.json + config only."""
    directory = tmp_path_factory.mktemp("old") / "tiny_sp_without_model"
    shutil.copytree(tiny_sp_tokenizer_dir, directory)
    (directory / SENTENCEPIECE_FILE).unlink()
    return directory


def test_sentencepiece_kind_encodes_through_the_library(tiny_sp_tokenizer_dir,
                                                        tiny_hf_tokenizer_dir,
                                                        without_model_file):
    assert load_tokenizer(tiny_sp_tokenizer_dir).native_sentencepiece is not None
    assert load_tokenizer(tiny_hf_tokenizer_dir).native_sentencepiece is None
    old = load_tokenizer(without_model_file)
    assert old.native_sentencepiece is None  # loads and works, through tokenizer.json
    assert old.fingerprint == load_tokenizer(tiny_sp_tokenizer_dir).fingerprint


@pytest.mark.parametrize("name", VARIED_TEXTS)
def test_both_paths_give_the_same_ids(tiny_sp_tokenizer_dir, without_model_file, name):
    native, through_json = load_tokenizer(tiny_sp_tokenizer_dir), load_tokenizer(without_model_file)
    text = VARIED_TEXTS[name]
    ids = native.encode_batch([text])[0]
    assert ids == through_json.encode_batch([text])[0] == native.encode(text)
    assert not set(ids) & set(native.special_token_ids.values())


def test_both_paths_give_the_same_ids_on_a_corpus(tiny_sp_tokenizer_dir, without_model_file):
    texts = multilingual_corpus(num_documents=300, seed=1) + list(VARIED_TEXTS.values())
    native, through_json = load_tokenizer(tiny_sp_tokenizer_dir), load_tokenizer(without_model_file)
    assert native.encode_batch(texts) == through_json.encode_batch(texts)


def test_pretokenized_tokens_are_the_same_on_both_paths(tmp_path, tiny_sp_tokenizer_dir,
                                                        without_model_file):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "part.jsonl").write_text("".join(
        json.dumps({"text": text}, ensure_ascii=False) + "\n"
        for text in [*VARIED_TEXTS.values(), *multilingual_corpus(num_documents=40, seed=2)]))
    tokens = {}
    for name, directory in (("native", tiny_sp_tokenizer_dir), ("json", without_model_file)):
        out = tmp_path / f"out_{name}"
        assert run_main(pretokenize_module.main, ["--data_dir", str(data_dir), "--out_dir",
                                                  str(out), "--tokenizer_dir", str(directory),
                                                  "--num_workers", "0"]) == 0
        tokens[name] = (out / "part.bin").read_bytes()
    assert tokens["native"] == tokens["json"]
    assert np.frombuffer(tokens["native"], dtype=np.uint16).size > 1000


def _foreign_model(tmp_path: Path) -> bytes:
    """Another sentencepiece tokenizer's model (a larger vocabulary, other ids)."""
    build_tokenizer("sp", iter(multilingual_corpus(num_documents=300)), 600, tmp_path / "other",
                    show_progress=False)
    return (tmp_path / "other" / SENTENCEPIECE_FILE).read_bytes()


@pytest.mark.parametrize("case, expected", [
    ("damaged", "sentencepiece.model cannot be read"),
    ("foreign", "sentencepiece.model is not the model tokenizer.json was converted from"),
    ("beside byte-level", "sentencepiece.model found beside a byte_level_bpe tokenizer"),
])
def test_a_bad_model_file_is_refused_in_one_line(tmp_path, capsys, tiny_sp_tokenizer_dir,
                                                 tiny_hf_tokenizer_dir, case, expected):
    source = tiny_hf_tokenizer_dir if case == "beside byte-level" else tiny_sp_tokenizer_dir
    directory = tmp_path / "tokenizer"
    shutil.copytree(source, directory)
    model = {"damaged": lambda: b"\x0a\x05not a sentencepiece model",
             "foreign": lambda: _foreign_model(tmp_path),
             "beside byte-level": lambda: (tiny_sp_tokenizer_dir / SENTENCEPIECE_FILE).read_bytes()}
    (directory / SENTENCEPIECE_FILE).write_bytes(model[case]())
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "part.jsonl").write_text('{"text": "hello"}\n')
    capsys.readouterr()
    code = run_main(pretokenize_module.main, ["--data_dir", str(tmp_path / "data"),
                                              "--tokenizer_dir", str(directory),
                                              "--num_workers", "0"])
    error = capsys.readouterr().err
    assert code == 2
    assert error.startswith(f"error: {directory}: {expected}") and error.count("\n") == 1, error
    assert not (tmp_path / "data_pretok").exists()
