"""The llama feed-forward block: down(SiLU(gate(x)) * up(x)) (SwiGLU, Shazeer 2020).

`gate_proj` and `up_proj` are stored as one matrix `gate_up_proj` (rows: gate, then up), so the
two projections are one matmul: fewer, larger GEMMs are faster on every device. Conversion to
HF Llama splits it back (`model/hf_llama_mapping.py`).
"""

from __future__ import annotations

import torch
from torch import nn

from model import kernels
from model.configuration_z2all import Z2allConfig


class SwiGLUMLP(nn.Module):
    def __init__(self, config: Z2allConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size,
                                      bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(kernels.swiglu(gate, up))
