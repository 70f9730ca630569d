"""TextStream (server/text_stream.py): the deltas add up to the decoded text cut before the
first stop string (Python's str.find as the reference), never send half a character, and
never send the beginning of a stop string that then completes."""

from __future__ import annotations

import random

import pytest

from server.text_stream import TextStream
from tokenizer import load_tokenizer

TEXTS = ["naïve 你好 🙂 END ok", "the model reads text\nEND", "no stop here 😀😀", "ENENDD",
         "a <|im_end|> b", "stop at the very end"]


@pytest.fixture(scope="module")
def tokenizer(tiny_hf_tokenizer_dir):
    return load_tokenizer(tiny_hf_tokenizer_dir)


def expected_text(text: str, stops: list[str]) -> tuple[str, bool]:
    found = [text.find(stop) for stop in stops if stop in text]
    return (text[:min(found)], True) if found else (text, False)


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("stops", [[], ["END"], ["EN", "😀"], ["end", "\n"], ["<|im_end|>"]])
def test_deltas_add_up_to_the_text_cut_at_the_first_stop(tokenizer, text, stops):
    stream = TextStream(tokenizer, stops)
    deltas = []
    for token in tokenizer.encode(text):
        deltas.append(stream.push(token))
        sent = "".join(deltas)
        assert "\ufffd" not in sent
        assert not any(stop in sent for stop in stops)
        if stream.stopped:
            break
    deltas.append(stream.finish())
    assert ("".join(deltas), stream.stopped) == expected_text(text, stops)


def test_random_texts_and_stops(tokenizer):
    rng = random.Random(0)
    alphabet = "ab 你🙂\n"
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 20)))
        stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 3)))
                 for _ in range(rng.randint(0, 2))]
        stream = TextStream(tokenizer, stops)
        deltas = [stream.push(token) for token in tokenizer.encode(text)]
        deltas.append(stream.finish())
        assert ("".join(deltas), stream.stopped) == expected_text(text, stops), (text, stops)
