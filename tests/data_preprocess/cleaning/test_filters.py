"""Each Gopher rule's keep/drop against datatrove's GopherQualityFilter and
GopherRepetitionFilter on the same few hundred documents (Shakespeare scenes + junk)."""

from __future__ import annotations

import inspect
import random
import re

import pytest

from data.dirty_corpus import junk, shakespeare_scenes
from data_preprocess.cleaning import filters
from data_preprocess.cleaning.text import split_words

datatrove_quality = pytest.importorskip("datatrove.pipeline.filters.gopher_quality_filter")
datatrove_repetition = pytest.importorskip("datatrove.pipeline.filters.gopher_repetition_filter")
from datatrove.data import Document  # noqa: E402 - only after the skip


@pytest.fixture(scope="module")
def documents() -> list[str]:
    rng = random.Random(0)
    return shakespeare_scenes(150) + [junk(rng) for _ in range(250)]


def datatrove_keeps(datatrove_filter, texts: list[str]) -> list[bool]:
    return [datatrove_filter.filter(Document(text=text, id=str(i))) is True
            for i, text in enumerate(texts)]


def our_keeps(group: str, texts: list[str]) -> list[bool]:
    return [filters.first_failure(text, [group], filters.FilterOptions()) is None
            for text in texts]


@pytest.mark.parametrize(("group", "module", "name"), [
    ("gopher_quality", datatrove_quality, "GopherQualityFilter"),
    ("gopher_repetition", datatrove_repetition, "GopherRepetitionFilter")])
def test_rules_agree_with_datatrove_given_the_same_words(documents, monkeypatch, group, module,
                                                         name):
    """Same word tokens on both sides: every document's keep/drop must be identical."""
    monkeypatch.setattr(module, "split_into_words", lambda text, language=None: split_words(text))
    theirs = datatrove_keeps(getattr(module, name)(), documents)
    ours = our_keeps(group, documents)
    differing = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    assert not differing, [(i, ours[i], documents[i][:200]) for i in differing[:5]]
    assert 0.1 < sum(ours) / len(ours) < 0.9  # the corpus exercises both outcomes


def test_with_datatrove_own_tokenizer_only_per_word_ratios_differ(documents):
    """datatrove cuts English words with spaCy, where every comma and full stop is a word of
    its own. Rules that do not divide by the word count must still agree on every document;
    the per-word ratios (letters, '#', '...') may differ, and then it is datatrove that drops:
    verse, rich in punctuation, falls under its 80%-of-words-have-a-letter line."""
    pytest.importorskip("spacy")
    per_word = {"gopher_below_alpha_threshold", "gopher_too_many_hashes",
                "gopher_too_many_ellipsis"}
    quality = datatrove_quality.GopherQualityFilter()
    for i, text in enumerate(documents):
        ours = filters.first_failure(text, ["gopher_quality"], filters.FilterOptions())
        theirs = quality.filter(Document(text=text, id=str(i)))
        if (ours is None) != (theirs is True):
            reasons = {theirs[1] if theirs is not True else None,
                       "gopher_too_many_hashes" if ours and ours[0] == "too_many_hashes" else None}
            assert reasons & per_word, (i, ours, theirs, text[:200])
    repetition = datatrove_repetition.GopherRepetitionFilter()
    theirs = datatrove_keeps(repetition, documents)
    ours = our_keeps("gopher_repetition", documents)
    differing = sum(a != b for a, b in zip(ours, theirs))
    assert differing <= 0.03 * len(documents), differing


def test_each_rule_fires_on_the_junk_built_for_it():
    options = filters.FilterOptions()
    cases = {"too_few_words": "the king and the crown",
             "too_many_hashes": " ".join(["#the of and king"] * 30),
             "mostly_bullet_lines": "\n".join(["- the king of the land and the crown"] * 20),
             "duplicate_lines": "\n".join(["the king of the land"] * 3 + ["x y"] * 2),
             "top_2gram_chars": "ha ha " * 40}
    for rule, text in cases.items():
        failed = filters.first_failure(text, ["gopher_repetition"] if "dup" in rule or "top" in
                                       rule else ["gopher_quality"], options)
        assert failed is not None and failed[0] == rule, (rule, failed)


def test_bad_ngram_list_is_one_clear_error():
    with pytest.raises(ValueError, match="n:fraction"):
        filters.duplicate_ngram_limits(filters.FilterOptions(max_duplicate_ngram_chars="5=0.1"))


def test_every_rule_has_a_threshold_and_datatroves_real_name_for_it():
    """The report's datatrove column: each name is a reason their Gopher filters give
    (n-gram sizes compared as N: theirs are f-strings, "top_{n}_gram")."""
    def sized(name: str) -> str:
        return re.sub(r"\{n\}|<n>|\d+", "N", name)

    theirs = inspect.getsource(datatrove_quality) + inspect.getsource(datatrove_repetition)
    reasons = {sized(reason) for reason in re.findall(r'return False, f?"([^"]+)"', theirs)}
    details = filters.rule_details(filters.FilterOptions())
    assert set(details) == {rule.__name__ for group in filters.RULE_GROUPS.values()
                            for rule in group}
    for rule, detail in details.items():
        assert all(sized(name) in reasons for name in detail["datatrove"].split(" / ")), rule
        assert "(--" in detail["threshold"], rule
