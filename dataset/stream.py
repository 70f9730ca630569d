"""Train straight from raw shards: tokenize on the fly in DataLoader workers, resume exactly.

    loader = StreamLoader(StreamDataset(...), batch_size=8, collate_fn=default_collate)
    batches = iter(loader)            # endless; epochs follow one another per source
    state = loader.state_dict()       # after the batches the trainer has consumed, exactly
    loader.load_state_dict(state)     # a new run continues with the very next sample

Who does what:
- Each DataLoader worker (StreamDataset.__iter__) is one *global worker* g of G = world_size x
  workers. It reads its share of every source (dataset/stream_shards.py), turns records into
  samples (dataset/stream_samples.py), picks a source per sample with the --data_mix weights,
  and hands out chunks of CHUNK_SAMPLES samples, each with its position right after the chunk.
- The main process (StreamLoader) receives chunks in DataLoader's fixed round-robin order
  (worker 0, 1, ..., 0, 1, ...), keeps the position of the last chunk received from each
  worker, and shuffles samples in a bounded buffer (dataset/shuffle_buffer.py) that lives here,
  in the main process, so the buffer's contents are at hand when the trainer checkpoints.

Why the state is exact although workers prefetch: a position is recorded only when its chunk
is *received* here, and chunks are received only when the buffer needs samples for a batch
the trainer asked for. What workers prefetched beyond that is simply produced again after a
resume, from the recorded positions. State, per rank:
    {"workers": [per worker: {"sources": [{epoch, shard_cursor, record, offset, skipped}],
                              "mix_draws"}],
     "next_worker": which worker's chunk comes next, "buffer": {items, draws},
     "sources": the --data_mix source names in order, "shards": each source's shard list, ...}
(cursors belong to a source's place in that order: a resume refuses another order or list)
A resumed DataLoader starts at its worker 0, so worker i plays logical worker
(next_worker + i) % workers: the round-robin continues where it stopped.

Changing world size or workers (G) on resume: positions belong to a sharding that no longer
exists. The run then starts every source at the beginning of its next epoch (after the
furthest epoch any old worker reached) with empty buffers. Bound: no sample is repeated within
an epoch; skipped is at most the rest of the current epoch of each source plus the old
buffers' contents. Same G: every sample exactly as the uninterrupted run.
"""

from __future__ import annotations

import collections
import copy
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from dataset.data_config import DEFAULT_SHUFFLE_BUFFER, DataFormatMismatch
from dataset.shuffle_buffer import CountedUniforms, ShuffleBuffer
from dataset.stream_samples import (
    POLICY_COUNTS,
    Position,
    ShardSamples,
    chat_samples,
    pretrain_samples,
)
from dataset.stream_shards import (
    StreamSource,
    check_shards_present,
    epoch_shard_order,
    holdout_shares,
    owned_records,
    worker_shares,
)
from tokenizer import load_tokenizer
from utils.readers import BadRecordError, Record
from utils.tokenizer_protocol import Tokenizer
from utils.worker_signals import init_loader_worker

STATE_FORMAT, STATE_VERSION = "z2all-stream", 1
CHUNK_SAMPLES = 16  # samples per worker hand-off: fewer round trips, still a small prefetch
MIX_KEY, BUFFER_KEY = 1, 2  # keep the mixing and shuffling draws apart


@dataclass
class SourceCursor:
    """Where one global worker stands in one source."""

    epoch: int = 0
    shard_cursor: int = 0  # index into this worker's shard shares of the epoch
    record: int = 0  # first record number not fully used (0: start of the shard)
    offset: int = 0  # tokens of that record already used
    skipped: dict[str, int] = field(default_factory=dict)  # records skipped or cut, by reason


@dataclass(frozen=True)
class StreamSettings:
    task_type: str  # pretrain | sft | dpo
    tokenizer_dir: str
    seq_len: int
    seed: int
    shuffle: bool = True
    text_keys: tuple[str, ...] = ("text",)
    system_prompt: str | None = None
    skip_bad_records: bool = False
    holdout_every: int = 100  # record n is validation when n % holdout_every == 0 (0: none)


