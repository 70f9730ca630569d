"""utils/precision.py: the `auto` decision from injected timings, and the measured path."""

from __future__ import annotations

import pytest
import torch

from utils import precision
from utils.precision import BF16_MIN_SPEEDUP, MATMUL_SIZE, choose_cpu_dtype, resolve_dtype


@pytest.mark.parametrize("fp32_seconds, bf16_seconds, expected", [
    (1.0, 30.0, "fp32"),                       # AVX2 only: bf16 emulated, ~30x slower
    (1.0, 1.0, "fp32"),                        # a tie is not worth bf16's rounding
    (1.0, 1.0 / (BF16_MIN_SPEEDUP - 0.01), "fp32"),   # just below the threshold
    (1.0, 1.0 / BF16_MIN_SPEEDUP, "bf16"),     # exactly the threshold
    (1.0, 0.5, "bf16"),                        # native bf16 (avx512_bf16 / AMX): ~2x
])
def test_choose_cpu_dtype_from_injected_timings(fp32_seconds, bf16_seconds, expected):
    choice = choose_cpu_dtype(fp32_seconds, bf16_seconds)
    assert choice.dtype == expected
    flops = 2 * MATMUL_SIZE ** 3  # the figures are the formula's, not made up
    assert choice.fp32_gflops == pytest.approx(flops / fp32_seconds / 1e9, rel=1e-3)
    assert choice.bf16_gflops == pytest.approx(flops / bf16_seconds / 1e9, rel=1e-3)
    assert f"-> {expected}" in choice.reason and "GFLOP/s" in choice.reason


def test_auto_on_cpu_uses_the_measurement_once(monkeypatch):
    calls = []

    def fake_time_matmul(dtype):
        calls.append(dtype)
        return {torch.float32: 1.0, torch.bfloat16: 0.25}[dtype]

    monkeypatch.setattr(precision, "time_matmul", fake_time_matmul)
    precision.measure_cpu_dtype.cache_clear()
    try:
        first = resolve_dtype("auto", torch.device("cpu"))
        second = resolve_dtype("auto", torch.device("cpu"))
    finally:
        precision.measure_cpu_dtype.cache_clear()
    assert first == second and first.dtype == "bf16"
    assert calls == [torch.float32, torch.bfloat16]  # once per process, not per call


def test_explicit_dtype_is_kept_without_measuring(monkeypatch):
    monkeypatch.setattr(precision, "time_matmul", lambda dtype: pytest.fail("measured"))
    assert resolve_dtype("bf16", torch.device("cpu")).dtype == "bf16"
    assert resolve_dtype("fp32", torch.device("cpu")).fp32_gflops is None


def test_time_matmul_restores_the_thread_count_and_returns_a_positive_time():
    threads = torch.get_num_threads()
    assert precision.time_matmul(torch.float32, size=32, repeats=2) > 0
    assert torch.get_num_threads() == threads


@pytest.mark.parametrize("capability, expected", [((7, 0), "fp16"), ((8, 0), "bf16")])
def test_auto_on_cuda_picks_bf16_only_where_it_is_native(monkeypatch, capability, expected):
    """torch's default answer counts a V100's emulated bf16 as supported; `auto` must not."""
    def is_bf16_supported(including_emulation: bool = True) -> bool:
        return capability >= (8, 0) or including_emulation  # torch/cuda/__init__.py's rule

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    choice = resolve_dtype("auto", torch.device("cuda"))
    assert choice.dtype == expected and f"-> {expected}" in choice.reason
