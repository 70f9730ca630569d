"""Which raw records a streaming worker reads, in which order: sources, shards, shares.

A *source* is a set of raw shards (`.jsonl`/`.json`/`.parquet`/`.txt`/`.arrow` files): the whole
data dir (or its split, or a Hub dataset: utils/data_files.py), or with
`--data_mix=web:0.7,books:0.3` one subfolder (a Hub dataset: one config) per name, drawn with
those weights.
A *global worker* is one DataLoader worker of one rank: worker g of G = world_size x workers.

Per source and epoch, the shards are put in a seeded order (sorted when not shuffling), and
the G workers split them:

    by shard  (shards >= G)  worker g reads the shards at positions g, g+G, g+2G, ... of the
                             epoch's order, every record of each;
    by record (shards <  G)  every worker reads every shard in that order, keeping only the
                             records whose 1-based line/record number n has n % G == g.

Worked example, 5 shards, G = 2, epoch order [3, 0, 4, 1, 2]:
    worker 0 -> shards 3, 4, 2     worker 1 -> shards 0, 1        (by shard)
and with 1 shard, G = 2: worker 0 takes lines 2, 4, 6, ...; worker 1 lines 1, 3, 5, ...

Held-out records: with `holdout_every` = k > 0, records whose number n has n % k == 0 form the
validation set (they are never trained on); 0 holds out nothing. A pure function of the record
number, so it holds under any sharding and any resume.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from utils.data_files import locate_data, mix_source
from utils.readers import BadRecordError, Record, iter_raw_items


@dataclass(frozen=True)
class StreamSource:
    name: str
    weight: float
    root: Path
    shards: tuple[Path, ...]  # sorted; relative to root in states and messages

    def relative_names(self) -> list[str]:
        return [shard.relative_to(self.root).as_posix() for shard in self.shards]


@dataclass(frozen=True)
class ShardShare:
    """One shard of a worker's epoch, and which of its records the worker keeps."""

    path: Path
    stride: int  # keep records with number % stride == phase (stride 1: all of them)
    phase: int


def parse_data_mix(text: str) -> list[tuple[str, float]]:
    """"web:0.7,books:0.3" -> [("web", 0.7), ("books", 0.3)]; "" -> [] (one source)."""
    if not text.strip():
        return []
    mix = []
    for part in text.split(","):
        name, sep, weight = part.strip().partition(":")
        try:
            value = float(weight)
        except ValueError:
            value = -1.0
        if not sep or not name or not 0 < value < math.inf:  # NaN fails this too
            raise ValueError(f"--data_mix: {part.strip()!r} is not NAME:WEIGHT with a finite "
                             "weight > 0; write e.g. --data_mix=web:0.7,books:0.3")
        mix.append((name, value))
    if len({name for name, _ in mix}) != len(mix):
        raise ValueError(f"--data_mix={text}: a source is named twice")
    return mix


def find_sources(data_dir: str | Path, data_mix: str = "") -> list[StreamSource]:
    """The sources of a stream: data_dir itself, or its parts named in data_mix (subfolders of a
    folder, configs of a Hub dataset: utils/data_files.py `mix_source`)."""
    mix = parse_data_mix(data_mix) or [("", 1.0)]
    sources = []
    for name, weight in mix:
        spec = mix_source(data_dir, name) if name else data_dir
        located = locate_data(spec, option=f"--data_mix source {name!r}:" if name else
                              "--data_dir")
        if not located.files:
            raise FileNotFoundError(f"{spec}: no .jsonl/.json/.parquet/.txt shards to stream")
        sources.append(StreamSource(name or located.name, weight, located.root,
                                    tuple(located.files)))
    return sources


def epoch_shard_order(num_shards: int, seed: int, source_index: int, epoch: int,
                      shuffle: bool) -> np.ndarray:
    """A pure function of (seed, source, epoch): the same on every rank and after a resume."""
    if not shuffle:
        return np.arange(num_shards)
    return np.random.default_rng([seed, source_index, epoch]).permutation(num_shards)


def worker_shares(source: StreamSource, order: np.ndarray, global_worker: int,
                  num_global_workers: int) -> list[ShardShare]:
    """This worker's shards of one epoch (see the module docstring for the two modes)."""
    shards = [source.shards[index] for index in order]
    if len(shards) >= num_global_workers:
        return [ShardShare(path, 1, 0) for path in shards[global_worker::num_global_workers]]
    return [ShardShare(path, num_global_workers, global_worker) for path in shards]


def holdout_shares(source: StreamSource) -> list[ShardShare]:
    """Validation reads every shard whole, in sorted order, in one process."""
    return [ShardShare(path, 1, 0) for path in source.shards]


def check_shards_present(source: StreamSource, epoch: int,
                         shards: Sequence[Path] | None = None) -> None:
    """A shard that vanished (between epochs, or before its turn in this one) is an error
    naming it, not a silently smaller epoch. Checks `shards`, or all of the source."""
    for shard in source.shards if shards is None else shards:
        if not shard.is_file():
            raise FileNotFoundError(f"{shard}: shard of source {source.name!r} disappeared "
                                    f"before epoch {epoch}; restore it (the stream's shard list "
                                    "is fixed when the run starts)")


def owned_records(share: ShardShare, first_number: int, holdout_every: int, holdout: bool
                  ) -> Iterator[Record | BadRecordError]:
    """The records of `share` numbered >= first_number that this worker owns, in file order:
    training records, or with holdout=True only the held-out ones. Bad records are yielded as
    error objects so the caller applies --skip_bad_records to its own records only."""
    for item in iter_raw_items(share.path):
        number = item.number
        if number < first_number or number % share.stride != share.phase:
            continue
        held_out = holdout_every > 0 and number % holdout_every == 0
        if held_out == holdout:
            yield item
