"""`python -m bench.bench_serve` measures only requests that succeeded: an engine failure stops it
with an error instead of printing a ratio (it once timed requests that all had failed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench import bench_serve
from server import engine as engine_module
from tests.model.model_helpers import small_model

REPO = Path(__file__).resolve().parents[2]

WORK = [([1, 2, 3], 5), ([4, 5, 6, 7], 3)]


def test_requests_run_to_their_budget_in_both_modes():
    torch.set_num_threads(1)
    model = small_model("gqa").eval()
    for max_batch_size in (1, 2):
        _, tokens = bench_serve.run_requests(model, max_batch_size, WORK)
        assert tokens == 5 + 3


def test_a_failing_engine_stops_the_bench(monkeypatch):
    def broken(*args):
        raise TypeError("argument of type 'int' is not iterable")

    monkeypatch.setattr(engine_module, "sample_next_token", broken)
    with pytest.raises(bench_serve.RequestFailed, match="2 of 2 requests failed"):
        bench_serve.run_requests(small_model("gqa").eval(), 2, WORK)


def test_smoke_mode_says_every_request_succeeded():
    result = subprocess.run([sys.executable, "-m", "bench.bench_serve", "--smoke"], cwd=REPO,
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "all 4 requests succeeded" in result.stdout
