"""Pretokenized SFT/DPO samples on disk, and how they are split into train and valid.

A store is a folder written by data_preprocess/pretokenize_chat.py: per input file an ids pair,
a `.mask` pair and a sidecar. The trainer's (`chat_store_dir`) is its --data_dir itself when
that holds one, else the online cache: the raw records rendered once, by the same code, into
`<data_dir>/.z2all_cache/<task>_<key>/` (a Hub dataset's: under the user's cache), where key
hashes what the samples depend on (`cache_key`). Samples are numbered across files in sorted
path order:

    files:    a.jsonl (3 samples)   b.jsonl (2 samples)
    sample:   0 1 2                 3 4          (sample 3 = document 0 of b)

Train/valid split (decided here, for SFT and DPO alike):
  * files whose name starts with "valid" or "eval" (e.g. valid.jsonl, eval_set.json) are the
    validation set and every other file is training;
  * otherwise a seeded random `valid_ratio` of all samples is held out (at least 1 when the
    ratio is above 0; none with `valid_ratio=0`).
Either way the valid ids are one small sorted array and train is "everything else", computed on
the fly (`Complement`), so memory is O(valid samples) however large the store.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from data_preprocess.indexed_dataset import IndexedDataset
from data_preprocess.pretokenize_chat import MASK_SUFFIX, pretokenize_chat_data
from dataset.prepare import prepare_once
from utils.atomic_io import atomic_write_json
from utils.data_files import DataFiles, find_data_files, locate_data

VALID_FILE_PREFIXES = ("valid", "eval")
CACHE_DIR_NAME = ".z2all_cache"  # hidden: the readers skip it when listing raw files


def find_store_sidecars(directory: str | Path, kind: str) -> list[tuple[Path, dict]]:
    """(prefix, sidecar) of every `z2all-<kind>` output under directory (kind: sft, dpo or
    pretok), sorted by path; hidden folders such as the online cache are skipped. Data named
    by id or split (`hf:org/name`, `DIR@test`) is raw records: none."""
    found: list[tuple[Path, dict]] = []
    if not Path(directory).is_dir():
        return found
    for idx_path in find_data_files(directory, extensions=(".idx",)):
        # Only token files have sidecars: never json-parse a (possibly huge) raw .json.
        path = idx_path.with_suffix(".json")
        if not path.exists():
            continue
        try:
            sidecar = json.loads(path.read_text())
        except json.JSONDecodeError as error:  # sidecars are written atomically: not one of ours
            raise ValueError(f"{path}: not valid JSON ({error}), yet it sits beside the token "
                             f"file {idx_path.name}; move it away or re-run pretokenization"
                             ) from error
        if isinstance(sidecar, dict) and sidecar.get("format") == f"z2all-{kind}":
            found.append((path.with_suffix(""), sidecar))
    return found


def other_task_problem(data_dir: str | Path, task_type: str) -> str | None:
    """Token files of another task are not raw records: the message saying so, or None.
    (Their `.json` sidecars would otherwise be read as records and fail as `not_array`.)"""
    data_dir = Path(data_dir)
    if task_type == "pretrain" or not data_dir.is_dir():
        return None
    for other, described in (("pretok", "pretokenized pretraining data"),
                             ("sft", "pretokenized sft data"), ("dpo", "pretokenized dpo data")):
        if other != task_type and find_store_sidecars(data_dir, other):
            fix = "pretrain" if other == "pretok" else other
            return (f"--data_dir={data_dir}: this is {described}, not {task_type} records "
                    f"(use --task_type={fix}, or point --data_dir at raw {task_type} records)")
    return None


def cache_key(located: DataFiles, kind: str, fingerprint: str, max_seq_len: int,
              system_prompt: str | None) -> tuple[str, dict[str, Any]]:
    """A short hash of everything the cached samples depend on (and the inputs, for the record)."""
    files = [{"path": name, "size": path.stat().st_size, "mtime_ns": path.stat().st_mtime_ns}
             for path, name in zip(located.files, located.relative_names())]
    identity = {"kind": kind, "files": files, "tokenizer": fingerprint,
                "max_seq_len": max_seq_len, "system_prompt": system_prompt}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return digest, identity


def default_cache_dir(located: DataFiles) -> Path:
    """Where rendered samples are cached: `<data_dir>/.z2all_cache` (hidden, so never read as
    data); for a Hub dataset, whose snapshot z2all never writes into, the user's cache
    (`$XDG_CACHE_HOME`, else ~/.cache) under z2all/<org>--<name>/."""
    if located.hub_id is not None:
        user_cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        return user_cache / "z2all" / located.hub_id.replace("/", "--")
    return located.root / CACHE_DIR_NAME


def chat_store_dir(kind: str, data_dir: str | Path, tokenizer_dir: str | Path, fingerprint: str,
                   max_seq_len: int, system_prompt: str | None, cache_dir: str | Path | None,
                   num_workers: int, prepare_timeout_s: float) -> Path:
    """The folder of pretokenized samples: data_dir itself, or the cache built from it."""
    if find_store_sidecars(data_dir, kind):
        return Path(data_dir)
    if problem := other_task_problem(data_dir, kind):  # before any cache is made
        raise ValueError(problem)
    located = locate_data(data_dir)
    key, identity = cache_key(located, kind, fingerprint, max_seq_len, system_prompt)
    store_dir = Path(cache_dir or default_cache_dir(located)) / f"{kind}_{key}"
    done_path = store_dir / "DONE.json"

    def build() -> None:
        pretokenize_chat_data(kind, data_dir, tokenizer_dir, max_seq_len, out_dir=store_dir,
                              system_prompt=system_prompt, num_workers=num_workers)
        atomic_write_json(done_path, identity)  # last: the cache is complete

    prepare_once(done_path, build, f"the {kind} cache of {data_dir}", prepare_timeout_s)
    return store_dir


class ChatTokenStore:
    """All `(ids, loss_mask)` sequences of a store; `store.sample(i)` -> the sample's sequences."""

    def __init__(self, directory: str | Path, kind: str, tokenizer_fingerprint: str | None = None,
                 max_seq_len: int | None = None) -> None:
        self.directory, self.kind = Path(directory), kind
        entries = find_store_sidecars(self.directory, kind)
        if not entries:
            raise FileNotFoundError(f"no pretokenized {kind} data (z2all-{kind} sidecars) under "
                                    f"{self.directory}")
        for prefix, sidecar in entries:
            if tokenizer_fingerprint and sidecar["tokenizer"] != tokenizer_fingerprint:
                raise ValueError(f"{prefix}.json was made with tokenizer {sidecar['tokenizer']}, "
                                 f"training uses {tokenizer_fingerprint}: re-run pretokenization")
            if max_seq_len and sidecar["max_seq_len"] > max_seq_len:
                raise ValueError(f"{prefix}.json holds samples up to {sidecar['max_seq_len']} "
                                 f"tokens, longer than max_seq_len={max_seq_len}: re-run it")
        self.prefixes = [prefix for prefix, _ in entries]
        self.sources = [sidecar["source"] for _, sidecar in entries]
        counts = np.array([sidecar["num_documents"] for _, sidecar in entries], dtype=np.int64)
        self.first_sample_of_file = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._files: list[tuple[IndexedDataset, IndexedDataset]] | None = None

    def _open(self) -> list[tuple[IndexedDataset, IndexedDataset]]:
        if self._files is None:  # lazily, in each process: pickling a memmap would copy it
            self._files = [(IndexedDataset(prefix),
                            IndexedDataset(prefix.with_name(prefix.name + MASK_SUFFIX)))
                           for prefix in self.prefixes]
            for (ids, mask), prefix in zip(self._files, self.prefixes):
                if ids.num_documents != mask.num_documents or len(ids) != len(mask):
                    raise ValueError(f"{prefix}: ids and {MASK_SUFFIX} pairs do not match")
        return self._files

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_files": None}

    def __len__(self) -> int:
        return int(self.first_sample_of_file[-1])

    def sample(self, index: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Sample -> its sequences as (ids, mask) numpy views: 1 for SFT, (chosen, rejected)."""
        file = int(np.searchsorted(self.first_sample_of_file, index, side="right")) - 1
        ids, mask = self._open()[file]
        document = index - int(self.first_sample_of_file[file])
        first, stop = ids.document_indices[document], ids.document_indices[document + 1]
        return [(ids[sequence], mask[sequence]) for sequence in range(first, stop)]

    def samples_of_files(self, is_selected: Callable[[str], bool]) -> np.ndarray:
        """Sorted sample ids of the files whose source path satisfies `is_selected(path)`."""
        ranges = [np.arange(self.first_sample_of_file[i], self.first_sample_of_file[i + 1])
                  for i, source in enumerate(self.sources) if is_selected(source)]
        return np.concatenate(ranges) if ranges else np.zeros(0, dtype=np.int64)


class ChatSamples(Dataset):
    """A split of a store: `sample_ids` (default: every sample) maps positions to sample ids.

    Subclasses set `kind` ("sft" / "dpo") and turn `self.sequences(index)` into tensors.
    """

    kind = ""

    def __init__(self, store: ChatTokenStore | str | Path,
                 sample_ids: Sequence[int] | np.ndarray | None = None) -> None:
        self.store = (store if isinstance(store, ChatTokenStore)
                      else ChatTokenStore(store, self.kind))
        self.sample_ids = sample_ids if sample_ids is not None else range(len(self.store))

    def __len__(self) -> int:
        return len(self.sample_ids)

    def sequences(self, index: int) -> list[tuple[np.ndarray, np.ndarray]]:
        return self.store.sample(int(self.sample_ids[index]))


class Complement:
    """The ids 0..total-1 except a sorted `excluded` array, indexable without materialising them.

    The p-th kept id is p + (number of excluded ids below it). Excluded id e_j has e_j - j kept
    ids below it, so that count is how many j satisfy e_j - j <= p: one binary search.
    Example: total 6, excluded [1, 2] -> kept [0, 3, 4, 5]; p = 1: e_j - j = [1, 1] -> 2 -> 3.
    """

    def __init__(self, excluded: np.ndarray, total: int) -> None:
        self.kept_below_excluded = excluded - np.arange(len(excluded))
        self.length = total - len(excluded)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, position: int) -> int:
        if not 0 <= position < self.length:
            raise IndexError(position)
        return position + int(np.searchsorted(self.kept_below_excluded, position, side="right"))


def split_train_valid(store: ChatTokenStore, valid_ratio: float,
                      seed: int) -> tuple[Complement, np.ndarray]:
    """(train ids, valid ids) of a store, as documented at the top of this file."""
    def is_valid_file(source: str) -> bool:
        return Path(source).name.lower().startswith(VALID_FILE_PREFIXES)

    if len(store) == 0:
        raise ValueError(f"{store.directory}: no samples to train on: its files hold no usable "
                         "records (empty files, or every record was skipped)")
    valid = store.samples_of_files(is_valid_file)
    if len(valid) == 0 and len(store) >= 2 and valid_ratio > 0:
        count = min(max(1, round(valid_ratio * len(store))), len(store) - 1)
        valid = np.sort(np.random.default_rng(seed).choice(len(store), count, replace=False))
    train = Complement(valid.astype(np.int64), len(store))
    if len(train) == 0:
        raise ValueError(f"{store.directory}: every sample is validation data; nothing to train")
    return train, valid
