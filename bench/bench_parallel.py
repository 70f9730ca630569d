"""Benchmark: data, tensor and pipeline parallelism, alone and composed, with ZeRO stages.

    python -m bench.bench_parallel [--quick | --smoke] [--world_size 4] [--hidden 256]
                                   [--layers 4] [--micro_batches 8] [--steps 5]
    python -m bench.bench_parallel --context [--quick | --smoke] [--steps 2]

Each row is a grid x ZeRO stage: DP, TP, PP alone, then (at 4 ranks) DP2xTP2 and DP2xPP2 at
ZeRO-1 and ZeRO-3 next to DP4 at the same stages, and TP2xPP2; "+LoRA" rows train rank-8
adapters on every projection of a frozen base (TP alone, and at 4 ranks DP2xTP2 ZeRO-3).
Local gloo ranks (1 intra-op thread each, one spawn for all rows) train the same llama-style
model with exactly the trainer's wiring (`trainer.model_parallel.parallelize_grid`: the stage
cut, the tensor slices, our DDP or ZeRO-2/3 over the data-parallel group, the
whole-model-norm AdamW, the 1F1B schedule over `micro_batches` micro-batches). Reported, the
maximum over ranks (ranks differ: the first and last stage also hold the embedding or the
head):

    at rest  params + grads + optimizer state held between steps (`measure_memory`)
    planned  the memory plan of the same rank (`plan_memory`: equal on CPU)
    peak     params + grads + state at their most during a step: ZeRO-3 gathers a unit's
             weights, ZeRO-2/3 hold the whole gradients of the root, the computing block and
             the one reducing (sampled by hooks, bench_zero.py's), activations not counted
    step     median seconds per step; bubble: measured idle fraction of the pipeline step next
             to the theory (P-1)/(M+P-1)

gloo on a shared CPU makes communication slow and timings noisy: read the bytes, and the
bubble trend.

--context: the `tiny` preset trains on one sequence per step of 256, 512, ..., 4096 tokens
(--quick: up to 1024, 2 timed steps), fresh processes for each length and layout (the peak is
the process's), in one process (CP1) and split over 2 ranks (CP2: each rank embeds,
attends with the ring and backpropagates its half of the sequence; our DDP averages over both).
Per rank: peak resident memory, how much of it the steps added (activations, attention blocks,
gradients: the part context parallelism divides), and the median step time.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import statistics
import time

import torch
import torch.distributed as dist

from bench import figures
from bench.bench_zero import at_rest_and_peak, planned_at_rest, sample_peak
from bench.size_flags import bench_parser
from model.configuration_z2all import Z2allConfig
from model.lora import LoraConfig, apply_lora
from model.modeling_z2all import Z2allForCausalLM
from optimizer import OptimizerConfig
from parallel.distributed_data_parallel import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
)
from parallel.local_ranks import run_on_ranks
from parallel.parallel_dims import ParallelDims
from parallel_plan.llama_shapes import check_parallel_shapes
from parallel_plan.memory_plan import plan_memory
from trainer.model_parallel import parallelize_grid
from trainer.sequence_sharding import shard_sequences
from utils.boolean_flags import add_boolean_flag


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    tensor_parallel: int
    pipeline_parallel: int
    zero_stage: int
    lora_rank: int = 0  # > 0: adapters on a frozen base (model/lora.py)


def make_config(args: argparse.Namespace) -> Z2allConfig:
    return Z2allConfig(vocab_size=1024, hidden_size=args.hidden, num_hidden_layers=args.layers,
                       num_attention_heads=4, num_key_value_heads=4,
                       max_position_embeddings=args.seq_len)


def rows(world_size: int) -> list[Row]:
    """The single dimensions, then (at 4 ranks) the 2x2 grids next to DP4 at equal ZeRO."""
    w = world_size
    found = [Row(f"DP{w}", 1, 1, 0), Row(f"DP{w}", 1, 1, 1), Row(f"DP{w}", 1, 1, 3),
             Row(f"TP{w}", w, 1, 0), Row(f"TP{w}+LoRA", w, 1, 0, lora_rank=8),
             Row(f"PP{w}", 1, w, 0)]
    if world_size == 4:
        found += [Row(name, tp, pp, stage) for name, tp, pp in
                  (("DP2xTP2", 2, 1), ("DP2xPP2", 1, 2)) for stage in (1, 3)]
        found += [Row("TP2xPP2", 2, 2, 0), Row("DP2xTP2+LoRA", 2, 1, 3, lora_rank=8)]
    return found


def bench_row(row: Row, args: argparse.Namespace) -> dict:
    """One grid, built and stepped as the trainer does; this rank's figures."""
    torch.manual_seed(0)
    sequence_parallel = row.tensor_parallel > 1
    model = Z2allForCausalLM(make_config(args))
    lora = LoraConfig(rank=row.lora_rank) if row.lora_rank else None
    if lora is not None:
        apply_lora(model, lora)
    grid = parallelize_grid(
        model, row.tensor_parallel, row.pipeline_parallel,
        sequence_parallel, "1f1b", row.zero_stage, "allreduce",
        DistributedDataParallelConfig(overlap_grad_reduce=False), OptimizerConfig(lr=1e-3))
    ddp, optimizer, schedule, dims = grid.ddp, grid.optimizer, grid.schedule, grid.dims
    peak = sample_peak(ddp, ddp.module)
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
        optimizer.zero_grad()
        schedule.step(micro_batches)
        ddp.finish_grad_sync()
        optimizer.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - started)
            bubbles.append(schedule.last_step_stats.bubble_measured)
    at_rest, peak_bytes = at_rest_and_peak(ddp, optimizer, peak)
    plan = plan_memory(make_config(args), dims.world_size, row.zero_stage, "fp32",
                       args.micro_batch_size, args.seq_len, rank=dims.rank,
                       tensor_parallel=row.tensor_parallel,
                       pipeline_parallel=row.pipeline_parallel, lora=lora)
    return {"at_rest": at_rest, "planned": planned_at_rest(plan), "peak": peak_bytes,
            "step_s": statistics.median(times), "bubble": statistics.median(bubbles),
            "bubble_theory": schedule.last_step_stats.bubble_theory}


