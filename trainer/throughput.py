"""Speed and cost of training: tokens/s, step time, MFU, memory, bytes communicated.

MFU (model FLOPs utilisation, PaLM appendix B) = achieved model FLOP/s / peak FLOP/s, where
achieved = tokens/s × training FLOPs per token (`model.num_flops_per_token(seq_len)`: 6N +
12·L·H·Q·T, of the whole model: `whole_shape`, however it is split). Recomputation (activation
checkpointing) and DPO's reference forward are not counted: MFU measures useful work. The peak
is `--peak_flops`, or looked up for GPUs we know; on a CPU there is no meaningful peak, so MFU
is not reported.
"""

from __future__ import annotations

import resource
import time
from typing import Any

import torch

from model.configuration_z2all import Z2allConfig
from model.modeling_z2all import Z2allForCausalLM
from trainer.distributed_env import DistributedEnv

# Dense (no sparsity) bf16/fp16 tensor-core peak per GPU, from the vendors' datasheets.
PEAK_FLOPS_16BIT = {
    "H200": 989e12,   # NVIDIA H200 SXM
    "H100": 989e12,   # NVIDIA H100 SXM (the PCIe card is lower: pass --peak_flops)
    "A100": 312e12,   # NVIDIA A100
    "L40S": 362e12,   # NVIDIA L40S
    "A10G": 70e12,    # NVIDIA A10G (AWS g5)
    "4090": 165e12,   # NVIDIA GeForce RTX 4090 (fp32 accumulate)
}


def default_peak_flops(device: torch.device, dtype_name: str) -> float | None:
    if device.type != "cuda" or dtype_name == "fp32":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_FLOPS_16BIT.items() if key in name), None)


def whole_shape(config: Z2allConfig) -> Z2allForCausalLM:
    """The whole model without memory (its parameter and adapter counts and FLOPs, however it
    is split over ranks): the meter counts the whole model's FLOPs per token, not those of
    the pipeline stage or tensor shard this rank holds."""
    with torch.device("meta"):
        return Z2allForCausalLM(config)


def _batch_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Tokens the model computes on (padding included): every *input_ids tensor."""
    return sum(value.numel() for key, value in batch.items() if key.endswith("input_ids"))


def peak_memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # Linux: KiB -> GB


class ThroughputMeter:
    """Accumulates between two `report()` calls; `summary()` covers the whole invocation."""

    def __init__(self, model: Any, seq_len: int, dtype_name: str, peak_flops: float | None,
                 env: DistributedEnv) -> None:
        self.env = env
        self.flops_per_token = model.num_flops_per_token(seq_len)
        self.peak_flops = peak_flops or default_peak_flops(env.device, dtype_name)
        self._interval_tokens = self._interval_time = self._interval_steps = 0
        self._total_tokens = self._total_time = 0.0
        self._comm_bytes = 0
        self._local_tokens = 0
        self._step_start = 0.0

    def start_step(self) -> None:
        self._step_start = time.perf_counter()
        self._local_tokens = 0

    def count_batch(self, batch: dict[str, torch.Tensor]) -> None:
        self._local_tokens += _batch_tokens(batch)

    @property
    def local_step_tokens(self) -> int:
        return self._local_tokens

    def end_step(self, global_tokens: float, comm_bytes: int) -> None:
        seconds = time.perf_counter() - self._step_start
        self._interval_tokens += global_tokens
        self._interval_time += seconds
        self._interval_steps += 1
        self._total_tokens += global_tokens
        self._total_time += seconds
        self._comm_bytes += comm_bytes

    def _rates(self, tokens: float, seconds: float) -> dict[str, float]:
        tokens_per_sec = tokens / max(seconds, 1e-9)
        rates = {"tokens_per_sec": tokens_per_sec}
        if self.peak_flops:
            achieved = tokens_per_sec * self.flops_per_token / self.env.world_size
            rates["mfu"] = achieved / self.peak_flops
        return rates

    def report(self) -> dict[str, float]:
        """Rates since the last report (then reset)."""
        steps = max(self._interval_steps, 1)
        metrics = {**self._rates(self._interval_tokens, self._interval_time),
                   "step_time": self._interval_time / steps,
                   "comm_bytes_per_step": self._comm_bytes / steps,
                   "memory_gb": peak_memory_gb(self.env.device)}
        self._interval_tokens = self._interval_time = self._interval_steps = 0
        self._comm_bytes = 0
        return metrics

    def summary(self) -> dict[str, float]:
        return {**self._rates(self._total_tokens, self._total_time),
                "train_seconds": self._total_time, "flops_per_token": self.flops_per_token,
                "peak_flops": self.peak_flops or 0.0,
                "memory_gb": peak_memory_gb(self.env.device)}
