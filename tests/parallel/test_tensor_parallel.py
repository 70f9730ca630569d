"""Our tensor-parallel pieces against references, on 2 gloo ranks: the column/row linear pair
against torch DTensor's ColwiseParallel/RowwiseParallel on the same weights, the vocab-parallel
loss against F.cross_entropy on the full logits, gather/scatter against slicing, and the TP
model's gathered logits against the whole model's (training under TP is checked against one
process in test_grid_training.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from model.lora import LoraConfig, LoraLinear, apply_lora, linear_with_weight
from parallel.layout_neutral_checkpoint import gather_full_tensors
from parallel.local_ranks import run_on_ranks
from parallel.parallel_dims import ParallelDims
from parallel.tensor_parallel.collectives import gather_from_region, scatter_to_region
from parallel.tensor_parallel.cross_entropy import vocab_parallel_cross_entropy
from parallel.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from parallel.tensor_parallel.sharding import ShardLayout, shard_tensor, unshard_tensors
from parallel_plan.llama_tensor_parallel import layout_for, layouts_of, parallelize_model
from tests.model.model_helpers import random_batch, small_model


def _linear_pair_matches_dtensor(rank: int, world_size: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    dims = ParallelDims(world_size, tensor_parallel=world_size).build_groups()
    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(16, 24, bias=False), nn.Linear(24, 16, bias=False))
    up, down = (layer.weight.detach().clone() for layer in reference)
    parallelize_module(reference, init_device_mesh("cpu", (world_size,)),
                       {"0": ColwiseParallel(), "1": RowwiseParallel()})
    column = ColumnParallelLinear(shard_tensor(up, ShardLayout(0, (24,)), rank, world_size),
                                  dims.tp_group, sequence_parallel=False)
    row = RowParallelLinear(shard_tensor(down, ShardLayout(1, (24,)), rank, world_size),
                            dims.tp_group, sequence_parallel=False)
    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(7))
    x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    ours, theirs = row(column(x_ours)), reference(x_theirs)
    torch.testing.assert_close(ours, theirs)
    ours.square().sum().backward()
    theirs.square().sum().backward()
    torch.testing.assert_close(x_ours.grad, x_theirs.grad)
    torch.testing.assert_close(column.weight.grad, reference[0].weight.grad.to_local())
    torch.testing.assert_close(row.weight.grad, reference[1].weight.grad.to_local())


def _vocab_parallel_loss_matches_cross_entropy(rank: int, world_size: int) -> None:
    dims = ParallelDims(world_size, tensor_parallel=world_size).build_groups()
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(12, 40, generator=generator) * 3
    labels = torch.randint(0, 40, (12,), generator=generator)
    labels[[2, 7]] = -100
    full = logits.clone().requires_grad_()
    expected = F.cross_entropy(full, labels, reduction="none")
    weights = torch.rand(12, generator=generator)  # a different gradient per token
    (expected * weights).sum().backward()
    local = logits.chunk(world_size, dim=-1)[rank].clone().requires_grad_()
    losses = vocab_parallel_cross_entropy(local, labels, rank * 40 // world_size, dims.tp_group)
    torch.testing.assert_close(losses, expected)
    (losses * weights).sum().backward()
    torch.testing.assert_close(local.grad, full.grad.chunk(world_size, dim=-1)[rank])


def _gather_and_scatter_match_slicing(rank: int, world_size: int) -> None:
    """scatter = take my columns, gather = concatenate everyone's; each backward is the other."""
    dims = ParallelDims(world_size, tensor_parallel=world_size).build_groups()
    generator = torch.Generator().manual_seed(11)
    full, weights = torch.randn(4, 6, generator=generator), torch.randn(4, 6, generator=generator)
    x = full.clone().requires_grad_()
    mine = scatter_to_region(x, dims.tp_group)
    assert torch.equal(mine, full.chunk(world_size, dim=-1)[rank])
    (mine * weights.chunk(world_size, dim=-1)[rank]).sum().backward()
    torch.testing.assert_close(x.grad, weights)  # every rank's slice of the gradient
    x_mine = full.chunk(world_size, dim=-1)[rank].clone().requires_grad_()
    gathered = gather_from_region(x_mine, dims.tp_group)
    assert torch.equal(gathered, full)
    (gathered * weights).sum().backward()
    torch.testing.assert_close(x_mine.grad, weights.chunk(world_size, dim=-1)[rank])


def _tensor_parallel_logits_match_the_model(rank: int, world_size: int) -> None:
    """Without labels the head gathers the full logits (generation, evaluation)."""
    dims = ParallelDims(world_size, tensor_parallel=world_size).build_groups()
    reference = small_model("gqa", seed=0)
    model = parallelize_model(small_model("gqa", seed=0), dims, sequence_parallel=False)
    input_ids = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(model(input_ids).logits, reference(input_ids).logits)


