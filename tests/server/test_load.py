"""32 concurrent streaming requests through the `openai` async client: all complete, and each
stream is exactly what `model.generate` makes of its own prompt alone (greedy for half of
them, seeded sampling for the others, all in the same batches), so no request's tokens leak
into another's however the engine batched them. Latency p50/p95 are printed."""

from __future__ import annotations

import asyncio
import statistics
import time

import openai
import torch

from tests.server.conftest import start_server
from tokenizer import load_tokenizer
from utils.conversation import build_generation_prompt, stop_ids

NUM_REQUESTS = 32
MAX_TOKENS = 16
TIME_LIMIT_S = 240


def solo_reply(model, tokenizer, messages, temperature: float, seed: int) -> str:
    stops = stop_ids(tokenizer)
    prompt = build_generation_prompt(tokenizer, messages)
    new = model.generate(torch.tensor([prompt]), MAX_TOKENS, temperature, eos_token_id=stops,
                         generator=torch.Generator().manual_seed(seed))
    return tokenizer.decode([t for t in new[0, len(prompt):].tolist() if t not in stops])


def temperature_of(request: int) -> float:
    return 0.0 if request % 2 == 0 else 1.0


async def stream_one(client, messages, seed: int) -> tuple[str, float, float]:
    """(the streamed text, seconds to the first content chunk, seconds to the end)."""
    started = time.perf_counter()
    first = None
    parts = []
    stream = await client.chat.completions.create(
        model="run", messages=messages, temperature=temperature_of(seed), seed=seed,
        max_tokens=MAX_TOKENS, stream=True)
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter() - started
            parts.append(chunk.choices[0].delta.content)
    return "".join(parts), first or 0.0, time.perf_counter() - started


async def run_all(url: str, conversations) -> list[tuple[str, float, float]]:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0,
                                timeout=TIME_LIMIT_S)
    try:
        return await asyncio.wait_for(
            asyncio.gather(*(stream_one(client, messages, seed)
                             for seed, messages in enumerate(conversations))),
            TIME_LIMIT_S)
    finally:
        await client.close()


def test_32_concurrent_streams_complete_without_mixing(run_dir, reference_model,
                                                       tiny_hf_tokenizer_dir):
    tokenizer = load_tokenizer(tiny_hf_tokenizer_dir)
    words = ["the", "model", "reads", "text", "我们", "learns", "🚀", "café", "2024", "token"]
    # Different lengths, so the engine pads, joins and retires rows at different steps.
    conversations = [[{"role": "user", "content": " ".join(words[(i + k) % len(words)]
                                                          for k in range(1 + i % 7))}]
                     for i in range(NUM_REQUESTS)]
    expected = [solo_reply(reference_model, tokenizer, messages, temperature_of(seed), seed)
                for seed, messages in enumerate(conversations)]
    assert len(set(expected)) > NUM_REQUESTS // 2  # mixing streams would show

    server = start_server(run_dir, "--max_batch_size=8")
    try:
        started = time.perf_counter()
        results = asyncio.run(run_all(server.url, conversations))
        wall = time.perf_counter() - started
    finally:
        server.stop()

    assert [text for text, _, _ in results] == expected
    latencies = sorted(total for _, _, total in results)
    first_chunk = sorted(first for _, first, _ in results)
    p95 = latencies[int(0.95 * (len(latencies) - 1))]
    print(f"\n{NUM_REQUESTS} concurrent streams, max_batch_size 8: wall {wall:.2f} s; latency "
          f"p50 {statistics.median(latencies):.3f} s p95 {p95:.3f} s; first chunk p50 "
          f"{statistics.median(first_chunk):.3f} s")