def keep_chunk(chunk: dict[str, Any]) -> dict[str, Any]:
    """DataLoader's collate_fn for chunks: pass them through untouched (picklable)."""
    return chunk


def to_tensors(item: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {key: torch.from_numpy(value) for key, value in item.items()}


class StreamDataset(IterableDataset):
    """The worker side: endless chunks of samples, each with the worker's position after it."""

    def __init__(self, sources: list[StreamSource], settings: StreamSettings, rank: int = 0,
                 world_size: int = 1, num_workers: int = 0) -> None:
        self.sources, self.settings = sources, settings
        self.rank, self.world_size = rank, world_size
        self.workers_per_rank = max(1, num_workers)
        self.start_states: list[dict[str, Any] | None] = [None] * self.workers_per_rank
        self.first_worker = 0  # the logical worker that DataLoader's worker 0 plays
        total = sum(source.weight for source in sources)
        self.cumulative_weights = np.cumsum([source.weight / total for source in sources])
        self._tokenizer: Tokenizer | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_tokenizer": None}  # each worker loads its own

    def samples(self, records: Iterator[Record | BadRecordError], start: Position
                ) -> ShardSamples:
        """Records of one shard -> (sample, position after it), for the task at hand; the
        generator returns the shard's final counts."""
        settings = self.settings
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(settings.tokenizer_dir)
        if settings.task_type == "pretrain":
            return pretrain_samples(records, start, tokenizer=self._tokenizer,
                                    seq_len=settings.seq_len,
                                    text_keys=list(settings.text_keys),
                                    skip_bad_records=settings.skip_bad_records)
        return chat_samples(records, start, kind=settings.task_type, tokenizer=self._tokenizer,
                            seq_len=settings.seq_len, system_prompt=settings.system_prompt,
                            skip_bad_records=settings.skip_bad_records)

    def source_stream(self, source_index: int, cursor: SourceCursor, global_worker: int,
                      num_global_workers: int) -> Iterator[dict[str, Any]]:
        """One source's samples for this worker, epoch after epoch; `cursor` follows along."""
        source, settings = self.sources[source_index], self.settings
        while True:
            check_shards_present(source, cursor.epoch)
            order = epoch_shard_order(len(source.shards), settings.seed, source_index,
                                      cursor.epoch, settings.shuffle)
            shares = worker_shares(source, order, global_worker, num_global_workers)
            whole_epoch, produced = cursor.shard_cursor == 0 and cursor.record == 0, 0
            while cursor.shard_cursor < len(shares):
                share = shares[cursor.shard_cursor]
                check_shards_present(source, cursor.epoch, [share.path])
                start = Position(cursor.record, cursor.offset, cursor.skipped)
                records = owned_records(share, cursor.record, settings.holdout_every,
                                        holdout=False)
                shard_samples = self.samples(records, start)
                while True:
                    try:
                        item, position = next(shard_samples)
                    except StopIteration as end:  # the counts of records after the last sample
                        cursor.skipped = end.value
                        break
                    cursor.record, cursor.offset, cursor.skipped = position
                    produced += 1
                    yield item
                cursor.shard_cursor, cursor.record, cursor.offset = cursor.shard_cursor + 1, 0, 0
            if whole_epoch and produced == 0:
                raise ValueError(f"source {source.name!r}: worker {global_worker} of "
                                 f"{num_global_workers} got no sample in epoch {cursor.epoch}; "
                                 "use fewer workers or a shorter --max_seq_len, or add data")
            cursor.epoch, cursor.shard_cursor = cursor.epoch + 1, 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        logical = (self.first_worker + (info.id if info else 0)) % self.workers_per_rank
        global_worker = self.rank * self.workers_per_rank + logical
        num_global_workers = self.world_size * self.workers_per_rank
        state = self.start_states[logical] or {"sources": [{} for _ in self.sources],
                                               "mix_draws": 0}
        cursors = [SourceCursor(**copy.deepcopy(saved)) for saved in state["sources"]]
        streams = [self.source_stream(index, cursor, global_worker, num_global_workers)
                   for index, cursor in enumerate(cursors)]
        mix = CountedUniforms([self.settings.seed, MIX_KEY, global_worker], state["mix_draws"])
        while True:
            items = []
            for _ in range(CHUNK_SAMPLES):
                source_index = 0
                if len(streams) > 1:  # a weighted pick: the first cumulative weight above u
                    source_index = int(np.searchsorted(self.cumulative_weights, mix.next(),
                                                       side="right"))
                items.append(next(streams[source_index]))
            yield {"items": items, "state": {"sources": [asdict(c) for c in cursors],
                                             "mix_draws": mix.count}}


class StreamLoader:
    """The main-process side: chunks -> shuffle buffer -> batches, and the exact state."""

    def __init__(self, dataset: StreamDataset, batch_size: int, collate_fn: Callable,
                 num_workers: int = 0,
                 shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER) -> None:
        self.dataset, self.batch_size, self.collate_fn = dataset, batch_size, collate_fn
        self.num_workers = num_workers
        self.worker_states: list[dict[str, Any] | None] = [None] * dataset.workers_per_rank
        self.next_worker = 0
        key = [dataset.settings.seed, BUFFER_KEY, dataset.rank]
        self.buffer = ShuffleBuffer(shuffle_buffer if dataset.settings.shuffle else 0, key)

    def __iter__(self) -> Iterator[Any]:
        """Endless batches from the current state. One live iterator at a time."""
        dataset = copy.copy(self.dataset)
        dataset.start_states = list(self.worker_states)
        dataset.first_worker = self.next_worker
        chunks = iter(DataLoader(dataset, batch_size=None, num_workers=self.num_workers,
                                 collate_fn=keep_chunk, worker_init_fn=init_loader_worker))
        while True:
            items = []
            while len(items) < self.batch_size:
                while self.buffer.wants_more():
                    chunk = next(chunks)
                    self.worker_states[self.next_worker] = chunk["state"]
                    self.next_worker = (self.next_worker + 1) % len(self.worker_states)
                    self.buffer.add([to_tensors(item) for item in chunk["items"]])
                items.append(self.buffer.pop())
            yield self.collate_fn(items)

    def _counts_by_reason(self) -> collections.Counter[str]:
        counts: collections.Counter[str] = collections.Counter()
        for state in self.worker_states:
            for source in state["sources"] if state else ():
                counts.update(source["skipped"])
        return counts

    def skipped_records(self) -> int:
        """Bad records this rank skipped so far (empty, too long or cut ones are not bad)."""
        return sum(count for reason, count in self._counts_by_reason().items()
                   if reason not in POLICY_COUNTS)

    def policy_counts(self) -> dict[str, int]:
        """Records of this rank not trained on as they are, so far: empty ones skipped,
        too-long SFT/DPO samples dropped, long ones truncated (dataset/stream_samples.py)."""
        counts = self._counts_by_reason()
        return {metric: counts[reason] for reason, metric in POLICY_COUNTS.items()}

    def state_dict(self) -> dict[str, Any]:
        return {"format": STATE_FORMAT, "version": STATE_VERSION,
                "world_size": self.dataset.world_size,
                "workers_per_rank": self.dataset.workers_per_rank,
                "sources": [source.name for source in self.dataset.sources],
                "shards": [source.relative_names() for source in self.dataset.sources],
                "workers": copy.deepcopy(self.worker_states), "next_worker": self.next_worker,
                "buffer": self.buffer.state_dict()}

    def check_same_shards(self, state: dict[str, Any]) -> None:
        """A resume over a changed shard list would silently change what 'position' means;
        so would reordered --data_mix sources (cursors are kept per source index, and two
        sources with the same shard names would swap their cursors unnoticed)."""
        saved_names = state.get("sources")  # absent in states written before it was recorded
        names = [source.name for source in self.dataset.sources]
        if saved_names is not None and saved_names != names:
            raise ValueError(f"--data_mix sources are {', '.join(names)}, but the checkpoint "
                             f"was written with {', '.join(saved_names)} (in that order); "
                             "resume with the same sources in the same order, or start a new "
                             "run instead of --resume")
        for source, saved in zip(self.dataset.sources, state["shards"], strict=True):
            now = source.relative_names()
            for name in sorted(set(saved) ^ set(now)):
                change = "is missing" if name in saved else "was added"
                raise ValueError(f"{source.root / name}: shard {change} since the checkpoint "
                                 f"was written (source {source.name!r}); restore the shard "
                                 "list or start a new run instead of --resume")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where `state` was taken (same world size and workers)."""
        if state.get("format") != STATE_FORMAT or state.get("version") != STATE_VERSION:
            raise ValueError(f"not a {STATE_FORMAT} v{STATE_VERSION} stream state")
        self.check_same_shards(state)
        if (state["world_size"], state["workers_per_rank"]) != (
                self.dataset.world_size, self.dataset.workers_per_rank):
            raise ValueError("stream state of another world size or worker count: use "
                             "load_resharded() with the states of all old ranks")
        self.worker_states = copy.deepcopy(state["workers"])
        self.next_worker = state["next_worker"]
        self.buffer.load_state_dict(state["buffer"])

    def restore(self, saved: list[dict[str, Any]]) -> str | None:
        """The trainer's resume (dataset.train_data.TrainData): `saved` holds the state of every
        rank that wrote the checkpoint. Exact at the same world size and workers; otherwise
        every source restarts at its next epoch, and the returned note says so."""
        if not all(isinstance(state, dict) and state.get("format") == STATE_FORMAT
                   for state in saved):
            raise DataFormatMismatch("was written without --data_format=stream; resume with "
                                     "the data format it was run with")
        same_ranks = len(saved) == self.dataset.world_size
        mine = saved[self.dataset.rank] if same_ranks else None
        if mine is not None and mine["workers_per_rank"] == self.dataset.workers_per_rank:
            self.load_state_dict(mine)
            return None
        self.load_resharded(saved)
        return ("data stream: world size or workers changed; every source restarts at its next "
                "epoch (no sample repeats within an epoch, the rest of the current one is "
                "skipped)")

    def load_resharded(self, old_states: list[dict[str, Any]]) -> None:
        """After a change of world size or workers: every source restarts at the epoch after
        the furthest one any old worker reached (see the module docstring for the bound)."""
        for state in old_states:
            self.check_same_shards(state)
        next_epochs = [1 + max((worker["sources"][index]["epoch"] for state in old_states
                                for worker in state["workers"] if worker), default=-1)
                       for index in range(len(self.dataset.sources))]
        fresh = {"sources": [asdict(SourceCursor(epoch=epoch)) for epoch in next_epochs],
                 "mix_draws": 0}
        self.worker_states = [copy.deepcopy(fresh) for _ in self.worker_states]
        self.next_worker = 0


def holdout_items(dataset: StreamDataset, limit: int) -> list[dict[str, torch.Tensor]]:
    """The validation set: samples of the held-out records (n % holdout_every == 0), every
    source's shards in sorted order, unshuffled, at most `limit`; the same on every rank."""
    items: list[dict[str, torch.Tensor]] = []
    for source in dataset.sources:
        for share in holdout_shares(source):
            records = owned_records(share, 0, dataset.settings.holdout_every, holdout=True)
            for item, _ in dataset.samples(records, Position(0, 0, {})):
                if len(items) == limit:
                    return items
                items.append(to_tensors(item))
    return items
