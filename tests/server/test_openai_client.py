"""The server through the official `openai` client, checked against generate.py and the model.

References: `generate.py --chat --temperature 0` on the same checkpoint (token for token, via
the usage counts and the text), `model.generate` for plain completions, and
`build_generation_prompt` for the prompt's token count.
"""

from __future__ import annotations

import json
import urllib.request

import openai
import pytest
import torch

import generate
from tokenizer import load_tokenizer
from utils.conversation import build_generation_prompt, stop_ids


@pytest.fixture(scope="module")
def client(live_server):
    return openai.OpenAI(base_url=f"{live_server.url}/v1", api_key="unused", max_retries=0,
                         timeout=60)


@pytest.fixture(scope="module")
def tokenizer(tiny_hf_tokenizer_dir):
    return load_tokenizer(tiny_hf_tokenizer_dir)


def generate_py_chat(run_dir, prompt: str, max_new_tokens: int, capsys) -> str:
    """What `generate.py --chat --temperature 0` prints (without its final newline)."""
    capsys.readouterr()
    generate.main(["--ckpt", str(run_dir), "--dtype", "fp32",
                   "--chat", "--prompt", prompt, "--temperature", "0",
                   "--max_new_tokens", str(max_new_tokens), "--device", "cpu"])
    return capsys.readouterr().out.removesuffix("\n")


def greedy_new_tokens(model, prompt_ids: list[int], max_new_tokens: int, stops: list[int]
                      ) -> list[int]:
    """The model's greedy continuation, up to and including the first stop token."""
    output = model.generate(torch.tensor([prompt_ids]), max_new_tokens, eos_token_id=stops)
    new = output[0, len(prompt_ids):].tolist()
    ends = [i for i, token in enumerate(new) if token in stops]
    return new[:ends[0] + 1] if ends else new


@pytest.mark.parametrize("prompt", ["What is 2 + 3?", "naïve 你好 🙂 <|im_end|> ok"])
def test_chat_greedy_equals_generate_py(client, run_dir, tokenizer, reference_model, prompt,
                                        capsys):
    expected_text = generate_py_chat(run_dir, prompt, 20, capsys)
    response = client.chat.completions.create(
        model="run", messages=[{"role": "user", "content": prompt}], temperature=0,
        max_tokens=20)
    choice = response.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == expected_text
    # Exact usage: the prompt as the injection-safe builder renders it (typed "<|im_end|>"
    # stays text) and every generated token, the stop token included.
    messages = [{"role": "user", "content": prompt}]
    prompt_ids = build_generation_prompt(tokenizer, messages)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert prompt_ids.count(im_end) == 1  # the template's own, closing the user turn
    new_tokens = greedy_new_tokens(reference_model, prompt_ids, 20, stop_ids(tokenizer))
    assert tokenizer.decode([t for t in new_tokens if t not in stop_ids(tokenizer)]) \
        == expected_text
    assert response.usage.prompt_tokens == len(prompt_ids)
    assert response.usage.completion_tokens == len(new_tokens)
    assert response.usage.total_tokens == len(prompt_ids) + len(new_tokens)
    assert choice.finish_reason == ("stop" if new_tokens[-1] in stop_ids(tokenizer)
                                    else "length")
    assert response.model == run_dir.name


def test_chat_streaming_equals_non_streaming(client):
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": "the model reads text"}]
    whole = client.chat.completions.create(model="run", messages=messages, temperature=0,
                                           max_tokens=24)
    stream = client.chat.completions.create(model="run", messages=messages, temperature=0,
                                            max_tokens=24, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    content = [c.choices[0].delta.content for c in chunks if c.choices and
               c.choices[0].delta.content]
    assert len(content) > 1  # streamed piece by piece, not in one block
    assert "".join(content) == whole.choices[0].message.content
    finish = [c.choices[0].finish_reason for c in chunks if c.choices
              and c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]
    assert chunks[-1].usage.model_dump() == whole.usage.model_dump()


def test_stop_string_cuts_the_reply(client):
    messages = [{"role": "user", "content": "every day"}]
    full = client.chat.completions.create(model="run", messages=messages, temperature=0,
                                          max_tokens=30).choices[0].message.content
    stop = full[len(full) // 2:len(full) // 2 + 2]
    first = full.index(stop)
    for stream in (False, True):
        response = client.chat.completions.create(model="run", messages=messages, temperature=0,
                                                  max_tokens=30, stop=[stop], stream=stream)
        if stream:
            chunks = list(response)
            text = "".join(c.choices[0].delta.content or "" for c in chunks)
            finish_reason = chunks[-1].choices[0].finish_reason
        else:
            text, finish_reason = (response.choices[0].message.content,
                                   response.choices[0].finish_reason)
        assert (text, finish_reason) == (full[:first], "stop")


def test_seeded_sampling_is_reproducible_and_matches_generate_py(client, run_dir, capsys):
    def sample(seed: int) -> str:
        return client.chat.completions.create(
            model="run", messages=[{"role": "user", "content": "hi"}], temperature=1.0,
            top_p=0.9, seed=seed, max_tokens=16,
            extra_body={"top_k": 50}).choices[0].message.content

    capsys.readouterr()
    generate.main(["--ckpt", str(run_dir), "--dtype", "fp32",
                   "--chat", "--prompt", "hi", "--temperature", "1.0",
                   "--top_k", "50", "--top_p", "0.9", "--seed", "7", "--max_new_tokens", "16",
                   "--device", "cpu"])
    assert sample(7) == capsys.readouterr().out.removesuffix("\n")
    assert sample(7) == sample(7)
    assert sample(7) != sample(8)


def test_completions_match_model_generate(client, tokenizer, reference_model):
    prompt = "the model"
    response = client.completions.create(model="run", prompt=prompt, temperature=0,
                                         max_tokens=12)
    prompt_ids = tokenizer.encode(prompt)
    new_tokens = greedy_new_tokens(reference_model, prompt_ids, 12, stop_ids(tokenizer))
    expected = tokenizer.decode([t for t in new_tokens if t not in stop_ids(tokenizer)])
    assert response.choices[0].text == expected
    assert response.usage.prompt_tokens == len(prompt_ids)
    assert response.usage.completion_tokens == len(new_tokens)
    streamed = client.completions.create(model="run", prompt=prompt, temperature=0, max_tokens=12,
                                         stream=True)
    assert "".join(chunk.choices[0].text for chunk in streamed) == expected


def test_models_and_health(client, live_server, run_dir):
    assert [model.id for model in client.models.list()] == [run_dir.name]
    with urllib.request.urlopen(f"{live_server.url}/health", timeout=10) as response:
        health = json.load(response)
    assert health["status"] == "ok" and health["running"] == 0
