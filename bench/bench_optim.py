"""Optimizer-state memory per rank and step time: plain AdamW vs our ZeRO-1 vs torch's ZeRO.

    python -m bench.bench_optim [--quick | --smoke]

Two CPU ranks over gloo train the same fp32 MLP stack (same seed, same data) with:
- torch DDP + torch AdamW (the reference: every rank holds all optimizer state);
- our DDP + FP32Optimizer (replicated, like the reference);
- our DDP + DistributedOptimizer (ZeRO-1), blocking and with overlapped param gather;
- torch DDP + torch.distributed.optim.ZeroRedundancyOptimizer (torch's ZeRO-1).
State memory is measured from the tensors each optimizer holds on rank 0 (Adam moments, and
any fp32 copies). Times are per training iteration (forward + backward + reduction + step) and
for `step()` alone (which includes ZeRO's all-gather or broadcast), the median over steps of the
slower rank; ratios are against the reference in the same run. CPU/gloo timings say little
about NCCL on GPUs, where the all-gather overlaps compute; the memory column transfers as is.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import nn

from bench import figures
from bench.size_flags import bench_parser
from optimizer import OptimizerConfig, get_optimizer
from parallel.distributed_data_parallel import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
)
from parallel.local_ranks import run_on_ranks

VARIANTS = ["torch AdamW (reference)", "our FP32Optimizer", "our ZeRO-1",
            "our ZeRO-1 + overlap gather", "torch ZeroRedundancyOptimizer"]


def build_model(width: int, depth: int) -> nn.Module:
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU(), nn.LayerNorm(width)]
    return nn.Sequential(*layers)


def tensor_bytes(states) -> int:
    return sum(v.numel() * v.element_size() for state in states for v in state.values()
               if isinstance(v, torch.Tensor))


@dataclass
class Variant:
    model: nn.Module
    zero_grad: Callable[[], None]
    finish_grad_sync: Callable[[], None]
    step: Callable[[], object]
    state_bytes: Callable[[], int]


def build_variant(name: str, model: nn.Module, config: OptimizerConfig) -> Variant:
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as TorchDDP

    if name.startswith("torch"):  # torch DDP reduces inside backward: nothing left to finish
        adamw = dict(lr=config.lr, betas=(config.adam_beta1, config.adam_beta2),
                     eps=config.adam_eps, weight_decay=config.weight_decay, foreach=True)
        ddp = TorchDDP(model)
        if "Zero" in name:
            zero = ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, **adamw)
            return Variant(ddp, zero.zero_grad, lambda: None, zero.step,
                           lambda: tensor_bytes(zero.optim.state.values()))
        optimizer = torch.optim.AdamW(model.parameters(), **adamw)
        return Variant(ddp, optimizer.zero_grad, lambda: None, optimizer.step,
                       lambda: tensor_bytes(optimizer.state.values()))
    sharded = "ZeRO" in name
    ddp = DistributedDataParallel(model, DistributedDataParallelConfig(
        bucket_size=1_000_000, use_distributed_optimizer=sharded))
    ours = get_optimizer(replace(config, use_distributed_optimizer=sharded,
                                 overlap_param_gather="overlap" in name), ddp)
    return Variant(ddp, ours.zero_grad, ddp.finish_grad_sync, ours.step, ours.state_bytes)


def measure(rank: int, world_size: int, width: int, depth: int, steps: int) -> dict:
    # No clipping: torch's optimizers have none built in, and we compare like with like.
    config = OptimizerConfig(lr=1e-3, weight_decay=0.1, clip_grad=0.0)
    generator = torch.Generator().manual_seed(1 + rank)
    batches = [torch.randn(32, width, generator=generator) for _ in range(steps + 2)]
    variants = {name: build_variant(name, build_model(width, depth), config)
                for name in VARIANTS}
    times = {name: {"iteration_s": [], "step_s": []} for name in VARIANTS}
    # Variants take turns step by step, so a load spike on this shared machine hits them all.
    for index, inputs in enumerate(batches):
        for name, variant in variants.items():
            start = time.perf_counter()
            variant.zero_grad()
            variant.model(inputs).square().mean().backward()
            variant.finish_grad_sync()
            step_start = time.perf_counter()
            variant.step()
            end = time.perf_counter()
            if index >= 2:  # warm-up: Adam state allocation, first collectives
                times[name]["iteration_s"].append(end - start)
                times[name]["step_s"].append(end - step_start)
    results = {name: {"state_bytes": variant.state_bytes(),
                      **{key: statistics.median(values) for key, values in times[name].items()}}
               for name, variant in variants.items()}
    results["bf16_state_bytes"] = bf16_state_bytes(width, depth, config, batches[0])
    return results


def bf16_state_bytes(width: int, depth: int, config: OptimizerConfig,
                     inputs: torch.Tensor) -> dict[str, int]:
    """Mixed precision, where ZeRO-1 saves most: fp32 main params + 2 moments = 12 bytes per
    parameter replicated, 12/W sharded. One step each, to allocate Adam's state."""
    sizes = {}
    for sharded in (False, True):
        model = build_model(width, depth).to(torch.bfloat16)
        ddp = DistributedDataParallel(model, DistributedDataParallelConfig(
            bucket_size=1_000_000, use_distributed_optimizer=sharded))
        optimizer = get_optimizer(replace(config, params_dtype="bf16",
                                          use_distributed_optimizer=sharded), ddp)
        ddp(inputs.bfloat16()).float().square().mean().backward()
        ddp.finish_grad_sync()
        optimizer.step()
        sizes["our ZeRO-1" if sharded else "our Float16Optimizer"] = optimizer.state_bytes()
    return sizes


