"""Pretraining sample index: where every training sample starts (docs/design.md §2.5).

    python -m data_preprocess.build_pretrain_sample_index_map --data_dir data/demo/pretok_hf \\
        --max_seq_len 256 [--valid_ratio 0.01 | --valid_samples 100] [--seed 1337]

writes `train_L256.ibin` / `valid_L256.ibin` (+ `.ibin.json` sidecars) into the data dir,
replacing only files of those names it wrote itself (`claim_index_files`).

How samples tile the token stream. Each `.bin` file is one stream (its documents back to back,
each ending in EOS). Samples are windows of L+1 tokens taken with stride L: sample k of a file
covers tokens [k*L, k*L + L]; input = the first L, target = the last L (shifted by one).
Consecutive samples share one token (the last target of one is the first input of the next),
so every token after the first is predicted exactly once per epoch. A file of N tokens gives
(N - 1) // L samples; its last < L+1 tokens are left over. Samples cross documents (packing:
the EOS marks the boundary) but never files.

Worked example, L = 4, files a.bin (11 tokens) and b.bin (6 tokens):

    a.bin  t0 t1 t2 t3 t4 t5 t6 t7 t8 t9 t10    slot 0 = t0..t4, slot 1 = t4..t8 (t9, t10 unused)
    b.bin  u0 u1 u2 u3 u4 u5                    slot 2 = u0..u4                  (u5 unused)

    slots (file_index, token_offset): [(0, 0), (0, 4), (1, 0)]
    with --valid_samples 1 --seed s: say slot 1 is drawn ->
    valid_L4.ibin = [(0, 4)]      train_L4.ibin = [(0, 0), (1, 0)]   (int64 pairs, little-endian)

Train/valid split: a seeded random subset of slots is the validation set, every other slot is
training; disjoint by construction and together they are all slots. (A valid sample shares its
first and last token with its neighbouring train samples: one token of context, not a sample.)
Order: both files list slots in stream order; this index is deterministic and is NOT shuffled
here -- the sampler draws a new seeded permutation each epoch (dataset/sampler.py).

Memory: the slots are generated file by file in chunks, so only the validation ids
(O(valid samples)) and one chunk are in memory, however large the corpus. (One exception:
numpy draws a validation share above 2% of the slots through a temporary permutation of all
of them, 8 bytes per slot; the default 1% stays O(valid samples).)
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from data_preprocess.indexed_dataset import IndexedDataset
from utils.atomic_io import atomic_open, atomic_write_json
from utils.cli_errors import run_main
from utils.data_files import find_data_files
from utils.data_output_dir import LEDGER, OutputLedger
from utils.option_checks import raise_problems, range_problem
from utils.option_parser import OptionParser

INDEX_FORMAT, INDEX_VERSION = "z2all-sample-index", 1
TOOL = "build_pretrain_sample_index_map"  # the writer it records in a folder's ledger
CHUNK_SLOTS = 1 << 20  # slots generated per numpy step (16 MiB of int64 pairs)
DEFAULT_VALID_RATIO = 0.01
DEFAULT_SEED = 1337


def index_path(data_dir: str | Path, max_seq_len: int, split: str) -> Path:
    return Path(data_dir) / f"{split}_L{max_seq_len}.ibin"


def is_index_sidecar(path: Path) -> bool:
    """Whether `path` is a sample index's sidecar (of any split, length or version): a JSON
    object naming INDEX_FORMAT. A missing, torn or foreign file is not."""
    try:
        sidecar = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(sidecar, dict) and sidecar.get("format") == INDEX_FORMAT


def claim_index_files(data_dir: str | Path, max_seq_len: int) -> None:
    """The index replaces only files it wrote itself (docs/design.md §2.5): where a z2all tool
    keeps a ledger (utils/data_output_dir.py, e.g. the pretokenizer's output), its four names
    are recorded there before they are written, so a later pretokenize run into the folder
    knows them; an existing one must be listed there as this tool's, or be (or sit beside) a
    z2all-sample-index sidecar. Anything else under those names is refused, not replaced."""
    names = [name for split in ("train", "valid")
             for name in (index_path(data_dir, max_seq_len, split).name,
                          index_path(data_dir, max_seq_len, split).name + ".json")]
    ledgers = OutputLedger.read_all(data_dir)  # the plain one first, then array tasks' ones
    plain = next((ledger for ledger in ledgers if ledger.name == LEDGER), None)
    for name in names:
        path = Path(data_dir) / name
        if not path.exists() or (plain is not None and plain.files.get(name) == TOOL):
            continue
        if not is_index_sidecar(path if name.endswith(".json") else Path(f"{path}.json")):
            raise ValueError(f"--data_dir {data_dir}: {path} is not a sample index this tool "
                             f"wrote (no {INDEX_FORMAT} sidecar), and the index is written "
                             "under that name; move it away")
    if ledgers:  # where an array task's ledger is the only one, too
        OutputLedger.record(data_dir, names, TOOL)


def find_token_files(data_dir: str | Path) -> list[dict[str, Any]]:
    """Every `.bin`/`.idx` pair under data_dir (hidden folders skipped), sorted by path."""
    data_dir = Path(data_dir)
    files = []
    for idx_path in find_data_files(data_dir, extensions=(".idx",)):
        relative = idx_path.relative_to(data_dir).with_suffix("")
        num_tokens = IndexedDataset(data_dir / relative).num_tokens
        files.append({"path": relative.as_posix() + ".bin", "num_tokens": num_tokens})
    if not files:
        raise FileNotFoundError(f"no .bin/.idx token files under {data_dir}; run "
                                "python -m data_preprocess.pretokenize_pretrain_data first")
    return files


def check_files_unchanged(data_dir: str | Path, sidecar: dict[str, Any], where: Path) -> None:
    """Refuse an index whose token files were changed, added or removed since it was built."""
    pinned = {entry["path"]: entry["num_tokens"] for entry in sidecar["files"]}
    current = {entry["path"]: entry["num_tokens"] for entry in find_token_files(data_dir)}
    for path in sorted(pinned.keys() | current.keys()):
        if path not in current:
            problem = "was removed"
        elif path not in pinned:
            problem = "was added"
        elif pinned[path] != current[path]:
            problem = f"has {current[path]} tokens, the index was built for {pinned[path]}"
        else:
            continue
        raise ValueError(f"{where}: token file {Path(data_dir) / path} {problem} since the "
                         "index was built; rebuild it with "
                         "python -m data_preprocess.build_pretrain_sample_index_map")


def slots_per_file(files: list[dict[str, Any]], max_seq_len: int) -> np.ndarray:
    """(N - 1) // L samples per file of N tokens (0 for a file shorter than L + 1)."""
    tokens = np.array([entry["num_tokens"] for entry in files], dtype=np.int64)
    return np.maximum(tokens - 1, 0) // max_seq_len


def slot_pairs(global_slots: np.ndarray, first_slot_of_file: np.ndarray,
               max_seq_len: int) -> np.ndarray:
    """Global slot ids -> (file_index, token_offset) int64 pairs, shape [n, 2]."""
    file_index = np.searchsorted(first_slot_of_file, global_slots, side="right") - 1
    offsets = (global_slots - first_slot_of_file[file_index]) * max_seq_len
    return np.stack([file_index, offsets], axis=1).astype("<i8")


def train_pair_chunks(num_slots: int, valid_slots: np.ndarray, first_slot_of_file: np.ndarray,
                      max_seq_len: int) -> Iterator[np.ndarray]:
    """All slots except the valid ones, in order, CHUNK_SLOTS at a time."""
    for start in range(0, num_slots, CHUNK_SLOTS):
        chunk = np.arange(start, min(start + CHUNK_SLOTS, num_slots), dtype=np.int64)
        is_valid = np.isin(chunk, valid_slots, assume_unique=True)
        yield slot_pairs(chunk[~is_valid], first_slot_of_file, max_seq_len)


def write_index(path: Path, chunks: Iterator[np.ndarray], sidecar: dict[str, Any]) -> int:
    num_samples = 0
    with atomic_open(path, "wb") as handle:
        for pairs in chunks:
            handle.write(pairs.tobytes())  # int64 (file_index, token_offset) per sample
            num_samples += len(pairs)
    atomic_write_json(path.with_name(path.name + ".json"), {**sidecar, "num_samples": num_samples})
    return num_samples


def build_sample_index(data_dir: str | Path, max_seq_len: int,
                       valid_ratio: float = DEFAULT_VALID_RATIO, valid_samples: int | None = None,
                       seed: int = DEFAULT_SEED) -> dict[str, int]:
    """Write the train and valid `.ibin` files of data_dir; return their sample counts."""
    raise_problems([range_problem("--max_seq_len", max_seq_len, 1),
                    range_problem("--valid_ratio", valid_ratio, 0, 1, high_open=True),
                    range_problem("--valid_samples", valid_samples, 0)])
    files = find_token_files(data_dir)
    per_file = slots_per_file(files, max_seq_len)
    first_slot_of_file = np.concatenate([[0], np.cumsum(per_file)[:-1]]).astype(np.int64)
    num_slots = int(per_file.sum())
    if num_slots < 2:
        raise ValueError(f"{data_dir}: only {num_slots} samples of {max_seq_len + 1} tokens; "
                         "need at least 2 (train + valid): lower --max_seq_len or add data")
    if valid_samples is None:  # a ratio > 0: at least one valid sample, never all of them
        wanted = max(1, round(valid_ratio * num_slots)) if valid_ratio > 0 else 0
        valid_samples = min(wanted, num_slots - 1)
    if not 0 <= valid_samples < num_slots:
        raise ValueError(f"{data_dir}: {num_slots} samples in total; cannot hold out "
                         f"{valid_samples} for validation")
    claim_index_files(data_dir, max_seq_len)
    # Un-commit any older index first: each sidecar is its split's commit mark (valid's is the
    # one dataset/build.py waits for), so a crash below never leaves an old sidecar beside a
    # new .ibin, e.g. a train split drawn with another seed than the valid split it pairs with.
    for split in ("train", "valid"):
        path = index_path(data_dir, max_seq_len, split)
        path.with_name(path.name + ".json").unlink(missing_ok=True)
    rng = np.random.default_rng(seed)
    valid_slots = np.sort(rng.choice(num_slots, size=valid_samples, replace=False))
    counts = {}
    for split in ("train", "valid"):
        sidecar = {"format": INDEX_FORMAT, "version": INDEX_VERSION, "seq_len": max_seq_len,
                   "split": split, "seed": seed, "files": files}
        chunks = (train_pair_chunks(num_slots, valid_slots, first_slot_of_file, max_seq_len)
                  if split == "train" else
                  iter([slot_pairs(valid_slots, first_slot_of_file, max_seq_len)]))
        counts[split] = write_index(index_path(data_dir, max_seq_len, split), chunks, sidecar)
    return counts


def load_index_sidecar(data_dir: str | Path, max_seq_len: int, split: str) -> dict[str, Any]:
    path = index_path(data_dir, max_seq_len, split)
    sidecar_path = path.with_name(path.name + ".json")
    if not sidecar_path.exists():  # never built, or a rebuild did not finish
        raise FileNotFoundError(f"{sidecar_path} not found: build the index with python -m "
                                "data_preprocess.build_pretrain_sample_index_map --data_dir "
                                f"{data_dir} --max_seq_len {max_seq_len}")
    sidecar = json.loads(sidecar_path.read_text())
    if sidecar.get("format") != INDEX_FORMAT or sidecar.get("version") != INDEX_VERSION:
        raise ValueError(f"{path}.json: not a {INDEX_FORMAT} v{INDEX_VERSION} sidecar")
    if sidecar["seq_len"] != max_seq_len or sidecar["split"] != split:
        raise ValueError(f"{path}.json: built for seq_len {sidecar['seq_len']} split "
                         f"{sidecar['split']}, asked for {max_seq_len} {split}")
    check_files_unchanged(data_dir, sidecar, path)
    return sidecar


def main(argv: list[str] | None = None) -> None:
    parser = OptionParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_dir", required=True, help="folder of pretokenized .bin/.idx")
    parser.add_argument("--max_seq_len", type=int, required=True, help="tokens per sample (L)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--valid_ratio", type=float, default=DEFAULT_VALID_RATIO,
                       help="fraction of samples held out for validation")
    group.add_argument("--valid_samples", type=int, default=None,
                       help="exact number of samples held out (instead of --valid_ratio)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the split")
    args = parser.parse_args(argv)
    counts = build_sample_index(args.data_dir, args.max_seq_len, args.valid_ratio,
                                args.valid_samples, args.seed)
    for split, count in counts.items():
        print(f"{index_path(args.data_dir, args.max_seq_len, split)}: {count:,} samples "
              f"of {args.max_seq_len + 1} tokens")


if __name__ == "__main__":
    sys.exit(run_main(main))
