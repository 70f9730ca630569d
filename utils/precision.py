"""Which floating-point precision to run a model in: the one dtype-name map and the `auto` rule.

    resolve_dtype("auto", torch.device("cpu"))  ->  PrecisionChoice(dtype="fp32", reason=...)

On CUDA the rule is fixed: bf16 where the GPU runs it natively (Ampere+; same range as fp32, no loss
scaling), else fp16 (with the dynamic loss scaler). On a CPU no rule fits every machine: with
native bf16 matrix instructions (avx512_bf16, AMX) a bf16 matmul runs several times faster than
fp32, while a CPU with only AVX2 emulates bf16 and runs it ~30x SLOWER (measured on a 2-core AMD
EPYC with AVX2 only: 512x512 matmul, one thread, 53 GFLOP/s in fp32, 1.4 GFLOP/s in bf16). So
`auto` on a CPU times the same small matmul in both dtypes, once per process (~0.1 s, the
bf16 case being the slow one), and picks bf16 only when it is clearly faster
(>= BF16_MIN_SPEEDUP): a tie is not worth bf16's rounding.

The timer is this thread's CPU time with one intra-op thread, so other jobs on a shared
machine lengthen neither side; the best of a few repeats discards the cache-cold ones.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
BF16_MIN_SPEEDUP = 1.3      # bf16 must be at least this many times faster than fp32 to be chosen
MATMUL_SIZE = 256           # big enough to reach a GEMM kernel's speed, small enough to be quick
REPEATS = 5


@dataclass(frozen=True)
class PrecisionChoice:
    dtype: str                                  # a key of DTYPES
    reason: str                                 # one line for the run's log and report
    fp32_gflops: float | None = None            # the measured figures (CPU `auto` only)
    bf16_gflops: float | None = None


def choose_cpu_dtype(fp32_seconds: float, bf16_seconds: float) -> PrecisionChoice:
    """The decision, from the two timings of the same matmul (seconds each)."""
    flops = 2 * MATMUL_SIZE ** 3
    fp32_gflops, bf16_gflops = flops / fp32_seconds / 1e9, flops / bf16_seconds / 1e9
    speedup = fp32_seconds / bf16_seconds
    dtype = "bf16" if speedup >= BF16_MIN_SPEEDUP else "fp32"
    verdict = ("native bf16" if dtype == "bf16" else
               f"bf16 is not >= {BF16_MIN_SPEEDUP}x faster on this CPU")
    reason = (f"dtype auto -> {dtype}: {MATMUL_SIZE}^3 matmul, one thread, fp32 "
              f"{fp32_gflops:.1f} GFLOP/s, bf16 {bf16_gflops:.1f} GFLOP/s "
              f"(bf16 {speedup:.2f}x; {verdict})")
    return PrecisionChoice(dtype, reason, fp32_gflops, bf16_gflops)


def time_matmul(dtype: torch.dtype, size: int = MATMUL_SIZE, repeats: int = REPEATS) -> float:
    """Best-of-`repeats` CPU seconds of one `size`^3 matmul in `dtype`, on one thread."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=generator).to(dtype)
    b = torch.randn(size, size, generator=generator).to(dtype)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a @ b  # warm-up: the first call picks and prepares the kernel
        best = float("inf")
        for _ in range(repeats):
            start = time.thread_time()
            a @ b
            best = min(best, time.thread_time() - start)
    finally:
        torch.set_num_threads(threads)
    return max(best, 1e-9)  # a clock tick coarser than the matmul must not divide by zero


@functools.cache
def measure_cpu_dtype() -> PrecisionChoice:
    """Time fp32 vs bf16 on this CPU and decide; measured once per process."""
    return choose_cpu_dtype(time_matmul(torch.float32), time_matmul(torch.bfloat16))


def resolve_dtype(requested: str, device: torch.device) -> PrecisionChoice:
    """`requested` is a DTYPES key or "auto": an explicit choice is kept as given."""
    if requested != "auto":
        return PrecisionChoice(requested, f"dtype {requested} (as requested)")
    if device.type == "cuda":
        # including_emulation=False: by default torch also counts a V100's (sm70) bf16, which
        # it emulates with fp32 instructions, far slower than the native fp16 tensor cores.
        dtype = "bf16" if torch.cuda.is_bf16_supported(including_emulation=False) else "fp16"
        return PrecisionChoice(dtype, f"dtype auto -> {dtype} (CUDA: bf16 if the GPU runs it "
                                      "natively, sm80+, else fp16 with loss scaling)")
    return measure_cpu_dtype()
