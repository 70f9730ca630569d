"""Metrics plumbing: metrics.jsonl survives a torn last line; throughput and MFU arithmetic."""

from __future__ import annotations

import json
import random

import pytest
import torch

import trainer.throughput as throughput
from trainer.distributed_env import DistributedEnv
from trainer.metrics import MetricsLogger, read_metrics
from trainer.throughput import ThroughputMeter


def test_logger_appends_records_and_reader_skips_a_torn_line(tmp_path):
    log = MetricsLogger(tmp_path)
    values = [random.random() for _ in range(3)]
    for step, value in enumerate(values):
        log.log("train", step, quiet=True, loss=value)
    log.close()
    with open(tmp_path / "metrics.jsonl", "ab") as handle:
        # a crash mid-line, in the middle of a 2-byte UTF-8 character ("é" is C3 A9)
        handle.write(b'{"kind": "samples", "step": 3, "text": "caf\xc3')
    records = read_metrics(tmp_path)
    assert [r["loss"] for r in records] == values
    assert all(json.loads(line) for line in (tmp_path / "metrics.jsonl").read_bytes()
               .splitlines()[:3])
    silent = MetricsLogger(tmp_path / "rank1", enabled=False)
    silent.log("train", 0, loss=1.0)
    assert not (tmp_path / "rank1").exists()


class FakeModel:
    def __init__(self, flops):
        self.flops = flops

    def num_flops_per_token(self, seq_len):
        return self.flops * seq_len


def test_tokens_per_sec_and_mfu(monkeypatch):
    clock = iter([0.0, 0.5, 1.0, 3.0])  # two steps: 0.5 s and 2.0 s
    monkeypatch.setattr(throughput.time, "perf_counter", lambda: next(clock))
    world_size, peak, flops = 2, 1e12, random.randint(1000, 5000)
    env = DistributedEnv(0, world_size, 0, world_size, torch.device("cpu"))
    meter = ThroughputMeter(FakeModel(flops), 8, "bf16", peak, env)
    batch = {"input_ids": torch.zeros(4, 8, dtype=torch.long),
             "labels": torch.zeros(4, 8, dtype=torch.long)}
    for _ in range(2):
        meter.start_step()
        meter.count_batch(batch)
        assert meter.local_step_tokens == 32  # labels are not counted
        meter.end_step(global_tokens=64, comm_bytes=1000)
    report = meter.report()
    tokens_per_sec = 128 / 2.5
    assert report["tokens_per_sec"] == pytest.approx(tokens_per_sec)
    assert report["step_time"] == pytest.approx(1.25)
    assert report["comm_bytes_per_step"] == 1000
    # MFU = achieved FLOP/s per device / peak FLOP/s per device
    assert report["mfu"] == pytest.approx(tokens_per_sec * flops * 8 / world_size / peak)
    assert meter.summary()["tokens_per_sec"] == pytest.approx(tokens_per_sec)


def test_no_mfu_without_a_known_peak():
    env = DistributedEnv(0, 1, 0, 1, torch.device("cpu"))
    meter = ThroughputMeter(FakeModel(10), 8, "fp32", None, env)
    meter.start_step()
    meter.end_step(global_tokens=8, comm_bytes=0)
    assert "mfu" not in meter.report()