def main() -> None:
    parser = bench_parser(__doc__.split("\n")[0], quick="small model, few steps",
                          smoke="seconds: tiny sizes, generated data; proves the bench runs")
    args = parser.parse_args()
    figures.start(args)
    width, depth, steps = ((32, 2, 1) if args.smoke else (256, 4, 5) if args.quick
                           else (1024, 8, 10))
    num_params = sum(p.numel() for p in build_model(width, depth).parameters())
    print(f"MLP {depth} x Linear({width}, {width}) + LayerNorm: {num_params / 1e6:.2f}M fp32 "
          f"params, 2 gloo ranks on CPU, {steps} timed steps")
    per_rank = run_on_ranks(measure, width, depth, steps, world_size=2, timeout=600)
    reference = VARIANTS[0]
    ref_bytes = per_rank[0][reference]["state_bytes"]
    slowest = {name: {key: max(r[name][key] for r in per_rank) for key in ("iteration_s",
                                                                              "step_s")}
               for name in VARIANTS}
    header = (f"{'optimizer':32s} {'state MB/rank':>13s} {'ratio':>6s} {'iter ms':>8s} "
              f"{'ratio':>6s} {'step ms':>8s} {'ratio':>6s}")
    print(header)
    print("-" * len(header))
    for name in VARIANTS:
        state_mb = per_rank[0][name]["state_bytes"] / 2**20
        times = slowest[name]
        print(f"{name:32s} {state_mb:13.2f} {per_rank[0][name]['state_bytes'] / ref_bytes:6.2f} "
              f"{times['iteration_s'] * 1e3:8.1f} "
              f"{times['iteration_s'] / slowest[reference]['iteration_s']:6.2f} "
              f"{times['step_s'] * 1e3:8.1f} {times['step_s'] / slowest[reference]['step_s']:6.2f}")
        if name != reference:
            figures.record(f"{name}: state per rank", per_rank[0][name]["state_bytes"],
                           ref_bytes, "bytes", reference, higher_is_better=False)
            figures.record(f"{name}: iteration time", times["iteration_s"],
                           slowest[reference]["iteration_s"], "s", reference,
                           higher_is_better=False)
    print("\nbf16 params (state = fp32 main params + Adam moments), bytes per parameter per rank:")
    for name, size in per_rank[0]["bf16_state_bytes"].items():
        print(f"  {name:30s} {size / num_params:6.2f}")
    figures.finish()


if __name__ == "__main__":
    main()
