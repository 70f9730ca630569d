"""`train_tokenizer --out` replaces only what it wrote itself: an earlier z2all tokenizer dir
(through a symlink: its target), never a directory of other files, the corpus, a directory
holding the corpus, another library's tokenizer, or a run's tokenizer copy."""

from __future__ import annotations

import json

import pytest

from data.toy_corpus import multilingual_corpus
from tokenizer import load_tokenizer
from tokenizer.train_tokenizer import main
from utils.cli_errors import run_main


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


def a_run_with_its_tokenizer_copy(tmp, corpus):
    """A z2all run dir (its marker) holding the copy of the tokenizer it trained with."""
    run = tmp / "run"
    main(train(corpus, run / "tokenizer"))
    (run / "z2all_run.json").write_text('{"format": "z2all run directory", "version": 1}')
    return run / "tokenizer"


def another_libraries_tokenizer(tmp, corpus):
    """Only the file names a tokenizer dir has, but not written by z2all (no z2all record)."""
    out = tmp / "hf_tok"
    out.mkdir()
    (out / "tokenizer.json").write_text('{"model": {}}')
    (out / "tokenizer_config.json").write_text('{"tokenizer_class": "GPT2Tokenizer"}')
    return out


@pytest.mark.parametrize("setup, named", [
    (a_run_with_its_tokenizer_copy, "inside the z2all run directory"),
    (another_libraries_tokenizer, "is not a z2all tokenizer dir"),
])
def test_out_refuses_what_only_looks_like_its_own(setup, named, tmp_path, corpus, capsys):
    out = setup(tmp_path, corpus)
    capsys.readouterr()
    before = snapshot(tmp_path)
    assert run_main(main, train(corpus, out)) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith(f"error: --out {out} ") and named in error
    assert snapshot(tmp_path) == before


def test_out_through_a_symlink_replaces_its_target_and_keeps_the_link(tmp_path, corpus):
    """Before: the link itself was moved aside, then rmtree refused it (an OSError, exit 1)."""
    target = tmp_path / "tokenizers" / "v1"
    main(train(corpus, target))
    link = tmp_path / "current"
    link.symlink_to(target, target_is_directory=True)
    first = load_tokenizer(link).fingerprint
    assert run_main(main, [*train(corpus, link)[:-3], "400", "--out", str(link)]) == 0
    assert link.is_symlink() and link.resolve() == target.resolve()
    assert load_tokenizer(target).fingerprint != first and len(load_tokenizer(link)) == 400
    assert sorted(p.name for p in (tmp_path / "tokenizers").iterdir()) == ["v1"]
