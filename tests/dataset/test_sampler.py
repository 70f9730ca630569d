"""StatefulDistributedSampler against the spec (concatenated seeded permutations) and against
uninterrupted runs: iterate k -> save -> rebuild (maybe with another world size) -> the next
rows must equal the uninterrupted stream."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from dataset.sampler import StatefulDistributedSampler


def spec_stream(num_samples: int, seed: int, length: int, shuffle: bool = True) -> list[int]:
    """The global order as docs/design.md §3 states it, written independently of the sampler."""
    stream: list[int] = []
    for epoch in itertools.count():
        if len(stream) >= length:
            return stream[:length]
        order = (np.random.default_rng([seed, epoch]).permutation(num_samples) if shuffle
                 else np.arange(num_samples))
        stream += order.tolist()


def take_rows(samplers: list[StatefulDistributedSampler], rows: int) -> list[list[int]]:
    """Step all ranks together `rows` times; row i = [rank 0's i-th index, rank 1's, ...]."""
    iterators = [iter(sampler) for sampler in samplers]
    return [[next(iterator) for iterator in iterators] for _ in range(rows)]


def make_ranks(num_samples, world_size, seed, shuffle=True):
    return [StatefulDistributedSampler(num_samples, rank, world_size, seed, shuffle)
            for rank in range(world_size)]


def check_resume(num_samples, seed, world_before, rows_before, world_after, rows_after):
    """The shared resumption check: k rows -> save -> rebuild -> the next rows continue the
    uninterrupted run (one sampler per rank of the *first* world size, never stopped)."""
    # Uninterrupted reference, flattened to the global stream.
    total_rows = rows_before + -(-rows_after * world_after // world_before)
    reference = [i for row in take_rows(make_ranks(num_samples, world_before, seed), total_rows)
                 for i in row]

    before = make_ranks(num_samples, world_before, seed)
    consumed = [i for row in take_rows(before, rows_before) for i in row]
    states = [sampler.state_dict() for sampler in before]
    assert all(state == states[0] for state in states), "ranks disagree on the position"
    after = make_ranks(num_samples, world_after, seed)
    for sampler in after:
        sampler.load_state_dict(states[0])
    resumed = [i for row in take_rows(after, rows_after) for i in row]

    assert consumed == reference[: len(consumed)]
    assert resumed == reference[len(consumed): len(consumed) + len(resumed)]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_ranks_interleave_to_the_spec_stream(world_size):
    num_samples, seed = random.randint(5, 60), random.randint(0, 10**6)
    rows = take_rows(make_ranks(num_samples, world_size, seed), 3 * num_samples // world_size)
    stream = [i for row in rows for i in row]
    assert stream == spec_stream(num_samples, seed, len(stream))
    for epoch in range(len(stream) // num_samples):  # every sample exactly once per epoch
        assert sorted(stream[epoch * num_samples: (epoch + 1) * num_samples]) == list(
            range(num_samples))
    for index, row in enumerate(rows):  # ranks disjoint in rows that lie inside one epoch
        first, last = index * world_size, index * world_size + world_size - 1
        if first // num_samples == last // num_samples:
            assert len(set(row)) == world_size
    assert stream[:num_samples] != stream[num_samples: 2 * num_samples]  # epochs reshuffle


def test_shuffle_false_walks_in_order():
    num_samples = random.randint(3, 20)
    stream = [i for row in take_rows(make_ranks(num_samples, 2, 7, shuffle=False), 20)
              for i in row]
    assert stream == spec_stream(num_samples, 7, 40, shuffle=False)


@pytest.mark.parametrize("world_before, world_after", [(1, 1), (2, 2), (2, 1), (2, 4), (3, 2),
                                                       (4, 3)])
def test_resume_continues_the_uninterrupted_stream(world_before, world_after):
    rng = random.Random()
    num_samples = rng.randint(7, 50)
    for rows_before in [0, 1, rng.randint(2, 3 * num_samples)]:  # also past epoch ends
        check_resume(num_samples, rng.randint(0, 10**6), world_before, rows_before,
                     world_after, rows_after=rng.randint(1, 2 * num_samples))


def test_state_dict_at_matches_an_iterated_sampler_and_resumes_there():
    num_samples, seed = random.randint(5, 30), random.randint(0, 10**6)
    walker = StatefulDistributedSampler(num_samples, seed=seed)
    iterator = iter(walker)
    for total in range(3 * num_samples + 1):
        assert walker.state_dict_at(total) == walker.state_dict()
        assert walker.state_dict()["epoch"] * num_samples + walker.state_dict()[
            "consumed_samples"] == total
        next(iterator)
    # An odd total (not a multiple of the new world size) resumes exactly there.
    total = 2 * num_samples + 3
    resumed = make_ranks(num_samples, 2, seed)
    for sampler in resumed:
        sampler.load_state_dict(walker.state_dict_at(total))
    stream = [i for row in take_rows(resumed, num_samples) for i in row]
    assert stream == spec_stream(num_samples, seed, total + 2 * num_samples)[total:]


def test_dataloader_resume_from_consumed_count():
    """What the trainer does: save state_dict_at(steps * global batch), ignoring prefetch."""
    num_samples, world_size, micro_batch, steps = 23, 2, 3, 5
    dataset = TensorDataset(torch.randperm(1000)[:num_samples])

    def loaders(state=None):
        result = []
        for sampler in make_ranks(num_samples, world_size, seed=11):
            if state is not None:
                sampler.load_state_dict(state)
            result.append((sampler, iter(DataLoader(dataset, batch_size=micro_batch,
                                                    sampler=sampler))))
        return result

    uninterrupted = loaders()
    expected = [[next(it)[0].tolist() for _, it in uninterrupted] for _ in range(2 * steps)]
    first_run = loaders()
    seen = [[next(it)[0].tolist() for _, it in first_run] for _ in range(steps)]
    state = first_run[0][0].state_dict_at(steps * micro_batch * world_size)
    resumed = loaders(state)
    seen += [[next(it)[0].tolist() for _, it in resumed] for _ in range(steps)]
    assert seen == expected


def test_resume_is_o1_and_bad_states_are_refused(monkeypatch):
    sampler = StatefulDistributedSampler(10, seed=3)
    computed = []
    original = StatefulDistributedSampler.epoch_order
    monkeypatch.setattr(StatefulDistributedSampler, "epoch_order",
                        lambda self, epoch: computed.append(epoch) or original(self, epoch))
    sampler.load_state_dict({"seed": 3, "epoch": 10**9, "consumed_samples": 4})
    first = next(iter(sampler))
    assert set(computed) == {10**9}  # only the resumed epoch's order was ever computed
    assert first == int(np.random.default_rng([3, 10**9]).permutation(10)[4])

    for bad in [{"seed": 4, "epoch": 0, "consumed_samples": 0},
                {"seed": 3, "epoch": 0, "consumed_samples": 10},
                {"seed": 3, "epoch": 0},
                {"seed": 3, "epoch": 0, "consumed_samples": 0, "extra": 1}]:
        with pytest.raises(ValueError):
            sampler.load_state_dict(bad)
