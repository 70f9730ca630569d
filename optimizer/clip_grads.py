"""Global gradient-norm clipping and the fp16 inf/NaN check, correct across ranks.

"Global" means the L2 norm of *all* gradient elements of the model, each counted exactly once:

- Replicated grads (plain DDP, all-reduce): after `finish_grad_sync()` every rank holds the same
  full averaged gradient, so each rank computes the norm locally and gets the global value.
  All-reducing it would count every element W times (a sqrt(W) too large norm).
- Sharded grads (ZeRO-1, reduce-scatter): rank r holds only its shard, and the shards partition
  the grad buffers (padding is zero and adds nothing). Each rank sums the squares of its own
  elements, one all-reduce(SUM) adds the W partial sums, and the square root gives the norm:
      ||g||^2 = sum_r sum_{i in shard r} g_i^2.

The inf/NaN flag is always all-reduced with MAX, so that every rank skips the same steps even if
only one rank's shard overflowed (a rank that stepped alone would desynchronise the model).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

# torch.nn.utils.clip_grad_norm_ divides by (norm + 1e-6); we use the same epsilon so our
# clipping matches torch's bit for bit on the same gradient.
_CLIP_EPS = 1e-6


def _is_distributed(group: dist.ProcessGroup | None) -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def _all_reduce(value: Tensor, op: dist.ReduceOp, group: dist.ProcessGroup | None) -> Tensor:
    """all_reduce that also takes CPU tensors under NCCL (which reduces CUDA tensors only):
    with ZeRO-1's CPU offload the grads, hence the norm and the inf flag, live on the CPU."""
    if not value.is_cuda and dist.get_backend(group) == "nccl":
        return _all_reduce(value.cuda(), op, group).to(value.device)
    dist.all_reduce(value, op=op, group=group)
    return value


def global_grad_norm(grads: list[Tensor], *, sharded: bool,
                     group: dist.ProcessGroup | None = None) -> float:
    """L2 norm of all gradient elements (fp32 tensors). `sharded=True`: the ranks of `group`
    (None = world) each hold a disjoint part of the gradient (ZeRO-1); False: every rank holds
    all of it (replicated)."""
    device = grads[0].device if grads else torch.device("cpu")
    if grads:
        # One norm per tensor (a fused kernel on CUDA), then the norm of those norms.
        per_tensor = torch._foreach_norm(grads, 2.0)
        local_sq = torch.linalg.vector_norm(torch.stack(per_tensor)).square()
    else:
        local_sq = torch.zeros((), device=device)
    if sharded and _is_distributed(group):
        # W partial sums: add them in double precision
        local_sq = _all_reduce(local_sq.to(torch.float64), dist.ReduceOp.SUM, group)
    return float(local_sq.sqrt())


def clip_grads_(grads: list[Tensor], max_norm: float, total_norm: float) -> None:
    """Scale all grads in place by min(1, max_norm / (total_norm + 1e-6)), like torch's
    clip_grad_norm_; every rank uses the same `total_norm`, so the clip is consistent."""
    clip_coef = max_norm / (total_norm + _CLIP_EPS)
    if clip_coef < 1.0 and grads:
        torch._foreach_mul_(grads, clip_coef)


def unscale_and_check_for_inf_(grads: list[Tensor], inv_scale: float,
                               group: dist.ProcessGroup | None) -> bool:
    """Multiply fp32 grads by 1/S in place; return True if any rank saw an inf or NaN."""
    device = grads[0].device if grads else torch.device("cpu")
    found_inf = torch.zeros(1, device=device)
    if grads:
        # The same fused kernel torch.amp.GradScaler uses: one pass does the multiply and sets
        # found_inf to 1.0 when any element is not finite (CPU and CUDA).
        torch._amp_foreach_non_finite_check_and_unscale_(
            grads, found_inf, torch.full((), inv_scale, device=device))
    if _is_distributed(group):
        found_inf = _all_reduce(found_inf, dist.ReduceOp.MAX, group)
    return bool(found_inf.item() > 0)
