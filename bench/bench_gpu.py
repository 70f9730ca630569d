"""Training-step throughput on one CUDA GPU: our model vs transformers' LlamaForCausalLM.

    python -m bench.bench_gpu [--quick | --smoke]      # prints "skipped" without a GPU

The GPU twin of bench/bench_model.py (which times the CPU): the same pair of models with the
same weights (`build_pair`), the same step (`make_step`: forward + loss + backward + AdamW,
bf16 autocast over fp32 parameters, as `--dtype auto` trains on sm80+), at GPU-sized presets.
The implementations run alternately in one process, timed with the GPU drained before and
after each round; the table reports medians. MFU is our FLOP/s (6N + 12·L·H·Q·T per token)
over the bf16 FLOP/s of a large matmul measured in the same process, not the datasheet.
Each model runs eager and with each decoder block compiled (ours `compile_blocks`, HF's
layers alike). `--smoke` runs the tiny preset on whatever device there is (the CPU in CI), to
prove the script runs; its figures mean nothing.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from bench import figures
from bench.bench_model import BENCH_MODELS, build_pair, make_step
from bench.size_flags import bench_parser
from model.configuration_z2all import PRESETS


def gpu_sized(preset: str) -> dict:
    """A preset's shape with a 32k vocabulary, as overrides on "tiny" (`build_pair` sets the
    positions from the sequence length)."""
    shape = {k: v for k, v in PRESETS[preset].items() if k != "max_position_embeddings"}
    return {**shape, "vocab_size": 32000}


# name -> (overrides on preset "tiny", batch size, sequence length)
GPU_MODELS = {
    "0.1B 16x1024": (gpu_sized("0.1B"), 16, 1024),
    "0.5B 8x2048": (gpu_sized("0.5B"), 8, 2048),
    "tiny 1x64": BENCH_MODELS["tiny 1x64"],  # --smoke only
}


def synchronize(device: torch.device) -> None:
    """Wait for the GPU's queued kernels, so a wall-clock time covers their work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak_flops(device: torch.device, size: int, repeats: int = 10) -> float:
    """bf16 FLOP/s of one square matmul: the practical ceiling of this card."""
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    synchronize(device)
    return 2 * size**3 * repeats / (time.perf_counter() - start)


def time_alternating(steps_by_impl: dict, steps: int, rounds: int,
                     device: torch.device) -> dict[str, float]:
    """Median seconds per step of each implementation, rounds alternating between them."""
    for step in steps_by_impl.values():
        step()  # warm-up (and compilation, for compiled blocks)
        step()
    seconds = {impl: [] for impl in steps_by_impl}
    for _ in range(rounds):
        for impl, step in steps_by_impl.items():
            synchronize(device)
            start = time.perf_counter()
            for _ in range(steps):
                step()
            synchronize(device)
            seconds[impl].append((time.perf_counter() - start) / steps)
    return {impl: statistics.median(times) for impl, times in seconds.items()}


def steps_on(device: torch.device, name: str, compiled: bool
             ) -> tuple[dict, torch.nn.Module, torch.Tensor]:
    """The (ours, HF) training steps of model `name` on `device`, bf16 autocast."""
    ours, hf, input_ids, labels = build_pair(name, GPU_MODELS)
    ours, hf = ours.to(device), hf.to(device)
    input_ids, labels = input_ids.to(device), labels.to(device)
    if compiled:
        ours.compile_blocks()
        for layer in hf.model.layers:
            layer.compile()
    steps = {"ours": make_step(ours, True, input_ids, labels, torch.bfloat16),
             "hf": make_step(hf, False, input_ids, labels, torch.bfloat16)}
    return steps, ours, input_ids


def main() -> int:
    parser = bench_parser(__doc__.split("\n\n")[0], quick="the 0.1B model only, 3 rounds",
                          smoke="seconds: the tiny model on any device, one round")
    args = parser.parse_args()
    figures.start(args)
    if not (torch.cuda.is_available() or args.smoke):  # `make bench` on a CPU machine
        print("bench_gpu: skipped, no CUDA device visible (run it on a GPU node, docs/gpu.md; "
              "--smoke runs it on the CPU)")
        figures.note("skipped: no CUDA device visible")
        figures.finish()
        return 0
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    names = (["tiny 1x64"] if args.smoke else ["0.1B 16x1024"] if args.quick
             else ["0.1B 16x1024", "0.5B 8x2048"])
    steps, rounds = (1, 1) if args.smoke else (5, 3) if args.quick else (5, 5)
    size = 256 if args.smoke else 8192
    peak = matmul_peak_flops(device, size)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"{name}, torch {torch.__version__}: bf16 matmul {size}^3 {peak / 1e12:.1f} TFLOP/s")
    print(f"\ntraining step (fwd+bwd+AdamW), bf16 autocast, fp32 params, median of {rounds} "
          f"alternating rounds of {steps} steps")
    print(f"{'model':<14} {'blocks':<9} {'ours tok/s':>11} {'HF tok/s':>10} {'ours/HF':>8} "
          f"{'ours MFU':>9}")
    for name in names:
        for compiled in (False,) if args.smoke else (False, True):
            step_by_impl, ours, input_ids = steps_on(device, name, compiled)
            seconds = time_alternating(step_by_impl, steps, rounds, device)
            tokens, seq_len = input_ids.numel(), input_ids.shape[1]
            mfu = ours.num_flops_per_token(seq_len) * tokens / seconds["ours"] / peak
            print(f"{name:<14} {'compiled' if compiled else 'eager':<9} "
                  f"{tokens / seconds['ours']:>11.0f} {tokens / seconds['hf']:>10.0f} "
                  f"{seconds['hf'] / seconds['ours']:>7.2f}x {mfu:>9.1%}")
            figures.record(f"{name} {'compiled' if compiled else 'eager'} training step",
                           tokens / seconds["ours"], tokens / seconds["hf"], "tokens/s",
                           "HF transformers LlamaForCausalLM")
            del step_by_impl, ours, input_ids
            if device.type == "cuda":
                torch.cuda.empty_cache()
    figures.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
