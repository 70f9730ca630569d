"""Benchmark: continuous batching vs one generation at a time, in the server's engine.

    python -m bench.bench_serve [--quick | --smoke] [--requests 32] [--max_batch_size 16]

The same requests (random prompts of 8..64 tokens, 16..64 new tokens each, greedy) go through
`server.engine.Engine` twice: with max_batch_size=1 (a request queue with one generation in
flight, the reference) and with continuous batching over one KV cache. Both runs alternate
`--repeats` times in this process so both see the same machine load; the median wall time
gives generated tokens/s for each and the ratio batched / one-at-a-time. No HTTP: this
measures the decoding engine itself. Timings on a shared CPU are noisy; compare ratios.

No request has a stop id, so each one must end with "length" after exactly its own number of
new tokens; anything else (an engine error above all) stops the bench with exit code 1
instead of printing a ratio over failed requests.
"""

from __future__ import annotations

import random
import statistics
import sys
import threading
import time

import torch

from bench import figures
from bench.size_flags import bench_parser
from model.configuration_z2all import Z2allConfig
from model.modeling_z2all import Z2allForCausalLM
from server.engine import Engine, Finished, GenerationRequest, SamplingParams


class RequestFailed(RuntimeError):
    """A request did not run to its token budget: the timing would mean nothing."""


def run_requests(model: Z2allForCausalLM, max_batch_size: int,
                 work: list[tuple[list[int], int]]) -> tuple[float, int]:
    """(wall seconds, tokens generated) for all requests submitted at once; RequestFailed if
    any request ended otherwise than with its full budget."""
    engine = Engine(model, max_batch_size=max_batch_size, max_waiting=len(work))
    done = threading.Semaphore(0)
    tokens = [0] * len(work)
    endings: list[Finished | None] = [None] * len(work)

    def deliverer(index: int):
        def deliver(event) -> None:
            if isinstance(event, Finished):
                endings[index] = event
                done.release()
            else:
                tokens[index] += 1
        return deliver

    engine.start()
    try:
        started = time.perf_counter()
        for index, (prompt, max_new_tokens) in enumerate(work):
            engine.submit(GenerationRequest(prompt, max_new_tokens, [], SamplingParams(),
                                            deliverer(index)))
        for _ in work:
            done.acquire()
        wall = time.perf_counter() - started
    finally:
        engine.stop()
    failed = [f"request {i}: {end.reason} {end.message} after {tokens[i]} of {budget} tokens"
              for i, ((_, budget), end) in enumerate(zip(work, endings))
              if end.reason != "length" or tokens[i] != budget]
    if failed:
        raise RequestFailed(f"{len(failed)} of {len(work)} requests failed (max_batch_size "
                            f"{max_batch_size}): " + "; ".join(failed[:3]))
    return wall, sum(tokens)


def main() -> None:
    parser = bench_parser(__doc__.split("\n\n")[0], quick="8 requests, 1 repeat",
                          smoke="2 requests, batch 2, 1 repeat: only checks that it runs")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max_batch_size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.quick:
        args.requests, args.repeats = 8, 1
    if args.smoke:
        args.requests, args.repeats, args.max_batch_size = 2, 1, 2
    figures.start(args)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = Z2allForCausalLM(Z2allConfig.from_preset(args.preset)).eval()
    rng = random.Random(0)
    vocab = model.config.vocab_size
    work = [([rng.randrange(vocab) for _ in range(rng.randint(8, 64))], rng.randint(16, 64))
            for _ in range(args.requests)]
    print(f"{args.requests} requests, preset {args.preset} "
          f"({model.num_parameters() / 1e6:.1f} M parameters), {args.threads} thread(s)")
    walls: dict[int, list[float]] = {1: [], args.max_batch_size: []}
    for _ in range(args.repeats):
        for batch_size in walls:
            wall, tokens = run_requests(model, batch_size, work)
            walls[batch_size].append(wall)
    print(f"  all {len(work) * len(walls) * args.repeats} requests succeeded "
          f"({tokens} tokens each run)")
    rates = {size: tokens / statistics.median(times) for size, times in walls.items()}
    for size, rate in rates.items():
        label = "one at a time (reference)" if size == 1 else f"continuous batching, {size} rows"
        print(f"  {label:<34s} {rate:9.1f} generated tokens/s")
    print(f"  ratio batched / one at a time: {rates[args.max_batch_size] / rates[1]:.2f}x")
    figures.record(f"continuous batching, {args.max_batch_size} rows", rates[args.max_batch_size],
                   rates[1], "generated tokens/s", "one generation at a time")
    figures.finish()


if __name__ == "__main__":
    try:
        main()
    except RequestFailed as error:
        sys.exit(f"error: {error}")