def bench_rank(rank: int, world_size: int, args: argparse.Namespace) -> list[dict]:
    return [bench_row(row, args) for row in rows(world_size)]


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
    shard_sequences(model, ParallelDims(world_size, context_parallel=world_size).build_groups())
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
        worst_by_layout = {}
        for context_parallel in (1, 2):
            ranks = run_on_ranks(bench_context_rank, seq_len, args,
                                 world_size=context_parallel, timeout=600)
            worst = {key: max(rank[key] for rank in ranks) for key in ranks[0]}
            worst_by_layout[context_parallel] = worst
            print(f"{seq_len:>7} {f'CP{context_parallel}':<6} {worst['peak_rss_mib']:>12.0f} "
                  f"{worst['rise_mib']:>15.0f} {worst['step_s']:>8.3f}", flush=True)
        figures.record(f"CP2 at {seq_len} tokens: memory added by the steps",
                       worst_by_layout[2]["rise_mib"], worst_by_layout[1]["rise_mib"], "MiB",
                       "CP1", higher_is_better=False)


def main() -> None:
    parser = bench_parser(__doc__.split("\n")[0], quick="4 ranks, 4 micro-batches, 2 timed steps",
                          smoke="2 ranks, tiny model, 1 step")
    parser.add_argument("--world_size", type=int, default=4, help="local gloo ranks")
    parser.add_argument("--hidden", type=int, default=256, help="model width")
    parser.add_argument("--layers", type=int, default=4, help="decoder blocks")
    parser.add_argument("--seq_len", type=int, default=64, help="tokens per row")
    parser.add_argument("--micro_batch_size", type=int, default=2, help="rows per micro-batch")
    parser.add_argument("--micro_batches", type=int, default=8, help="micro-batches per step")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per grid")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per grid")
    add_boolean_flag(parser, "--context",
                     help="context parallelism instead: CP1 vs CP2 over sequence lengths")
    args = parser.parse_args()
    figures.start(args, "bench_parallel --context" if args.context else "bench_parallel")
    if args.context:
        if args.smoke:
            args.hidden, args.layers, args.seq_len, args.steps, args.warmup = 32, 2, 64, 1, 0
        if args.quick:
            args.steps = 2
        bench_context(args)
        figures.finish()
        return
    if args.smoke:
        args.world_size, args.hidden, args.layers, args.seq_len = 2, 32, 2, 16
        args.micro_batches, args.steps, args.warmup = 2, 1, 0
    if args.quick:
        args.micro_batches, args.steps = 4, 2
    for row in rows(args.world_size):
        check_parallel_shapes(make_config(args), args.world_size, row.tensor_parallel,
                              row.pipeline_parallel, sequence_parallel=row.tensor_parallel > 1,
                              seq_len=args.seq_len)
    per_rank = run_on_ranks(bench_rank, args, world_size=args.world_size, timeout=1800)
    params = Z2allForCausalLM(make_config(args)).num_parameters()
    print(f"world size {args.world_size}, {params / 1e6:.2f}M params (hidden {args.hidden}, "
          f"{args.layers} layers; fp32, AdamW), {args.micro_batches} micro-batches of "
          f"{args.micro_batch_size}x{args.seq_len}; the most of any rank:")
    print(f"{'grid':<12} {'ZeRO':>4} {'at rest MiB':>11} {'planned MiB':>11} {'peak MiB':>9} "
          f"{'step s':>7} {'bubble':>7} {'(P-1)/(M+P-1)':>13}")
    reference = None  # the first row, plain data parallelism without ZeRO
    for index, row in enumerate(rows(args.world_size)):
        worst = {key: max(ranks[index][key] for ranks in per_rank) for key in per_rank[0][0]}
        reference = reference or (f"{row.name} ZeRO-{row.zero_stage}", worst)
        if index:
            figures.record(f"{row.name} ZeRO-{row.zero_stage}: peak memory", worst["peak"],
                           reference[1]["peak"], "bytes", reference[0], higher_is_better=False)
        mib = {key: worst[key] / 2**20 for key in ("at_rest", "planned", "peak")}
        bubbles = (f"{worst['bubble']:>7.2f} {worst['bubble_theory']:>13.2f}"
                   if row.pipeline_parallel > 1 else f"{'-':>7} {'-':>13}")
        print(f"{row.name:<12} {row.zero_stage:>4} {mib['at_rest']:>11.2f} "
              f"{mib['planned']:>11.2f} {mib['peak']:>9.2f} {worst['step_s']:>7.3f} {bubbles}")
    figures.finish()


if __name__ == "__main__":
    main()
