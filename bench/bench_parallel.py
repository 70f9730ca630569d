"""Benchmark: data, tensor and pipeline parallelism and their 2x2 combinations at one world size;
with --context, context parallelism (CP1 vs CP2) over growing sequence lengths.

    python -m bench.bench_parallel [--smoke] [--world_size 4] [--hidden 256] [--layers 4]
                                   [--micro_batches 8] [--steps 5]
    python -m bench.bench_parallel --context [--quick | --smoke] [--steps 2]

For each grid (DP, TP, PP alone, then DPxTP, DPxPP, TPxPP when world_size is 4) fresh local
gloo ranks (1 intra-op thread each) train the same llama-style model: our DDP over the
data-parallel group, our tensor-parallel layers, our 1F1B schedule over `micro_batches`
micro-batches. Reported per rank (the maximum over ranks): parameter bytes held, peak resident
memory of the process (CPU: ru_maxrss, which includes torch itself; on a GPU one would read
torch.cuda.max_memory_allocated), median step time, and for pipeline grids the measured bubble
(idle fraction of the step) next to the theory (P-1)/(M+P-1). gloo on a shared CPU makes
communication slow and timings noisy: compare the memory columns, and the bubble trend.

--context: the `tiny` preset trains on one sequence per step of 256, 512, ..., 4096 tokens
(--quick: up to 1024, 2 timed steps), fresh processes for each length and layout (the peak is
the process's), in one process (CP1) and split over 2 ranks (CP2: each rank embeds,
attends with the ring and backpropagates its half of the sequence; our DDP averages over both).
Per rank: peak resident memory, how much of it the steps added (activations, attention blocks,
gradients: the part context parallelism divides), and the median step time.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time

import torch
import torch.distributed as dist

from bench.size_flags import bench_parser
from model.configuration_z2all import Z2allConfig
from model.modeling_z2all import Z2allForCausalLM
from parallel.context_parallel.context_shard import ContextShard
from parallel.distributed_data_parallel import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
)
from parallel.local_ranks import run_on_ranks
from parallel.parallel_dims import ParallelDims, check_parallel_shapes
from parallel.pipeline_parallel.schedules import PipelineSchedule
from parallel.pipeline_parallel.stage import split_into_stage
from parallel.tensor_parallel.parallelize import parallelize_model


def make_config(args: argparse.Namespace) -> Z2allConfig:
    return Z2allConfig(vocab_size=1024, hidden_size=args.hidden, num_hidden_layers=args.layers,
                       num_attention_heads=4, num_key_value_heads=4,
                       max_position_embeddings=args.seq_len)


def bench_rank(rank: int, world_size: int, tp: int, pp: int, args: argparse.Namespace) -> dict:
    dims = ParallelDims(world_size, tp, pp).build_groups()
    torch.manual_seed(0)
    model = split_into_stage(Z2allForCausalLM(make_config(args)), dims)
    if tp > 1:
        parallelize_model(model, dims, sequence_parallel=True)
    ddp = None
    if dims.data_parallel > 1:
        ddp = DistributedDataParallel(model, DistributedDataParallelConfig(
            overlap_grad_reduce=False), process_group=dims.dp_group)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    pipeline = PipelineSchedule(model, dims, "1f1b", sequence_parallel=tp > 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(dims.dp_rank)
    times, bubbles = [], []
    for step in range(args.warmup + args.steps):
        micro_batches = []
        for _ in range(args.micro_batches):
            tokens = torch.randint(0, 1024, (args.micro_batch_size, args.seq_len + 1),
                                   generator=generator)
            micro_batches.append({"input_ids": tokens[:, :-1], "labels": tokens[:, 1:]})
        dist.barrier()
        started = time.perf_counter()
        pipeline.step(micro_batches)
        _optimizer_step(model, ddp, optimizer)
        if step >= args.warmup:
            times.append(time.perf_counter() - started)
            bubbles.append(pipeline.last_step_stats.bubble_measured)
    return {"param_mib": param_bytes / 2**20,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "step_s": statistics.median(times), "bubble": statistics.median(bubbles),
            "bubble_theory": pipeline.last_step_stats.bubble_theory}


def _optimizer_step(model: torch.nn.Module, ddp: DistributedDataParallel | None,
                    optimizer: torch.optim.Optimizer) -> None:
    """Gradients averaged by our DDP (when there is one), an SGD step, gradients zeroed."""
    if ddp is not None:
        ddp.finish_grad_sync()
        for param in model.parameters():
            param.grad = param.main_grad
    optimizer.step()
    optimizer.zero_grad()
    if ddp is not None:
        ddp.zero_grad_buffer()


def _resident_mib() -> float:
    """This process's resident memory now (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            pages = int(handle.read().split()[1])
    except OSError:
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def bench_context_rank(rank: int, world_size: int, seq_len: int, args: argparse.Namespace
                       ) -> dict:
    """CP = world_size (module docstring): every rank reads the same sequences and computes
    its share of each."""
    torch.manual_seed(0)
    config = Z2allConfig.from_preset("tiny", max_position_embeddings=seq_len)
    if args.smoke:
        config = make_config(args)
    model = Z2allForCausalLM(config)
    if world_size > 1:
        dims = ParallelDims(world_size, context_parallel=world_size).build_groups()
        model.model.context_parallel = ContextShard.of(dims.cp_group)
    ddp = DistributedDataParallel(model, DistributedDataParallelConfig(overlap_grad_reduce=False))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    resident_before, times = _resident_mib(), []
    for step in range(args.warmup + args.steps):
        tokens = torch.randint(0, config.vocab_size, (1, seq_len + 1), generator=generator)
        dist.barrier()
        started = time.perf_counter()
        ddp(tokens[:, :-1], labels=tokens[:, 1:]).loss.backward()
        _optimizer_step(model, ddp, optimizer)
        if step >= args.warmup:
            times.append(time.perf_counter() - started)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {"peak_rss_mib": peak, "rise_mib": peak - resident_before,
            "step_s": statistics.median(times)}


