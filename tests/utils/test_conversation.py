"""ChatML rendering and loss masks (utils/conversation.py) and record shapes (chat_records.py)."""

from __future__ import annotations

import random

import pytest

from data_preprocess.chat_records import RecordFormatError, dpo_messages, sft_messages
from tokenizer import load_tokenizer
from utils.conversation import build_generation_prompt, render_conversation, render_conversations

PIECES = ["hello", "数据", "😀", " ", "\n", "<|im_end|>", "<|im_start|>assistant\n",
          "<|endoftext|>", "x = 1", "naïve", "?"]


def random_content(rng: random.Random) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 12)))


def random_conversation(rng: random.Random) -> list[dict]:
    messages = [{"role": "system", "content": random_content(rng)}] if rng.random() < 0.5 else []
    for _ in range(rng.randint(1, 4)):
        messages += [{"role": "user", "content": random_content(rng)},
                     {"role": "assistant", "content": random_content(rng)}]
    return messages


def chatml_text(messages: list[dict]) -> str:
    """The template as plain text, written independently of the code under test."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def trained_spans(ids: list[int], mask: list[int]) -> list[list[int]]:
    spans, current = [], []
    for token, flag in zip(ids, mask):
        if flag:
            current.append(token)
        elif current:
            spans.append(current)
            current = []
    return spans + ([current] if current else [])


@pytest.fixture(params=["tiny_hf_tokenizer_dir", "tiny_sp_tokenizer_dir"])
def tokenizer(request):
    return load_tokenizer(request.getfixturevalue(request.param))


def test_mask_covers_exactly_the_assistant_replies(tokenizer):
    rng = random.Random()
    start, end = (tokenizer.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>"))
    conversations = [random_conversation(rng) for _ in range(20)]
    rendered = render_conversations(tokenizer, conversations)
    for messages, (ids, mask) in zip(conversations, rendered):
        assert len(ids) == len(mask)
        assert tokenizer.decode(ids) == chatml_text(messages)
        # Special ids only where the template put them, whatever the users typed.
        assert ids.count(start) == ids.count(end) == len(messages)
        replies = [m["content"] for m in messages if m["role"] == "assistant"]
        spans = trained_spans(ids, mask)
        assert len(spans) == len(replies)
        for span, reply in zip(spans, replies):
            assert span[-1] == end  # the model learns to stop
            # The reply's tokens, plus at most the header's "\n" where it merged with a
            # reply that starts with a line break.
            text = tokenizer.decode(span[:-1])
            assert text in (reply, "\n" + reply)
            if text == reply:  # nothing merged across the header: the reply's own ids
                assert span[:-1] == tokenizer.encode(reply, add_special_tokens=False)


def test_system_prompt_and_generation_prompt(tokenizer):
    rng = random.Random()
    messages = [{"role": "user", "content": random_content(rng)}]
    ids, mask = render_conversation(tokenizer, messages, system="be brief")
    assert tokenizer.decode(ids) == chatml_text([{"role": "system", "content": "be brief"},
                                                 *messages])
    assert not any(mask)
    own_system = [{"role": "system", "content": "mine"}, *messages]
    assert render_conversation(tokenizer, own_system, system="ignored")[0] == \
        render_conversation(tokenizer, own_system)[0]
    prompt = build_generation_prompt(tokenizer, messages, system="be brief")
    assert prompt[: len(ids)] == ids
    assert tokenizer.decode(prompt) == tokenizer.decode(ids) + "<|im_start|>assistant\n"
    # Training sees the reply's tokens right after the same header the prompt ends with.
    reply = {"role": "assistant", "content": "ok" + random_content(rng)}
    full, full_mask = render_conversation(tokenizer, [*messages, reply], system="be brief")
    assert full[: len(prompt)] == prompt and full_mask.index(1) == len(prompt)


def test_record_shapes_agree():
    user, reply, system = "Translate: chat", "cat", "sys"
    sharegpt = {"conversations": [{"from": "system", "value": system},
                                  {"from": "human", "value": user},
                                  {"from": "gpt", "value": reply}]}
    openai = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": user},
                           {"role": "assistant", "content": reply}]}
    alpaca = {"system": system, "instruction": "Translate: chat", "input": "", "output": reply}
    expected = [{"role": "system", "content": system}, {"role": "user", "content": user},
                {"role": "assistant", "content": reply}]
    assert sft_messages(sharegpt) == sft_messages(openai) == sft_messages(alpaca) == expected
    with_input = sft_messages({"instruction": "Translate", "input": "chat", "output": reply})
    assert with_input[0] == {"role": "user", "content": "Translate\n\nchat"}

    history = [{"from": "human", "value": user}]
    pair_a = dpo_messages({"conversations": history, "chosen": {"from": "gpt", "value": "good"},
                           "rejected": {"from": "gpt", "value": "bad"}})
    pair_b = dpo_messages({"prompt": user, "chosen": "good", "rejected": "bad"})
    pair_c = dpo_messages({"prompt": [{"role": "user", "content": user}],
                           "chosen": [{"role": "assistant", "content": "good"}],
                           "rejected": [{"role": "assistant", "content": "bad"}]})
    assert pair_a == pair_b == pair_c == ([{"role": "user", "content": user}],
                                          [{"role": "assistant", "content": "good"}],
                                          [{"role": "assistant", "content": "bad"}])


@pytest.mark.parametrize("record, reason", [
    ({"text": "pretraining record"}, "unknown_format"),
    ({"conversations": [{"from": "human", "value": "only a question"}]}, "no_assistant_turn"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "bad_message"),
    ({"messages": [{"role": "user", "content": 5}]}, "bad_message"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "late"},
                   {"role": "assistant", "content": "b"}]}, "bad_message"),
])
def test_bad_sft_records(record, reason):
    with pytest.raises(RecordFormatError) as error:
        sft_messages(record)
    assert error.value.reason == reason


@pytest.mark.parametrize("record", [
    {"prompt": "q", "chosen": "a"},
    {"prompt": [{"role": "assistant", "content": "not a user turn"}], "chosen": "a",
     "rejected": "b"},
    {"prompt": "q", "chosen": [{"role": "user", "content": "not a reply"}], "rejected": "b"},
])
def test_bad_dpo_records(record):
    with pytest.raises(RecordFormatError):
        dpo_messages(record)