def _odd_vocabulary_is_padded_and_never_predicted(rank: int, world_size: int) -> None:
    """A vocabulary of 253 on T=2: each rank holds 127 rows, the last one padding. Logits,
    loss and the embedding/head gradients (gathered whole: real rows only) equal the whole
    model's, tied or not; the padding row's logit never wins and its gradient is 0."""
    dims = ParallelDims(world_size, tensor_parallel=world_size).build_groups()
    input_ids, labels = random_batch(2, 8)
    input_ids, labels = input_ids % 253, labels.masked_fill(labels >= 253, 252)
    labels[0, :3] = 252  # the last real token, beside the padding row
    for tied in (True, False):
        odd = dict(vocab_size=253, vocab_size_multiple=1, tie_word_embeddings=tied)
        reference = small_model("gqa", seed=0, **odd)
        model = parallelize_model(small_model("gqa", seed=0, **odd), dims, False)
        assert model.lm_head.weight.shape[0] == 127
        torch.testing.assert_close(model(input_ids).logits, reference(input_ids).logits)
        for each in (model, reference):
            each(input_ids, labels=labels).loss.backward()
        torch.testing.assert_close(model(input_ids, labels=labels).loss,
                                   reference(input_ids, labels=labels).loss)
        grads = {name: param.grad for name, param in model.named_parameters()}
        whole = gather_full_tensors(grads, layouts_of(model.config), dims)
        if rank == world_size - 1:
            assert torch.count_nonzero(model.lm_head.weight.grad[-1]) == 0
        if rank == 0:
            for name, param in reference.named_parameters():
                torch.testing.assert_close(whole[name], param.grad, msg=name)


def _check_all(rank: int, world_size: int) -> None:
    _linear_pair_matches_dtensor(rank, world_size)
    _vocab_parallel_loss_matches_cross_entropy(rank, world_size)
    _gather_and_scatter_match_slicing(rank, world_size)
    _tensor_parallel_logits_match_the_model(rank, world_size)
    _odd_vocabulary_is_padded_and_never_predicted(rank, world_size)


def test_tensor_parallel_pieces_match_references():
    run_on_ranks(_check_all, world_size=2, timeout=600)


def test_unshard_inverts_shard_of_fused_blocks():
    full = torch.randn(14, 6)  # blocks of 8, 2 and 4 rows: a fused q/k/v with GQA
    layout = ShardLayout(0, (8, 2, 4))
    shards = [shard_tensor(full, layout, rank, 2) for rank in range(2)]
    assert torch.equal(shards[1], torch.cat([full[4:8], full[9:10], full[12:14]]))
    assert torch.equal(unshard_tensors(shards, layout), full)


def test_a_block_that_size_does_not_divide_is_zero_padded():
    """5 vocabulary rows on T=2 (sharding.py's worked example) and on T=3."""
    full = torch.randn(5, 4)
    layout = ShardLayout(0, (5,))
    shards = [shard_tensor(full, layout, rank, 2) for rank in range(2)]
    assert torch.equal(shards[0], full[:3])
    assert torch.equal(shards[1], torch.cat([full[3:], torch.zeros(1, 4)]))
    assert torch.equal(unshard_tensors(shards, layout), full)
    assert torch.equal(unshard_tensors([shard_tensor(full, layout, rank, 3) for rank in range(3)],
                                       layout), full)


def test_lora_adapters_are_sliced_like_their_weight():
    """`layout_for` cuts each adapter where it cuts its base weight: on every rank of T=2, the
    LoraLinear made of the slices (column-parallel q/k/v and gate/up: B's rows; row-parallel o
    and down: A's columns), merged, is that rank's slice of the whole merged weight."""
    config = LoraConfig(rank=3, alpha=6.0)  # every projection
    model = apply_lora(small_model("gqa", seed=0), config)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:  # B is zero at the start: make the update nonzero
                param.normal_()
    for layer_name, layer in model.named_modules():
        if not isinstance(layer, LoraLinear):
            continue
        layer_name = layer_name.rsplit(".", 1)[1]  # e.g. qkv_proj

        def local(name: str, tensor: torch.Tensor, rank: int, layer_name=layer_name):
            layout = layout_for(f"{layer_name}.{name}", model.config)
            return tensor.detach() if layout is None else shard_tensor(tensor.detach(),
                                                                       layout, rank, 2)
        weight_layout = layout_for(f"{layer_name}.weight", model.config)
        whole = LoraLinear(linear_with_weight(nn.Parameter(layer.weight.detach().clone())),
                           layer.row_slices, config,
                           {name: (layer.lora_A[name], layer.lora_B[name])
                            for name in layer.lora_A})
        whole.merge()
        for rank in range(2):
            row_slices = ([(name, rows // 2) for name, rows in layer.row_slices]
                          if weight_layout.dim == 0 else layer.row_slices)
            sliced = LoraLinear(
                linear_with_weight(nn.Parameter(local("weight", layer.weight, rank))),
                row_slices, config,
                {name: (local(f"lora_A.{name}", layer.lora_A[name], rank),
                        local(f"lora_B.{name}", layer.lora_B[name], rank))
                 for name in layer.lora_A})
            sliced.merge()
            torch.testing.assert_close(sliced.weight,
                                       shard_tensor(whole.weight, weight_layout, rank, 2),
                                       msg=f"{layer_name}, rank {rank}")
