"""Benchmark: data, tensor and pipeline parallelism and their 2x2 combinations at one world size.

    python -m bench.bench_parallel [--smoke] [--world_size 4] [--hidden 256] [--layers 4]
                                   [--micro_batches 8] [--steps 5]

For each grid (DP, TP, PP alone, then DPxTP, DPxPP, TPxPP when world_size is 4) fresh local
gloo ranks (1 intra-op thread each) train the same llama-style model: our DDP over the
data-parallel group, our tensor-parallel layers, our 1F1B schedule over `micro_batches`
micro-batches. Reported per rank (the maximum over ranks): parameter bytes held, peak resident
memory of the process (CPU: ru_maxrss, which includes torch itself; on a GPU one would read
torch.cuda.max_memory_allocated), median step time, and for pipeline grids the measured bubble
(idle fraction of the step) next to the theory (P-1)/(M+P-1). gloo on a shared CPU makes
communication slow and timings noisy: compare the memory columns, and the bubble trend.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch
import torch.distributed as dist

from bench.size_flags import bench_parser
from model.configuration_z2all import Z2allConfig
from model.modeling_z2all import Z2allForCausalLM
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
    pipeline = PipelineSchedule(model, dims, "1f1b", sequence_parallel=tp > 1, grad_sync=ddp)
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
        if ddp is not None:
            ddp.finish_grad_sync()
            for param in model.parameters():
                param.grad = param.main_grad
        optimizer.step()
        optimizer.zero_grad()
        if ddp is not None:
            ddp.zero_grad_buffer()
        if step >= args.warmup:
            times.append(time.perf_counter() - started)
            bubbles.append(pipeline.last_step_stats.bubble_measured)
    return {"param_mib": param_bytes / 2**20,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "step_s": statistics.median(times), "bubble": statistics.median(bubbles),
            "bubble_theory": pipeline.last_step_stats.bubble_theory}


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
    args = parser.parse_args()
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
