"""parallel/flat_collectives.py: the flat reduce-scatter and all-gather under either torch name.

The GPU image this project first ran on (torch 2.11) has only the old names, and ZeRO-1's
reduce-scatter failed there with AttributeError. These tests take the new names away, as an
older torch lacks them, and check the fallbacks compute what the definition says on 2 ranks.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import parallel.flat_collectives as flat_collectives
from parallel.local_ranks import run_on_ranks


def _collectives_of_an_older_torch(monkeypatch):
    monkeypatch.delattr(dist, "reduce_scatter_single", raising=False)
    monkeypatch.delattr(dist, "all_gather_single", raising=False)
    return importlib.reload(flat_collectives)


def test_an_older_torch_gets_the_old_names(monkeypatch):
    module = _collectives_of_an_older_torch(monkeypatch)
    assert module.reduce_scatter_single is dist.reduce_scatter_tensor
    assert module.all_gather_single is dist.all_gather_into_tensor
    monkeypatch.undo()
    module = importlib.reload(flat_collectives)
    assert module.reduce_scatter_single is getattr(dist, "reduce_scatter_single",
                                                   dist.reduce_scatter_tensor)


def _scatter_then_gather(rank: int, world_size: int, older_torch: bool) -> tuple[list, list]:
    module = flat_collectives
    if older_torch:  # this rank's own process: the deletion is not undone, nor needs to be
        for name in ("reduce_scatter_single", "all_gather_single"):
            if hasattr(dist, name):
                delattr(dist, name)
        module = importlib.reload(flat_collectives)
    inputs = [torch.arange(6.0) * (r + 1) for r in range(world_size)]  # every rank's input
    shard = torch.empty(6 // world_size)
    module.reduce_scatter_single(shard, inputs[rank])
    whole = torch.empty(6)
    module.all_gather_single(whole, shard)
    return shard.tolist(), whole.tolist()


@pytest.mark.parametrize("older_torch", [False, True])
def test_reduce_scatter_then_all_gather_is_the_sum_on_every_rank(older_torch):
    expected_sum = sum(torch.arange(6.0) * (r + 1) for r in range(2))
    results = run_on_ranks(_scatter_then_gather, older_torch, world_size=2)
    for rank, (shard, whole) in enumerate(results):
        assert shard == expected_sum[rank * 3:(rank + 1) * 3].tolist()
        assert whole == expected_sum.tolist()


def test_no_code_calls_torch_by_either_name_directly():
    """Every flat collective goes through flat_collectives, so one torch rename is one edit."""
    repo = Path(flat_collectives.__file__).parents[1]
    names = ("dist.reduce_scatter_single", "dist.all_gather_single",
             "dist.reduce_scatter_tensor", "dist.all_gather_into_tensor")
    offenders = [f"{path}:{number}"
                 for path in Path(repo).rglob("*.py")
                 if not {".venv", "tests"} & set(path.relative_to(repo).parts)
                 and path.name != "flat_collectives.py"
                 for number, line in enumerate(path.read_text().splitlines(), 1)
                 if any(f"{name}(" in line for name in names)]
    assert not offenders, offenders
