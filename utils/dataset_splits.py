"""Which files of a folder are data, and of which split: plain folders, the folders `datasets`
writes, and the file names of a Hugging Face dataset repository.

Training reads the `train` split (TRAIN_SPLITS); evaluation the first of `validation`, `test`
that exists (EVAL_SPLITS); `DIR@split` or `hf:org/name@split` names one (utils/data_files.py).

    a plain folder                 every data file below it (sorted; hidden files and folders
                                   skipped): no split is chosen, as always
    Dataset.save_to_disk           DIR/{state.json, dataset_info.json, data-00000-of-00001.arrow}
                                   -> the .arrow shards state.json lists, in its order
    DatasetDict.save_to_disk       DIR/{dataset_dict.json, train/, test/}
                                   -> the split's folder, read as above
    the `datasets` cache           $HF_DATASETS_CACHE/parquet/default-8013be88/0.0.0/a8595/
    (what load_dataset wrote)          {dataset_info.json, parquet-train.arrow, cache-7824e9.arrow,
                                        parquet-test-00000-of-00002.arrow, ...}
                                   -> the split's shards `<name>-<split>[-NNNNN-of-NNNNN].arrow`
                                   (dataset_info.json lists the splits; `cache-*.arrow` are
                                   results of `.map()` and friends, not the dataset)

Such a folder is read the same way wherever it is found, named itself or inside a plain folder.

Split by file name (a Hub repository, or `DIR@split`), the Hub's convention: a file belongs to
the split named by the first word of its path below the folder that names one (words are
separated by `-`, `.`, `_`, spaces, digits and `/`):

    data/train-00000-of-00002.parquet   words data, train, of   -> train
    data/test-00000-of-00001.parquet                            -> test
    dev/part.jsonl                                              -> validation
    extra/notes.jsonl                                           -> no split: not read
and when no file names a split, every file is `train`. SPLIT_WORDS lists the names.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

TRAIN_SPLITS = ("train",)
EVAL_SPLITS = ("validation", "test")
# The words that name a split in a Hub repository's file names (the `datasets` library's list).
SPLIT_WORDS = {"train": ("train", "training"),
               "validation": ("validation", "valid", "val", "dev"),
               "test": ("test", "testing", "eval", "evaluation")}
_SPLIT_OF_WORD = {word: split for split, words in SPLIT_WORDS.items() for word in words}
_WORD_SEPARATORS = re.compile(r"[-._ 0-9/]+")
# Data-like files no reader handles (convert them first): reported when a folder is scanned.
LOOKS_LIKE_DATA = (".csv", ".tsv", ".ndjson", ".gz", ".bz2", ".xz", ".zst", ".zip")
# Reports that z2all commands leave next to their output; not data when the folder is read back
# (clean_pretrain_data writes clean_report.json beside its shards, the next step's input).
TOOL_REPORTS = ("clean_report.json",)


def canonical_split(name: str) -> str:
    """"valid" -> "validation", "eval" -> "test"; another name is itself."""
    return _SPLIT_OF_WORD.get(name.lower(), name)


def pick_split(available: Iterable[str], wanted: Sequence[str], base: str, option: str = ""
               ) -> str:
    """The first of `wanted` among `available` (either side may use another word for it:
    "valid" finds "validation"); else a one-line error naming `option`, the splits there and
    how to choose one (`base@split`)."""
    available = list(available)
    for split in wanted:
        for name in available:
            if canonical_split(name) == canonical_split(split):
                return name
    names = ", ".join(sorted(available)) or "none"
    fix = f"; name one: {base}@{sorted(available)[0]}" if available else ""
    raise ValueError(f"{option + ' ' if option else ''}{base}: no "
                     f"{' or '.join(map(repr, wanted))} split (it has {names}){fix}")


def datasets_folder_files(folder: Path, wanted: Sequence[str]) -> list[Path] | None:
    """The wanted split's shards when `folder` is one `datasets` wrote (see the module
    docstring); None for any other folder."""
    if (folder / "dataset_dict.json").is_file():  # DatasetDict.save_to_disk: one folder a split
        splits = json.loads((folder / "dataset_dict.json").read_text(encoding="utf-8"))["splits"]
        folder = folder / pick_split(splits, wanted, str(folder))
    state = _json_object(folder / "state.json")
    if "_data_files" in state:  # Dataset.save_to_disk
        return [folder / shard["filename"] for shard in state["_data_files"]]
    info = _json_object(folder / "dataset_info.json")  # the datasets cache
    shards = {split: _cache_shards(folder, split) for split in info.get("splits") or {}}
    if any(shards.values()):
        return shards[pick_split([s for s in shards if shards[s]], wanted, str(folder))]
    return None


def _json_object(path: Path) -> dict:
    """The JSON object in `path`; {} when there is none (no such file, or another JSON value)."""
    if not path.is_file():
        return {}
    value = json.loads(path.read_text(encoding="utf-8"))
    return value if isinstance(value, dict) else {}


def _cache_shards(folder: Path, split: str) -> list[Path]:
    """`<name>-<split>.arrow` or `<name>-<split>-00000-of-00004.arrow`, ...: one split's shards
    in the datasets cache, in order."""
    shard = re.compile(rf".+-{re.escape(split)}(-\d{{5}}-of-\d{{5}})?\.arrow")
    return sorted(path for path in folder.glob("*.arrow") if shard.fullmatch(path.name))


def data_files_under(folder: Path, extensions: Sequence[str], wanted: Sequence[str]
                     ) -> list[Path]:
    """Every data file below `folder`, sorted, a `datasets` folder read as its wanted split.

    Hidden files and folders (name starting with ".") are skipped: they include the temporary
    files of utils.atomic_io, which are never finished data, and the trainer's .z2all_cache.
    """
    found, unreadable = [], []
    for directory, subfolders, names in os.walk(folder):
        here = Path(directory)
        if (shards := datasets_folder_files(here, wanted)) is not None:
            found += [path for path in shards if path.suffix.lower() in extensions]
            subfolders.clear()  # its split folders are read through it, not on their own
            continue
        subfolders[:] = sorted(name for name in subfolders if not name.startswith("."))
        for name in names:
            path = here / name
            if name.startswith(".") or name in TOOL_REPORTS or not path.is_file():
                continue
            if path.suffix.lower() in extensions:
                found.append(path)
            elif path.suffix.lower() in LOOKS_LIKE_DATA:
                unreadable.append(path.relative_to(folder).as_posix())
    if unreadable:  # said, not silently dropped: the user may think they were read
        shown = ", ".join(sorted(unreadable)[:5]) + (", ..." if len(unreadable) > 5 else "")
        print(f"note: {folder}: skipping {len(unreadable)} files of unsupported type: "
              f"{shown} (supported: {' '.join(extensions)})", file=sys.stderr)
    return sorted(found)


def split_named_by(relative: Path, wanted: Sequence[str] = ()) -> str | None:
    """The split a file's path names (module docstring), or None; a wanted split of another
    name (`@extra`) is named by that word."""
    custom = {split for split in wanted if canonical_split(split) == split}
    for word in _WORD_SEPARATORS.split(relative.with_suffix("").as_posix().lower()):
        if word in _SPLIT_OF_WORD or word in custom:
            return canonical_split(word)
    return None


def files_of_split(files: Sequence[Path], folder: Path, wanted: Sequence[str], base: str,
                   option: str = "") -> list[Path]:
    """The files of the first wanted split, by the names of their paths below `folder` (none
    when there are no files)."""
    if not files:
        return []
    by_split: dict[str, list[Path]] = {}
    for path in files:
        split = split_named_by(path.relative_to(folder), wanted)
        if split is not None:
            by_split.setdefault(split, []).append(path)
    if not by_split:  # no file names a split: all of them are `train`, as on the Hub
        by_split = {"train": list(files)}
    return by_split[pick_split(by_split, wanted, base, option)]
