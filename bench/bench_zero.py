"""Benchmark: ZeRO stages 0-3 and torch FSDP2 side by side, bytes per rank and step time.

    python -m bench.bench_zero [--smoke] [--world_size 2] [--hidden 256] [--layers 4]

Starts `world_size` local gloo ranks (parallel/local_ranks.run_on_ranks, 1 thread each),
trains the same z2all model for a few AdamW steps (fp32) with each wrapper and reports, for
rank 0:
    at rest  params + grads + optimizer state held between steps (measure_memory), and the
             planner's prediction for the same (parallel_plan/memory_plan.py) next to it
    peak     the largest params + grads seen at any block's forward or any gradient hook
             (stage 3 gathers units; stages 2/3 hold the whole gradients of the root, the
             computing block and the one reducing)
    step     median seconds per step (forward, backward, reduction, AdamW)
FSDP2's bytes at rest are its local shards (params, grads, AdamW state); its peak is not
sampled (its unsharded buffers are internal). Timings on a shared CPU are noisy.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from bench import figures
from bench.size_flags import bench_parser
from model.configuration_z2all import Z2allConfig
from model.modeling_z2all import Z2allForCausalLM
from optimizer import OptimizerConfig
from optimizer.data_parallel_factory import build_data_parallel
from parallel.distributed_data_parallel import DistributedDataParallelConfig
from parallel.local_ranks import run_on_ranks
from parallel.sharded_data_parallel import ShardedDataParallel
from parallel_plan.llama_units import zero_units
from parallel_plan.memory_plan import MemoryPlan, measure_memory, plan_memory


def model_config(args: argparse.Namespace) -> Z2allConfig:
    return Z2allConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                       num_hidden_layers=args.layers, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=args.hidden * 3,
                       max_position_embeddings=args.seq_len)


def timed_steps(step, count: int) -> float:
    times = []
    for _ in range(count):
        dist.barrier()
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def sample_peak(wrapped: torch.nn.Module, model: Z2allForCausalLM) -> list[int]:
    """[the most params + grads bytes ZeRO-2/3's wrapper held so far], sampled by hooks at
    every block's forward and every gradient (our DDP's buffers never change size)."""
    peak = [0]

    def sample(*_) -> None:
        if isinstance(wrapped, ShardedDataParallel):
            peak[0] = max(peak[0], sum(wrapped.resident_bytes().values()))
    for block in model.model.layers.children():
        block.register_forward_hook(sample)
    for param in model.parameters():
        if param.requires_grad:  # (a LoRA base's frozen weights get none)
            param.register_post_accumulate_grad_hook(sample)
    return peak


def at_rest_and_peak(wrapped: torch.nn.Module, optimizer, peak: list[int]) -> tuple[int, int]:
    """(bytes held between steps: params, grads, optimizer state; their most during a step)."""
    measured = measure_memory(wrapped, optimizer)
    at_rest = sum(measured.values())
    params_and_grads = measured["params"] + measured["grads"]
    return at_rest, at_rest - params_and_grads + max(peak[0], params_and_grads)


def planned_at_rest(plan: MemoryPlan) -> int:
    return sum(line.bytes for line in plan.lines if line.name != "activations")


def ours(args: argparse.Namespace, zero_stage: int, ids: torch.Tensor) -> dict:
    torch.manual_seed(0)
    model = Z2allForCausalLM(model_config(args))
    wrapped, optimizer, _ = build_data_parallel(model, zero_stage,
                                                DistributedDataParallelConfig(),
                                                OptimizerConfig(), is_unit=zero_units(model))
    peak = sample_peak(wrapped, model)

    def step() -> None:
        optimizer.zero_grad()
        wrapped(ids, labels=ids).loss.backward()
        wrapped.finish_grad_sync()
        optimizer.step()
    seconds = timed_steps(step, args.steps)
    at_rest, peak_bytes = at_rest_and_peak(wrapped, optimizer, peak)
    plan = plan_memory(model_config(args), dist.get_world_size(), zero_stage, "fp32",
                       ids.shape[0], ids.shape[1], rank=dist.get_rank())
    return {"at_rest": at_rest, "planned": planned_at_rest(plan), "step": seconds,
            "peak": peak_bytes}


def fsdp2(args: argparse.Namespace, ids: torch.Tensor) -> dict:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = Z2allForCausalLM(model_config(args))
    for block in model.model.layers:
        fully_shard(block)
    fully_shard(model)
    adamw = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        adamw.zero_grad(set_to_none=False)
        model(ids, labels=ids).loss.backward()
        adamw.step()
    seconds = timed_steps(step, args.steps)
    local = [p.to_local() for p in model.parameters()] + \
        [p.grad.to_local() for p in model.parameters()] + \
        [t.to_local() if hasattr(t, "to_local") else t
         for state in adamw.state.values() for t in state.values()]
    return {"at_rest": sum(t.numel() * t.element_size() for t in local), "planned": None,
            "step": seconds, "peak": None}


def bench_rank(rank: int, world_size: int, args: argparse.Namespace) -> dict:
    ids = torch.randint(0, args.vocab, (args.batch_size, args.seq_len),
                        generator=torch.Generator().manual_seed(rank))
    report = {f"stage {stage}": ours(args, stage, ids) for stage in (0, 1, 2, 3)}
    report["torch FSDP2"] = fsdp2(args, ids)
    return report


def main() -> None:
    parser = bench_parser(__doc__.split("\n")[0], quick="2 layers, 2 timed steps",
                          smoke="seconds: tiny sizes")
    parser.add_argument("--world_size", type=int, default=2, help="local gloo ranks")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--batch_size", type=int, default=4, help="rows per rank and step")
    parser.add_argument("--seq_len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per variant")
    args = parser.parse_args()
    if args.smoke:
        args.hidden, args.layers, args.vocab, args.seq_len, args.steps = 64, 2, 256, 16, 1
    if args.quick:
        args.layers, args.steps = 2, 2
    figures.start(args)
    report = run_on_ranks(bench_rank, args, world_size=args.world_size, timeout=900)[0]
    params = Z2allForCausalLM(model_config(args)).num_parameters()
    print(f"z2all {args.layers} layers x hidden {args.hidden}, vocab {args.vocab}: "
          f"{params / 1e6:.2f}M params (fp32, AdamW), {args.world_size} gloo ranks, "
          f"batch {args.batch_size} x {args.seq_len}/rank; rank 0:")
    print(f"{'':<12} {'at rest MB':>11} {'planned MB':>11} {'peak MB':>9} {'step s':>8}")
    for name, row in report.items():
        def mb(value):
            return "-" if value is None else f"{value / 2**20:.2f}"
        print(f"{name:<12} {mb(row['at_rest']):>11} {mb(row['planned']):>11} "
              f"{mb(row['peak']):>9} {row['step']:8.3f}")
    (reference, first), *others = report.items()
    for name, row in others:
        if row["peak"] is not None and first["peak"] is not None:
            figures.record(f"{name}: peak memory", row["peak"], first["peak"], "bytes",
                           reference, higher_is_better=False)
        figures.record(f"{name}: step time", row["step"], first["step"], "s", reference,
                       higher_is_better=False)
    figures.finish()


if __name__ == "__main__":
    main()
