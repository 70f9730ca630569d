"""`build_datasets(task_type, data_dir, tokenizer, max_seq_len)`: what the trainer calls.

Returns `(train_dataset, valid_dataset, collate_fn)` for one task. Where the data comes from:

pretrain  data_dir holds `.bin`/`.idx` files (data_preprocess/pretokenize_pretrain_data.py).
          Train and valid are the two halves of the `.ibin` sample index for max_seq_len; if
          it does not exist yet, rank 0 builds it (seeded valid subset, `valid_ratio`).
sft, dpo  data_dir holds either pretokenized output (pretokenize_sft_data / _dpo_data) or raw
          records (or names them: `DIR@split`, `hf:org/name`, utils/data_files.py). Raw records
          are rendered once into a cache, `<data_dir>/.z2all_cache/<task>_<key>/` (a Hub
          dataset's: `~/.cache/z2all/<org>--<name>/<task>_<key>/`), where key hashes the data
          files' paths, sizes and mtimes, the tokenizer fingerprint, max_seq_len and the
          system prompt: changing any of them builds a new cache, a repeated run reuses the old
          one (dataset/chat_store.py `chat_store_dir`). Train/valid: the data's own
          `validation` (else `test`) split when it has one
          (a DatasetDict, a Hub dataset, `DIR@train` beside `DIR@validation`:
          utils/data_files.py `validation_spec`), rendered into a cache of its own, and all of
          train trains; else, from train, files named valid* or eval* are validation, else a
          seeded `valid_ratio` of samples (dataset/chat_store.py).

stream    (`build_stream_datasets`, --data_format=stream) raw shards tokenized on the fly by
          DataLoader workers, nothing prepared or cached (dataset/stream.py). Validation: the
          data's own split as above, else every round(1 / valid_ratio)th record held out.

`validation_note(config, count, scored)` is the start-up line that says which of these it was.

Under torchrun, rank 0 prepares (index or cache) while the others wait on a done-file with
their own timeout (dataset/prepare.py); then every rank memory-maps the same files.

The tokenizer comes loaded (the caller's, checked against the model: trainer/model_setup.py);
worker processes that tokenize load it again from its directory, `tokenizer.name_or_path`.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset, default_collate

from data_preprocess.build_pretrain_sample_index_map import (
    DEFAULT_VALID_RATIO,
    build_sample_index,
    index_path,
)
from data_preprocess.file_jobs import DEFAULT_WORKERS
from dataset.chat_store import (
    ChatTokenStore,
    chat_store_dir,
    find_store_sidecars,
    split_train_valid,
)
from dataset.data_config import DataConfig
from dataset.dataset_dpo import DPOCollator, DPODataset
from dataset.dataset_pretrain import PretokDatasetWithIndex
from dataset.dataset_sft import SFTCollator, SupervisedDataset
from dataset.prepare import DEFAULT_PREPARE_TIMEOUT_S, prepare_once
from dataset.sft_packing import PackingSFTCollator
from dataset.stream import StreamDataset, StreamLoader, StreamSettings, holdout_items
from dataset.stream_shards import find_sources
from utils.data_files import validation_spec
from utils.tokenizer_protocol import Tokenizer

TASK_TYPES = ("pretrain", "sft", "dpo")
PAD_TO_MULTIPLE_OF = 8  # padded batches' lengths: tensor cores like multiples of 8


def check_pretok_tokenizer(data_dir: Path, fingerprint: str) -> None:
    """Refuse token files made by another tokenizer (their ids would mean other tokens)."""
    for prefix, sidecar in find_store_sidecars(data_dir, "pretok"):
        if sidecar["tokenizer"] != fingerprint:
            raise ValueError(f"{prefix}.json: made with tokenizer {sidecar['tokenizer']}, but "
                             f"--tokenizer_dir has {fingerprint}; re-run pretokenization")


def build_datasets(task_type: str, data_dir: str | Path, tokenizer: Tokenizer,
                   max_seq_len: int, seed: int = 1337, *,
                   valid_ratio: float = DEFAULT_VALID_RATIO, system_prompt: str | None = None,
                   cache_dir: str | Path | None = None, num_workers: int = DEFAULT_WORKERS,
                   prepare_timeout_s: float = DEFAULT_PREPARE_TIMEOUT_S,
                   pad_to_multiple_of: int = PAD_TO_MULTIPLE_OF, pack_samples: bool = False
                   ) -> tuple[Dataset, Dataset, Any]:
    """(train, valid, collate_fn) for `task_type`; see the module docstring for the sources.
    pack_samples (sft): each batch's samples end to end in rows of max_seq_len
    (dataset/sft_packing.py)."""
    if task_type not in TASK_TYPES:
        raise ValueError(f"task_type must be one of {TASK_TYPES}, got {task_type!r}")
    if pack_samples and task_type != "sft":
        raise ValueError(f"packing is for sft samples, not {task_type}")
    if task_type == "pretrain":
        data_dir = Path(data_dir)
        check_pretok_tokenizer(data_dir, tokenizer.fingerprint)
        def build_index() -> None:
            build_sample_index(data_dir, max_seq_len, valid_ratio=valid_ratio, seed=seed)

        valid_sidecar = index_path(data_dir, max_seq_len, "valid").with_suffix(".ibin.json")
        prepare_once(valid_sidecar, build_index, f"the L={max_seq_len} sample index of "
                     f"{data_dir}", prepare_timeout_s)  # valid is written after train
        train, valid = (PretokDatasetWithIndex(data_dir, max_seq_len, split, len(tokenizer))
                        for split in ("train", "valid"))
        return train, valid, default_collate

    valid_source = validation_source(data_dir)  # None: part of train is held out instead

    def store_of(spec: str | Path) -> ChatTokenStore:
        store_dir = chat_store_dir(task_type, spec, tokenizer.name_or_path, tokenizer.fingerprint,
                                   max_seq_len, system_prompt, cache_dir, num_workers,
                                   prepare_timeout_s)
        return ChatTokenStore(store_dir, task_type, tokenizer.fingerprint, max_seq_len)

    store = store_of(data_dir)
    if valid_source is None:
        train_ids, valid_ids = split_train_valid(store, valid_ratio, seed)
        valid_store = store
    else:  # the data's own validation split: all of train trains
        valid_store = store_of(valid_source)
        train_ids, valid_ids = np.arange(len(store)), np.arange(len(valid_store))
    dataset_class, collator_class = ((SupervisedDataset, SFTCollator) if task_type == "sft"
                                     else (DPODataset, DPOCollator))
    if pack_samples:
        collator_class = PackingSFTCollator
    collate_fn = collator_class(tokenizer.pad_token_id, pad_to_multiple_of, max_seq_len)
    return dataset_class(store, train_ids), dataset_class(valid_store, valid_ids), collate_fn


def validation_source(data_dir: str | Path, data_mix: str = "") -> str | None:
    """The spec of the data's own validation split that training evaluates on, or None when
    it holds out part of the training data instead (pretokenized data has no split beside
    its sample index's; a --data_mix reads named parts, each its own split)."""
    if data_mix:
        return None
    return validation_spec(data_dir)


def validation_note(config: DataConfig, count: int, scored: int) -> str:
    """The start-up line saying how many validation samples there are, where from, and how many
    of them each evaluation scores (`scored`: the trainer's --eval_iters global batches)."""
    source = validation_source(config.data_dir, config.data_mix)
    where = (f"{count} samples from the data's own split {source}" if source is not None
             else f"held out from train: {count} samples")
    return f"validation: {where}; each evaluation scores {min(count, scored)} of them"


def build_stream_datasets(config: DataConfig, tokenizer: Tokenizer, seed: int, *, batch_size: int,
                          valid_samples: int, rank: int = 0, world_size: int = 1,
                          system_prompt: str | None = None,
                          pad_to_multiple_of: int = PAD_TO_MULTIPLE_OF
                          ) -> tuple[StreamLoader, list, Any]:
    """(train StreamLoader, valid samples, collate_fn) read straight from raw shards.

    Validation: the first `valid_samples` samples of the data's own validation split when it
    has one (`validation_source`: then no record is held out of training); else every record
    whose number is a multiple of round(1 / valid_ratio) is held out of training, and the
    first `valid_samples` samples made from those records are the validation set
    (dataset/stream_shards.py)."""
    if config.task_type not in TASK_TYPES:
        raise ValueError(f"task_type must be one of {TASK_TYPES}, got {config.task_type!r}")
    valid_source = validation_source(config.data_dir, config.data_mix)
    settings = StreamSettings(config.task_type, tokenizer.name_or_path, config.max_seq_len,
                              seed, system_prompt=system_prompt,
                              skip_bad_records=config.skip_bad_records,
                              holdout_every=0 if valid_source else round(1 / DEFAULT_VALID_RATIO))
    sources = find_sources(config.data_dir, config.data_mix)
    dataset = StreamDataset(sources, settings, rank, world_size, config.num_workers)
    # Validation: the held-out records of `dataset`, or every record of the data's own split.
    held_out = dataset if valid_source is None else StreamDataset(
        find_sources(valid_source), replace(settings, holdout_every=1), rank, world_size,
        config.num_workers)
    collate_fn: Any = default_collate
    if config.task_type != "pretrain":
        collator_class = SFTCollator if config.task_type == "sft" else DPOCollator
        collate_fn = collator_class(tokenizer.pad_token_id, pad_to_multiple_of,
                                    config.max_seq_len)
    loader = StreamLoader(dataset, batch_size, collate_fn, config.num_workers,
                          config.shuffle_buffer)
    valid = holdout_items(held_out, valid_samples)
    if not valid:
        where = (f"its split {valid_source}" if valid_source else "the held-out records "
                 f"(every {settings.holdout_every}th of each shard)")
        warnings.warn(f"{config.data_dir}: no validation samples: {where} made no complete "
                      "sample, so val_loss is NaN; add data or lower --max_seq_len",
                      stacklevel=2)
    return loader, valid, collate_fn
