"""One interface for the trainer's training batches, whichever `--data_format` is behind it.

    data, valid_dataset, collate_fn = build_train_data(config, tokenizer, seed=..., ...)
    batches = iter(data)              # endless batches for this rank
    state = data.state_dict()         # this rank's position after the batches handed out
    note = data.restore(states)       # every saved rank's state -> continue (note: None or why
                                      # the continuation is not exact)

Two implementations:
- `SampledTrainData` (`--data_format=pretok`): a memory-mapped dataset read in one global,
  seeded order split over ranks (dataset/sampler.py). Its state is the number of samples all
  ranks consumed, so it continues exactly under any world size or batch size.
- `dataset.stream.StreamLoader` (`--data_format=stream`): raw shards tokenized on the fly; its
  state is each worker's position in its shards plus the shuffle buffer (dataset/stream.py).

The loop and the checkpoint code never ask which one they hold.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, Protocol

import torch
from torch.utils.data import DataLoader, Dataset

from dataset.build import PAD_TO_MULTIPLE_OF, build_datasets, build_stream_datasets
from dataset.data_config import DataConfig, DataFormatMismatch
from dataset.sampler import STATE_KEYS, StatefulDistributedSampler
from utils.tokenizer_protocol import Tokenizer
from utils.worker_signals import init_loader_worker


class TrainData(Protocol):
    """What the training loop and its checkpoints use of the training data."""

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]: ...   # endless batches
    def state_dict(self) -> dict[str, Any]: ...                    # this rank's position
    def restore(self, saved: list[dict[str, Any]]) -> str | None: ...  # from all saved ranks
    def skipped_records(self) -> int: ...                          # bad records skipped
    def policy_counts(self) -> dict[str, int]: ...  # records dropped or cut, by metric name


class SampledTrainData:
    """Batches of a map-style dataset in the sampler's order; counts what it handed out."""

    def __init__(self, dataset: Dataset, collate_fn: Any, batch_size: int, rank: int,
                 world_size: int, seed: int, num_workers: int = 0,
                 pin_memory: bool = False) -> None:
        self.dataset, self.collate_fn, self.batch_size = dataset, collate_fn, batch_size
        self.world_size, self.seed = world_size, seed
        self.num_workers, self.pin_memory = num_workers, pin_memory
        self.sampler = StatefulDistributedSampler(len(dataset), rank, world_size, seed)
        # Samples of all ranks handed to the trainer. The sampler's own count runs ahead by
        # what DataLoader workers prefetched, so the state is taken from this one.
        self.consumed_samples = 0

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        # A dedicated generator: creating a DataLoader iterator draws a seed from it, and that
        # draw must not shift the global RNG streams between a continuous and a resumed run.
        loader = DataLoader(self.dataset, batch_size=self.batch_size, sampler=self.sampler,
                            collate_fn=self.collate_fn, num_workers=self.num_workers,
                            pin_memory=self.pin_memory, worker_init_fn=init_loader_worker,
                            generator=torch.Generator().manual_seed(self.seed
                                                                    + self.consumed_samples))
        for batch in loader:
            self.consumed_samples += self.batch_size * self.world_size
            yield batch

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict_at(self.consumed_samples)

    def restore(self, saved: list[dict[str, Any]]) -> str | None:
        """Every rank saved the same global position; continue from it at any world size."""
        state = saved[0]
        if not isinstance(state, dict) or set(state) != set(STATE_KEYS):
            raise DataFormatMismatch("was written with --data_format=stream; resume with the "
                                     "data format it was run with")
        self.sampler.load_state_dict(state)
        self.consumed_samples = self.sampler.total_consumed
        return None

    def skipped_records(self) -> int:
        return 0  # pretokenized data was checked when it was made

    def policy_counts(self) -> dict[str, int]:
        return {}  # the pretokenizer reported (and its sidecars record) what it dropped or cut


def build_train_data(config: DataConfig, tokenizer: Tokenizer, *, seed: int, batch_size: int,
                     eval_samples: int, rank: int, world_size: int, pin_memory: bool = False,
                     sequence_multiple: int = 1) -> tuple[TrainData, Any, Any]:
    """(training data, validation samples, collate_fn) of `config` for this rank, tokenized
    by `tokenizer` (loaded once by the caller; its directory is `config.tokenizer_dir`).
    `eval_samples`: how many validation samples all ranks evaluate together (the stream holds
    out exactly those; the pretokenized valid split is fixed by its index).
    `sequence_multiple`: padded batches (SFT, DPO) are as long as a multiple of it too (2C for
    context parallelism's 2C equal chunks; --max_seq_len is one)."""
    pad_to_multiple_of = math.lcm(PAD_TO_MULTIPLE_OF, sequence_multiple)
    if config.data_format == "stream":
        stream, valid, collate_fn = build_stream_datasets(
            config, tokenizer, seed, batch_size=batch_size, valid_samples=eval_samples,
            rank=rank, world_size=world_size, pad_to_multiple_of=pad_to_multiple_of)
        return stream, valid, collate_fn
    train, valid, collate_fn = build_datasets(
        config.task_type, config.data_dir, tokenizer, config.max_seq_len, seed=seed,
        pack_samples=config.pack_samples, pad_to_multiple_of=pad_to_multiple_of)
    data = SampledTrainData(train, collate_fn, batch_size, rank, world_size, seed,
                            num_workers=config.num_workers, pin_memory=pin_memory)
    return data, valid, collate_fn
