"""`OverlappedAdamW.state_bytes()` counts what it keeps on top of the model: the same bytes as
torch AdamW's state for the same parameters (reference), plus the fp32 masters of bf16 params."""

from __future__ import annotations

import copy

import torch

from optimizer.overlapped_adamw import OverlappedAdamW
from parallel.distributed_data_parallel import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
)
from parallel.local_ranks import run_on_ranks
from tests.parallel.toy_models import make_batch, make_mlp, mse_loss


def _state_bytes(rank: int, world_size: int) -> tuple[int, int, int]:
    """(fp32 overlapped bytes, torch AdamW's bytes, bf16 overlapped bytes) after one step."""
    sizes = []
    for dtype in (torch.float32, torch.bfloat16):
        model = make_mlp(seed=rank).to(dtype)
        ddp = DistributedDataParallel(copy.deepcopy(model),
                                      DistributedDataParallelConfig(bucket_size=50))
        optimizer = OverlappedAdamW(ddp, lr=1e-2, params_dtype="bf16" if dtype != torch.float32
                                    else "fp32")
        inputs, targets = make_batch(rank, 0, 0)
        mse_loss(ddp, inputs.to(dtype), targets.to(dtype)).backward()
        ddp.finish_grad_sync()
        optimizer.step()
        sizes.append(optimizer.state_bytes())
    reference_model = make_mlp(seed=rank)
    reference = torch.optim.AdamW(reference_model.parameters(), lr=1e-2)
    inputs, targets = make_batch(rank, 0, 0)
    mse_loss(reference_model, inputs, targets).backward()
    reference.step()
    torch_bytes = sum(value.numel() * value.element_size() for state in reference.state.values()
                      for value in state.values() if isinstance(value, torch.Tensor))
    return sizes[0], torch_bytes, sizes[1]


def test_state_bytes_equal_torch_adamw_plus_fp32_masters() -> None:
    fp32_bytes, torch_bytes, bf16_bytes = run_on_ranks(_state_bytes, world_size=1)[0]
    num_params = sum(p.numel() for p in make_mlp(seed=0).parameters())
    assert fp32_bytes == torch_bytes > 0
    assert bf16_bytes == torch_bytes + 4 * num_params  # + fp32 master weights
