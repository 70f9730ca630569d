"""Pretraining samples: fixed windows of the token stream, located by the `.ibin` index.

    dataset = PretokDatasetWithIndex("data/demo/pretok_hf", max_seq_len=256, split="train")
    dataset[i] -> {"input_ids": int64[256], "labels": int64[256]}   labels[t] = input_ids[t + 1]

`.ibin` row i = (file_index, token_offset): sample i is the L + 1 tokens of file `file_index`
starting at `token_offset` (data_preprocess/build_pretrain_sample_index_map.py shows the tiling);
input = the first L, labels = the last L, i.e. already shifted for the model (docs/design.md §5).

Memory: the index and every `.bin` are memory-mapped, so a sample costs one small read; nothing
proportional to the corpus is loaded. The maps are opened lazily in each process (and dropped
when the dataset is pickled for DataLoader workers), because pickling a np.memmap copies it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from data_preprocess.build_pretrain_sample_index_map import index_path, load_index_sidecar
from data_preprocess.indexed_dataset import IndexedDataset


class PretokDatasetWithIndex(Dataset):
    def __init__(self, data_dir: str | Path, max_seq_len: int, split: str = "train",
                 vocab_size: int | None = None) -> None:
        self.data_dir, self.max_seq_len, self.split = Path(data_dir), max_seq_len, split
        self.index_path = index_path(data_dir, max_seq_len, split)
        self.vocab_size = vocab_size  # when given, every sample's ids are checked against it
        # Refuses to load (naming the file) if a .bin changed, appeared or vanished since.
        sidecar = load_index_sidecar(data_dir, max_seq_len, split)
        self.num_samples = sidecar["num_samples"]
        self.token_file_prefixes = [self.data_dir / entry["path"].removesuffix(".bin")
                                    for entry in sidecar["files"]]
        expected_bytes = 16 * self.num_samples  # two int64 per sample
        if self.index_path.stat().st_size != expected_bytes:
            raise ValueError(f"{self.index_path}: {self.index_path.stat().st_size} bytes, its "
                             f"sidecar promises {self.num_samples} samples ({expected_bytes} B)")
        self._maps: tuple[np.ndarray, list[np.ndarray]] | None = None

    def _open(self) -> tuple[np.ndarray, list[np.ndarray]]:
        if self._maps is None:
            samples = (np.memmap(self.index_path, dtype="<i8", mode="r").reshape(-1, 2)
                       if self.num_samples else np.zeros((0, 2), dtype=np.int64))
            tokens = [IndexedDataset(prefix).tokens for prefix in self.token_file_prefixes]
            self._maps = (samples, tokens)
        return self._maps

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_maps": None}  # each process maps the files itself

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        samples, tokens = self._open()
        file_index, offset = (int(value) for value in samples[index])
        window = tokens[file_index][offset: offset + self.max_seq_len + 1]
        if self.vocab_size is not None and window.max() >= self.vocab_size:
            # Said here, naming the file, rather than as a bare IndexError inside the model.
            raise ValueError(
                f"{self.token_file_prefixes[file_index]}.bin: token id {int(window.max())} at "
                f"or after token {offset} is outside the tokenizer's vocabulary "
                f"({self.vocab_size}); the file is damaged or from another tokenizer")
        window = torch.from_numpy(window.astype(np.int64))
        return {"input_ids": window[:-1], "labels": window[1:]}
