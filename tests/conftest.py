"""Shared pytest fixtures: tiny trained tokenizers (vocabulary 512), built once per session.

`tiny_hf_tokenizer_dir` / `tiny_sp_tokenizer_dir` are saved directories, loadable with
`tokenizer.load_tokenizer(dir)`; they are trained in about a second on
`data.toy_corpus.multilingual_corpus()`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from data.toy_corpus import multilingual_corpus

TINY_VOCAB_SIZE = 512


def _build_tiny(kind: str, out: Path) -> Path:
    from tokenizer.train_tokenizer import build_tokenizer

    build_tokenizer(kind, iter(multilingual_corpus()), TINY_VOCAB_SIZE, out,
                    training={"corpus": "data/toy_corpus.py:multilingual_corpus"},
                    show_progress=False)
    return out


@pytest.fixture(scope="session")
def tiny_hf_tokenizer_dir(tmp_path_factory) -> Path:
    return _build_tiny("hf", tmp_path_factory.mktemp("tokenizers") / "tiny_hf")


@pytest.fixture(scope="session")
def tiny_sp_tokenizer_dir(tmp_path_factory) -> Path:
    return _build_tiny("sp", tmp_path_factory.mktemp("tokenizers") / "tiny_sp")