def bench_context(args: argparse.Namespace) -> None:
    """The --context table: CP1 and CP2 at each sequence length."""
    lengths = ([64] if args.smoke
               else [256 * 2**i for i in range(3 if args.quick else 5)])  # up to 1024 / 4096
    print(f"context parallel, the {'smoke' if args.smoke else 'tiny'} model, one sequence per "
          f"step ({args.steps} timed); per rank, the worst of the ranks")
    print(f"{'seq_len':>7} {'layout':<6} {'peak RSS MiB':>12} {'steps added MiB':>15} "
          f"{'step s':>8}")
    for seq_len in lengths:
        for context_parallel in (1, 2):
            ranks = run_on_ranks(bench_context_rank, seq_len, args,
                                 world_size=context_parallel, timeout=600)
            worst = {key: max(rank[key] for rank in ranks) for key in ranks[0]}
            print(f"{seq_len:>7} {f'CP{context_parallel}':<6} {worst['peak_rss_mib']:>12.0f} "
                  f"{worst['rise_mib']:>15.0f} {worst['step_s']:>8.3f}", flush=True)


def grids(world_size: int) -> list[tuple[str, int, int]]:
    """(name, tensor_parallel, pipeline_parallel) at this world size."""
    found = [(f"DP{world_size}", 1, 1), (f"TP{world_size}", world_size, 1),
             (f"PP{world_size}", 1, world_size)]
    if world_size == 4:
        found += [("DP2xTP2", 2, 1), ("DP2xPP2", 1, 2), ("TP2xPP2", 2, 2)]
    return found


def main() -> None:
    parser = bench_parser(__doc__.split("\n")[0],
                          quick="2 ranks (the single dimensions), 2 timed steps",
                          smoke="2 ranks, tiny model, 1 step")
    parser.add_argument("--world_size", type=int, default=4, help="local gloo ranks")
    parser.add_argument("--hidden", type=int, default=256, help="model width")
    parser.add_argument("--layers", type=int, default=4, help="decoder blocks")
    parser.add_argument("--seq_len", type=int, default=64, help="tokens per row")
    parser.add_argument("--micro_batch_size", type=int, default=2, help="rows per micro-batch")
    parser.add_argument("--micro_batches", type=int, default=8, help="micro-batches per step")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per grid")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per grid")
    parser.add_argument("--context", action="store_true",
                        help="context parallelism instead: CP1 vs CP2 over sequence lengths")
    args = parser.parse_args()
    if args.context:
        if args.smoke:
            args.hidden, args.layers, args.seq_len, args.steps, args.warmup = 32, 2, 64, 1, 0
        if args.quick:
            args.steps = 2
        bench_context(args)
        return
    if args.smoke:
        args.world_size, args.hidden, args.layers, args.seq_len = 2, 32, 2, 16
        args.micro_batches, args.steps, args.warmup = 2, 1, 0
    if args.quick:
        args.world_size, args.steps = 2, 2
    print(f"world size {args.world_size}, hidden {args.hidden}, {args.layers} layers, "
          f"{args.micro_batches} micro-batches of {args.micro_batch_size}x{args.seq_len}")
    print(f"{'grid':<9} {'params MiB/rank':>15} {'peak RSS MiB':>12} {'step s':>8} "
          f"{'bubble':>7} {'(P-1)/(M+P-1)':>13}")
    for name, tp, pp in grids(args.world_size):
        check_parallel_shapes(make_config(args), args.world_size, tp, pp,
                              sequence_parallel=tp > 1, seq_len=args.seq_len)
        ranks = run_on_ranks(bench_rank, tp, pp, args, world_size=args.world_size,
                             timeout=600)
        worst = {key: max(rank[key] for rank in ranks) for key in ranks[0]}
        print(f"{name:<9} {worst['param_mib']:>15.2f} {worst['peak_rss_mib']:>12.0f} "
              f"{worst['step_s']:>8.3f} {worst['bubble']:>7.2f} {worst['bubble_theory']:>13.2f}")


if __name__ == "__main__":
    main()
