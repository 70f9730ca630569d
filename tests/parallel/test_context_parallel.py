"""Context parallelism against references: ring attention on C gloo ranks (C = 2, 4) equals the
model's own attention (`model.kernels.attention`, SDPA with the model's masks) on the whole
sequence, outputs and dQ, dK, dV, for causal, padded and packed rows with GQA; so do the merge
rule and the block backward on their own; the load-balanced split and gather round-trip; the
skipped blocks are exactly the causally masked ones; and torch's experimental
context_parallel is tried on the same shards. With flash-attn emulated on the CPU
(tests/fake_gpu_libs: the real call signatures, input checks and lse layouts) every block's
forward runs on the kernel, and the ring still equals full attention; the run says which
kernel its blocks use, and why not flash-attn."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.distributed as dist

from model import kernels
from model.attention import attention_layout_for
from parallel.context_parallel import flash_blocks
from parallel.context_parallel.block_attention import (
    allowed_pairs,
    attend_block,
    block_grads,
    merge_into,
)
from parallel.context_parallel.load_balance import (
    gather_sequence,
    held_positions,
    shard_sequence,
    unshard_sequence,
)
from parallel.context_parallel.ring_attention import block_work, ring_attention
from parallel.local_ranks import run_on_ranks
from tests.fake_gpu_libs import CALLS
from tests.model.test_gpu_kernels_emulated import use_emulated_gpu_libraries

BATCH, HEADS, KV_HEADS, HEAD_DIM = 2, 4, 2, 8


def _sample_ids(case: str, seq_len: int) -> torch.Tensor | None:
    """The key padding mask of each case, as the model takes it (0 = padding, else the
    sample's number); samples and padding cross the chunk boundaries on purpose."""
    if case == "causal":
        return None
    row = torch.arange(seq_len)
    if case == "padded":  # right-padded row, left-padded row
        return torch.stack([row < seq_len - 5, row >= 3]).long()
    # packed (--pack_samples): 3 samples then padding; 2 samples
    first = torch.bucketize(row, torch.tensor([5, 11, 14]), right=True) + 1
    return torch.stack([torch.where(row < 14, first, 0), (row >= 9).long() + 1])


def _full_inputs(seq_len: int) -> list[torch.Tensor]:
    """query, key, value (GQA: fewer key/value heads) and the loss weights, in fp64."""
    generator = torch.Generator().manual_seed(seq_len)
    shapes = [(HEADS, HEAD_DIM), (KV_HEADS, HEAD_DIM), (KV_HEADS, HEAD_DIM), (HEADS, HEAD_DIM)]
    return [torch.randn(BATCH, seq_len, *shape, generator=generator, dtype=torch.float64)
            for shape in shapes]


def _ring_matches_full_attention(rank: int, world_size: int, seq_len: int,
                                 cases: list[tuple[str, torch.dtype]]) -> None:
    """Each case: a mask and the dtype of the inputs; the reference runs in fp64 on the same
    (rounded) inputs, and bf16 is compared at bf16's precision."""
    group = dist.group.WORLD
    for case, dtype in cases:
        sample_ids = _sample_ids(case, seq_len)
        query, key, value, weights = (tensor.to(dtype).double() for tensor in
                                      _full_inputs(seq_len))
        full = [tensor.clone().requires_grad_() for tensor in (query, key, value)]
        layout = attention_layout_for(sample_ids, seq_len, 0, torch.device("cpu"),
                                      use_flash=False)
        expected = kernels.attention(*full, layout)
        (expected * weights).sum().backward()

        mine = [shard_sequence(tensor, rank, world_size).to(dtype).requires_grad_()
                for tensor in (query, key, value)]
        my_ids = None if sample_ids is None else shard_sequence(sample_ids, rank, world_size)
        out = ring_attention(*mine, group, sample_ids=my_ids)
        (out * shard_sequence(weights, rank, world_size).to(dtype)).sum().backward()

        tolerance = {} if dtype == torch.float64 else {"atol": 2e-2, "rtol": 2e-2}
        pairs = [("out", out, expected)] + [(f"d{name}", ours.grad, reference.grad)
                                            for name, ours, reference in zip("qkv", mine, full)]
        for name, ours, reference in pairs:
            torch.testing.assert_close(ours, shard_sequence(reference, rank, world_size)
                                       .to(dtype), **tolerance,
                                       msg=lambda text, what=f"{case} {dtype} {name}":
                                       f"{what}: {text}")
        torch.testing.assert_close(gather_sequence(out.detach(), group),
                                   expected.detach().to(dtype), **tolerance)


def test_ring_attention_equals_full_attention_on_2_ranks():
    run_on_ranks(_ring_matches_full_attention, 16,
                 [("causal", torch.float64), ("padded", torch.float64),
                  ("packed", torch.float64), ("packed", torch.bfloat16)], world_size=2)


def test_ring_attention_equals_full_attention_on_4_ranks():
    run_on_ranks(_ring_matches_full_attention, 16,
                 [("causal", torch.float64), ("packed", torch.float64)], world_size=4)


def _ring_on_emulated_flash_attn(rank: int, world_size: int, seq_len: int,
                                 cases: list[tuple[str, torch.dtype]]) -> dict[str, dict]:
    """`_ring_matches_full_attention` with flash-attn emulated, once per release layout of
    the varlen lse (unpadded since 2.6, padded before); the kernel calls of each."""
    calls = {}
    with pytest.MonkeyPatch.context() as monkeypatch:
        use_emulated_gpu_libraries(monkeypatch)
        for version in ("2.8.3", "2.5.9"):
            monkeypatch.setattr(sys.modules["flash_attn"], "__version__", version)
            CALLS.clear()
            _ring_matches_full_attention(rank, world_size, seq_len, cases)
            calls[version] = dict(CALLS)
    return calls


def test_ring_attention_on_emulated_flash_attn_equals_full_attention():
    cases = [("causal", torch.bfloat16), ("padded", torch.bfloat16),
             ("packed", torch.bfloat16)]
    for calls in run_on_ranks(_ring_on_emulated_flash_attn, 16, cases, world_size=2):
        # every block's forward on the kernel: C = 2 blocks per rank and case
        assert calls == {version: {"flash_attn_func": 2, "flash_attn_varlen_func": 4}
                         for version in ("2.8.3", "2.5.9")}


def test_ring_reports_its_block_kernel_and_why_not_flash_attn(monkeypatch):
    cpu = torch.device("cpu")
    assert flash_blocks.ring_kernel(cpu, torch.bfloat16, HEAD_DIM) == (
        "ring (context parallel; plain matmul/softmax blocks in fp32: "
        f"{flash_blocks.flash_kernels.func.missing_reason or 'cpu: no GPU kernel'})")
    use_emulated_gpu_libraries(monkeypatch)
    assert flash_blocks.ring_kernel(cpu, torch.bfloat16, HEAD_DIM) == (
        "ring (context parallel; flash-attn block forwards, plain backward in fp32)")
    assert flash_blocks.ring_kernel(cpu, torch.float32, HEAD_DIM) == (
        "ring (context parallel; plain matmul/softmax blocks in fp32: float32: flash-attn "
        "runs fp16/bf16 only)")


@pytest.mark.parametrize("cp_size", [1, 2, 4])
def test_shard_and_unshard_round_trip(cp_size):
    tokens = torch.arange(2 * 16 * 3).view(2, 16, 3)
    shards = [shard_sequence(tokens, rank, cp_size) for rank in range(cp_size)]
    assert torch.equal(unshard_sequence(shards), tokens)
    for rank, shard in enumerate(shards):
        assert torch.equal(held_positions(rank, cp_size, 16), shard[0, :, 0] // 3)
    assert sorted(torch.cat(shards, dim=1)[0, :, 0].tolist()) == tokens[0, :, 0].tolist()


def test_held_positions_worked_example_and_odd_length():
    assert held_positions(0, 2, 8).tolist() == [0, 1, 6, 7]
    assert held_positions(1, 2, 8).tolist() == [2, 3, 4, 5]
    with pytest.raises(ValueError, match="not divisible by 2 x context_parallel"):
        shard_sequence(torch.zeros(1, 12), 0, 4)


@pytest.mark.parametrize("cp_size", [2, 4])
def test_skipped_blocks_are_exactly_the_masked_pairs(cp_size):
    """Every causally allowed pair is computed, every computed block off the diagonal is fully
    allowed, and every rank computes the same number of scores (the load balance)."""
    chunk_len, seq_len = 3, 6 * cp_size
    work_per_rank = []
    for rank in range(cp_size):
        query_pos = held_positions(rank, cp_size, seq_len)
        work = 0
        for source in range(cp_size):
            key_pos = held_positions(source, cp_size, seq_len)
            allowed = key_pos[None, :] <= query_pos[:, None]
            queries, keys = block_work(rank, source, chunk_len)
            computed = torch.zeros_like(allowed)
            computed[queries, keys] = True
            assert not (allowed & ~computed).any(), (rank, source)
            assert source == rank or allowed[queries, keys].all(), (rank, source)
            work += int(computed.sum())
        work_per_rank.append(work)
    assert len(set(work_per_rank)) == 1, work_per_rank


def _torch_context_parallel_or_why_not(rank: int, world_size: int) -> str:
    """Our ring against torch's on the same head-tail shards; '' when they agree, else why
    torch's cannot run here."""
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    query, key, value, _ = _full_inputs(16)
    key, value = (tensor.repeat_interleave(HEADS // KV_HEADS, dim=2) for tensor in (key, value))
    mine = [shard_sequence(tensor, rank, world_size) for tensor in (query, key, value)]
    ours = ring_attention(*mine, dist.group.WORLD)
    heads_first = [tensor.transpose(1, 2).contiguous() for tensor in (query, key, value)]
    try:  # its default load balancer is head-tail for causal attention: the same shards
        with context_parallel(init_device_mesh("cpu", (world_size,)), buffers=heads_first,
                              buffer_seq_dims=[2, 2, 2]):
            theirs = F.scaled_dot_product_attention(*heads_first, is_causal=True)
    except NotImplementedError as error:
        return f"{type(error).__name__}: {error}"
    torch.testing.assert_close(ours, theirs.transpose(1, 2))
    return ""


def test_ring_attention_equals_torch_context_parallel():
    why_not = run_on_ranks(_torch_context_parallel_or_why_not, world_size=2)[0]
    if why_not:
        pytest.skip("torch's context_parallel shards only the CUDA SDPA kernels (flash, "
                    "efficient, cudnn); on CPU SDPA runs another op, so it does not run "
                    f"here: {why_not}")


@pytest.mark.parametrize("query_tile", [12, 5], ids=["one_tile", "tiles_of_5"])
def test_merged_blocks_and_block_grads_equal_full_attention(query_tile):
    """The arithmetic alone, one process: attention on two key blocks merged with the lse rule,
    and the blocks' gradients from the final lse, equal SDPA on all keys (a padded, packed
    mask; GQA); the same when the queries go through in tiles (the last one shorter)."""
    query, key, value, weights = (tensor[:, :12] for tensor in _full_inputs(16))
    sample_ids = torch.tensor([[1, 1, 1, 1, 2, 2, 2, 2, 2, 3, 0, 0],   # packed, then padding
                               [0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]])  # left-padded
    full = [tensor.clone().requires_grad_() for tensor in (query, key, value)]
    layout = attention_layout_for(sample_ids, 12, 0, torch.device("cpu"), use_flash=False)
    expected = kernels.attention(*full, layout)
    (expected * weights).sum().backward()

    positions, scale = torch.arange(12), HEAD_DIM ** -0.5
    blocks = [slice(0, 5), slice(5, 12)]
    masks = [allowed_pairs(positions, positions[keys], sample_ids, sample_ids[:, keys])
             for keys in blocks]
    out, lse = attend_block(query, key[:, blocks[0]], value[:, blocks[0]], masks[0], scale,
                            query_tile)
    merge_into(out, lse, *attend_block(query, key[:, blocks[1]], value[:, blocks[1]],
                                       masks[1], scale, query_tile))
    torch.testing.assert_close(out, expected.detach())

    delta = (weights * out).sum(dim=-1)
    grads = [block_grads(query, key[:, keys], value[:, keys], mask, scale, lse, weights, delta,
                         query_tile)
             for keys, mask in zip(blocks, masks)]
    torch.testing.assert_close(grads[0][0] + grads[1][0], full[0].grad)
    for index, reference in ((1, full[1].grad), (2, full[2].grad)):
        torch.testing.assert_close(torch.cat([grads[0][index], grads[1][index]], dim=1),
                                   reference)
