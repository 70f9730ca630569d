"""`train_tokenizer --out` replaces only what it wrote itself: an earlier tokenizer dir, never
a directory of other files, the corpus, or a directory holding the corpus."""

from __future__ import annotations

import json

import pytest

from data.toy_corpus import multilingual_corpus
from tokenizer import load_tokenizer
from tokenizer.train_tokenizer import main


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus"
    path.mkdir()
    documents = multilingual_corpus(num_documents=40, seed=5)
    (path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in documents))
    return path


def train(corpus, out) -> list[str]:
    return ["--type", "hf", "--input", str(corpus), "--vocab_size", "300", "--out", str(out)]


def snapshot(directory) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("out_of", [
    lambda tmp, corpus: tmp / "notes",     # a directory of someone's files
    lambda tmp, corpus: corpus,            # the corpus itself
    lambda tmp, corpus: corpus / "tok",    # inside the corpus (it would be read as input)
    lambda tmp, corpus: tmp,               # a directory holding the corpus
], ids=["foreign_dir", "equal_to_input", "inside_input", "holds_input"])
def test_out_never_deletes_what_is_not_a_tokenizer(out_of, tmp_path, corpus):
    (tmp_path / "notes" / "sub").mkdir(parents=True)
    (tmp_path / "notes" / "notes.txt").write_text("precious")
    before = snapshot(tmp_path)
    with pytest.raises(ValueError, match="--out"):
        main(train(corpus, out_of(tmp_path, corpus)))
    assert snapshot(tmp_path) == before
    assert (tmp_path / "notes" / "sub").is_dir()


def test_out_may_replace_an_earlier_tokenizer_or_fill_an_empty_dir(tmp_path, corpus):
    out = tmp_path / "tok"
    out.mkdir()  # empty: fine
    main(train(corpus, out))
    first = load_tokenizer(out).fingerprint
    main([*train(corpus, out)[:-3], "400", "--out", str(out)])  # an earlier tokenizer: replaced
    replaced = load_tokenizer(out)
    assert len(replaced) == 400 and replaced.fingerprint != first
