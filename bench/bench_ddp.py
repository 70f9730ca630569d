"""Benchmark: our DDP vs torch.nn.parallel.DistributedDataParallel, and our comm hooks.

    python -m bench.bench_ddp [--quick | --smoke] [--world_size 2] [--hidden 768] [--layers 8]

Starts `world_size` local gloo ranks (parallel/local_ranks.run_on_ranks, 1 intra-op thread
each). Every rank holds an MLP
of `layers` square Linear layers; a step is forward + backward + gradient averaging (+ plain
SGD so weights move). Our DDP and torch's alternate step by step in the same processes, so
both see the same machine load; the median step time is reported with the ratio ours / torch.
Then our hooks: plain all-reduce, bf16 compression, PowerSGD rank 1 and 4, with bytes each
rank sends per step (ring all-reduce accounting, see ddp_comm_hooks/default_hooks.py).
Timings on a shared CPU are noisy; compare ratios, not absolute numbers.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from bench import figures
from bench.size_flags import bench_parser
from parallel.distributed_data_parallel import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
)
from parallel.distributed_data_parallel.ddp_comm_hooks.default_hooks import (
    bf16_compress_hook,
)
from parallel.distributed_data_parallel.ddp_comm_hooks.powerSGD_hook import (
    PowerSGDState,
    powerSGD_hook,
)
from parallel.local_ranks import run_on_ranks


def make_model(hidden: int, layers: int) -> nn.Sequential:
    torch.manual_seed(0)
    blocks: list[nn.Module] = []
    for _ in range(layers):
        blocks += [nn.Linear(hidden, hidden), nn.GELU()]
    return nn.Sequential(*blocks)


def time_steps(step: Callable[[int], None], steps: int) -> list[float]:
    times = []
    for index in range(steps):
        dist.barrier()
        started = time.perf_counter()
        step(index)
        times.append(time.perf_counter() - started)
    return times


def make_step(model: nn.Module, inputs: torch.Tensor, ours: bool) -> Callable[[int], None]:
    params = list(model.parameters())

    def step(_: int) -> None:
        loss = model(inputs).square().mean()
        loss.backward()
        if ours:
            model.finish_grad_sync()
        with torch.no_grad():
            for param in params:
                param.add_(param.main_grad if ours else param.grad, alpha=-1e-3)
        if ours:
            model.zero_grad_buffer()
        else:
            model.zero_grad(set_to_none=True)

    return step


def bench_rank(rank: int, world_size: int, args: argparse.Namespace) -> dict:
    """Runs on every rank (started by run_on_ranks); returns this rank's timings and bytes."""
    generator = torch.Generator().manual_seed(rank)
    inputs = torch.randn(args.batch_size, args.hidden, generator=generator)
    bucket_size = int(args.bucket_mb * 2**20) // 4  # fp32 elements, same bytes as torch's cap
    ddp_config = DistributedDataParallelConfig(bucket_size=bucket_size)

    # 1. Our DDP against torch's, alternating steps.
    ours = DistributedDataParallel(make_model(args.hidden, args.layers), ddp_config)
    theirs = nn.parallel.DistributedDataParallel(make_model(args.hidden, args.layers),
                                                 bucket_cap_mb=args.bucket_mb)
    our_step, their_step = make_step(ours, inputs, True), make_step(theirs, inputs, False)
    for index in range(args.warmup):
        our_step(index)
        their_step(index)
    our_times, their_times = [], []
    for _ in range(args.steps):
        our_times += time_steps(our_step, 1)
        their_times += time_steps(their_step, 1)
    report = {"ours": statistics.median(our_times), "torch": statistics.median(their_times),
              "hooks": {}}

    # 2. Our comm hooks on the same model.
    hooks = {"allreduce fp32": None, "bf16 compress": (None, bf16_compress_hook)}
    for rank_r in (1, 4):
        hooks[f"PowerSGD rank {rank_r}"] = (
            PowerSGDState(matrix_approximation_rank=rank_r, start_powerSGD_iter=1), powerSGD_hook)
    for name, hook in hooks.items():
        model = DistributedDataParallel(make_model(args.hidden, args.layers), ddp_config)
        if hook is not None:
            model.register_comm_hook(*hook)
        step = make_step(model, inputs, True)
        time_steps(step, args.warmup)
        report["hooks"][name] = (statistics.median(time_steps(step, args.steps)),
                                 model.comm_bytes_last_step)
    return report


def main() -> None:
    parser = bench_parser(__doc__.split("\n")[0], quick="small model, few steps",
                          smoke="seconds: tiny sizes, generated data; proves the bench runs")
    parser.add_argument("--world_size", type=int, default=2, help="local gloo ranks")
    parser.add_argument("--hidden", type=int, default=768, help="width of the square layers")
    parser.add_argument("--layers", type=int, default=8, help="number of Linear layers")
    parser.add_argument("--batch_size", type=int, default=32, help="rows per rank and step")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per variant")
    parser.add_argument("--bucket_mb", type=float, default=25.0,
                        help="bucket size for both DDPs (torch's default bucket_cap_mb is 25)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per variant")
    args = parser.parse_args()
    if args.quick:
        args.hidden, args.layers, args.steps = 384, 4, 10
    if args.smoke:
        args.hidden, args.layers, args.steps, args.warmup = 32, 2, 2, 1
    figures.start(args)

    report = run_on_ranks(bench_rank, args, world_size=args.world_size, timeout=600)[0]

    params = args.layers * (args.hidden * args.hidden + args.hidden)
    print(f"MLP {args.layers} x Linear({args.hidden}, {args.hidden}) = {params / 1e6:.2f}M "
          f"params, batch {args.batch_size}/rank, {args.world_size} gloo ranks, "
          f"{args.bucket_mb:g} MB buckets, "
          f"median of {args.steps} steps")
    ratio = report["ours"] / report["torch"]
    print(f"step time  ours {report['ours'] * 1e3:7.1f} ms   torch DDP "
          f"{report['torch'] * 1e3:7.1f} ms   ratio ours/torch {ratio:.3f}  (target <= 1.05)")
    figures.record("DDP step time", report["ours"], report["torch"], "s", "torch DDP",
                   higher_is_better=False, target=round(1 / 1.05, 2))
    full_bytes = report["hooks"]["allreduce fp32"][1]
    print(f"{'comm hook':<18} {'step ms':>8} {'bytes/step/rank':>16} {'vs fp32':>8}")
    for name, (seconds, bytes_sent) in report["hooks"].items():
        print(f"{name:<18} {seconds * 1e3:8.1f} {bytes_sent:16,} {bytes_sent / full_bytes:8.4f}")
        if bytes_sent != full_bytes:
            figures.record(f"bytes sent, {name} hook", bytes_sent, full_bytes, "bytes/step/rank",
                           "allreduce fp32", higher_is_better=False)
    figures.finish()


if __name__ == "__main__":
    main()
