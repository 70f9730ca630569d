"""Global grad norm, clipping and the inf check vs torch.nn.utils.clip_grad_norm_."""

from __future__ import annotations

import torch

from optimizer.clip_grads import clip_grads_, global_grad_norm, unscale_and_check_for_inf_
from parallel.local_ranks import run_on_ranks


def random_grads(seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator) for shape in [(7, 5), (13,), (3, 4, 2)]]


def test_replicated_norm_and_clip_match_torch():
    grads = random_grads(0)
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for param, grad in zip(params, grads):
        param.grad = grad.clone()
    expected_norm = torch.nn.utils.clip_grad_norm_(params, max_norm=0.5)
    norm = global_grad_norm(grads, sharded=False)
    clip_grads_(grads, 0.5, norm)
    assert abs(norm - float(expected_norm)) <= 1e-6 * float(expected_norm)
    for param, grad in zip(params, grads):
        torch.testing.assert_close(grad, param.grad, rtol=0, atol=0)


def _sharded_norm_and_inf(rank: int, world_size: int) -> tuple[float, bool, bool]:
    # Each rank holds a disjoint slice of every flattened gradient, as ZeRO-1 shards do.
    full = torch.cat([g.flatten() for g in random_grads(1)])
    mine = list(full.tensor_split(world_size)[rank].split(4))
    norm = global_grad_norm(mine, sharded=True)
    clean = unscale_and_check_for_inf_([t.clone() for t in mine], 0.25, group=None)
    if rank == 1:
        mine[0][0] = float("inf")  # only rank 1 overflows; both must agree to skip
    overflow = unscale_and_check_for_inf_(mine, 0.25, group=None)
    return norm, clean, overflow


def test_sharded_norm_counts_each_element_once_and_inf_is_agreed():
    results = run_on_ranks(_sharded_norm_and_inf, world_size=2)
    full = torch.cat([g.flatten() for g in random_grads(1)])
    expected = float(torch.nn.utils.get_total_norm([full]))
    for norm, clean, overflow in results:
        assert abs(norm - expected) <= 1e-6 * expected
        assert clean is False and overflow is True


def test_unscale_multiplies_by_inverse_scale():
    grads = random_grads(2)
    expected = [g * 0.125 for g in grads]
    assert unscale_and_check_for_inf_(grads, 0.125, group=None) is False
    for grad, want in zip(grads, expected):
        torch.testing.assert_close(grad, want, rtol=0, atol=0)
