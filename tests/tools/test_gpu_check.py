"""tools/gpu_check.py and `make gpu-check` on a machine without a CUDA device: they must fail,
in one line that says so, instead of skipping every `cuda` test and passing. And what of the
`cuda` tests a CPU can check: every grid entry is collected, and skipped with the number of
GPUs it needs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.test_gpu_check import GRID_RUNS, grid_skip_reason
from tools import gpu_check

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU failure")


def test_preflight_fails_in_one_line_without_cuda(capsys):
    assert gpu_check.main() == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and "no CUDA device visible" in captured.err


def test_make_gpu_check_exits_non_zero_with_the_one_line_message():
    """The target itself, with this interpreter's venv standing in for the GPU venv."""
    venv = Path(sys.executable).parent.parent
    result = subprocess.run(["make", "--no-print-directory", "gpu-check", f"GPU_VENV={venv}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert result.stderr.splitlines()[0] == gpu_check.no_cuda_message()
    assert "passed" not in result.stdout and "skipped" not in result.stdout


def test_kernel_line_names_each_fallback_reason():
    line = gpu_check.kernel_line(torch.device("cpu"))
    assert line.startswith("kernels: attention=torch-sdpa (")
    assert "rms_norm=torch-fp32 (" in line and "adamw=torch-foreach (cpu: no fused kernel)" in line


def test_the_grid_entries_are_listed_and_each_says_how_many_gpus_it_needs():
    result = subprocess.run([sys.executable, "-m", "pytest", "-m", "cuda", "-vv", "-rs",
                             "-k", "grid", "-p", "no:cacheprovider", "tests/test_gpu_check.py"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:]
    for name, (_, ranks, *_) in GRID_RUNS.items():
        assert f"test_grid_on_nccl_trains_like_one_gpu[{name}] SKIPPED" in result.stdout
        assert grid_skip_reason(ranks, 0) in result.stdout
    assert f"{len(GRID_RUNS)} skipped" in result.stdout and "passed" not in result.stdout
