"""What a data option names, as a list of files: the one place every entry point that reads
raw data turns `--data_dir` (`--data`, `--input`, ...) into files. The readers (utils/readers.py)
then stream each file.

A data option names one of (docs/design.md §2.1):

    data/pretrain                a file or a folder: its data files (utils/dataset_splits.py:
                                 a `datasets` save_to_disk or cache folder is read as a split)
    data/my_dict@validation      a folder's split: `DIR@split` (a DatasetDict's split folder,
                                 the datasets cache's split shards, or the files whose names
                                 say the split: valid.jsonl, data/validation-00000-of-00001...)
    hf:org/name[:config][@split] a Hugging Face Hub dataset, from the HF cache
                                 (utils/hub_datasets.py)

A path that exists is always that path, whatever its spelling. Which split, when none is
named: `train` for training and preprocessing, `validation` then `test` for evaluation (the
caller says which, with `splits`).

`locate_data` answers with the files and the folder they are named relative to (the snapshot
directory, for a Hub dataset): pretokenization mirrors those relative paths in its output, the
stream records them in its checkpoints, the online SFT/DPO cache hashes them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from utils.dataset_splits import EVAL_SPLITS, TRAIN_SPLITS, data_files_under, files_of_split
from utils.hub_datasets import HUB_PREFIX, hub_dataset_files, parse_hub_spec
from utils.readers import SUPPORTED_EXTENSIONS, ReadStats, iter_texts


@dataclass(frozen=True)
class DataFiles:
    """The files one data option names, sorted, and the folder they are named relative to."""

    root: Path
    files: list[Path]
    name: str  # short, for messages: the folder's name, or the Hub dataset's
    hub_id: str | None = None  # "org/name" when root is its snapshot in the HF cache (read-only)

    def relative_names(self) -> list[str]:
        return [path.relative_to(self.root).as_posix() for path in self.files]


def is_data_spec(text: str | Path) -> bool:
    """True when `text` names data by id or split (`hf:...`, `DIR@split`) rather than as a path
    on disk: such data is read, never written next to."""
    return not Path(text).exists() and (str(text).startswith(HUB_PREFIX) or "@" in str(text))


def locate_data(spec: str | Path, *, extensions: Sequence[str] = SUPPORTED_EXTENSIONS,
                splits: Sequence[str] = TRAIN_SPLITS, option: str = "--data_dir") -> DataFiles:
    """The files `spec` names (module docstring); `option` names it in one-line errors."""
    text, path = str(spec), Path(spec)
    if path.is_file():
        if path.suffix.lower() not in extensions:
            raise ValueError(f"{path}: unsupported file type; expected one of {extensions}")
        return DataFiles(path.parent, [path], path.stem)
    if path.is_dir():
        return DataFiles(path, data_files_under(path, extensions, splits), path.name)
    if text.startswith(HUB_PREFIX):
        hub_spec = parse_hub_spec(text, option)
        snapshot, files = hub_dataset_files(hub_spec, splits, extensions, option)
        return DataFiles(snapshot, files, hub_spec.repo_id.split("/")[-1], hub_spec.repo_id)
    folder, at, split = text.rpartition("@")
    if at and Path(folder).is_dir() and split:
        folder_path = Path(folder)
        files = files_of_split(data_files_under(folder_path, extensions, [split]), folder_path,
                               [split], folder, option)
        return DataFiles(folder_path, files, folder_path.name)
    raise FileNotFoundError(f"{option} {text}: no such file or directory")


def validation_spec(spec: str | Path, option: str = "--data_dir") -> str | None:
    """`<spec>@validation` (else `@test`) when the data `spec` names has that split as files of
    its own beside those it trains on: a DatasetDict saved to disk, the datasets cache, a Hub
    dataset, files named by split (`DIR@train` trains on them, `DIR@validation` is there).
    None otherwise: a plain folder is one split (all of it trains), and a trainer then holds
    out part of it (dataset/build.py).

        my_dict/   {dataset_dict.json, train/, validation/}   -> "my_dict@validation"
        hf:org/name (train-*.parquet, test-*.parquet)         -> "hf:org/name@test"
        data/      {a.jsonl, valid.jsonl}                     -> None: both are read to train
    """
    text = str(spec)
    if Path(text).is_file():
        return None
    base = text if Path(text).exists() else text.rpartition("@")[0] or text
    training = set(locate_data(spec, option=option).files)
    for split in EVAL_SPLITS:
        candidate = f"{base}@{split}"
        try:
            files = locate_data(candidate, splits=(split,), option=option).files
        except (ValueError, FileNotFoundError):  # no such split there
            continue
        if files and not training & set(files):
            return candidate
    return None


def mix_source(spec: str | Path, name: str) -> str:
    """The part `name` of `spec` that a `--data_mix` source names: a subfolder of a folder
    (`DIR/web`, `DIR/web@split`), a config of a Hub dataset (`hf:org/name:web[@split]`)."""
    text = str(spec)
    if Path(text).exists():
        return str(Path(text) / name)
    if text.startswith(HUB_PREFIX):
        hub_spec = parse_hub_spec(text, "--data_dir")
        if hub_spec.config:
            raise ValueError(f"--data_mix names configs of {hub_spec.repo_id}: leave "
                             f"':{hub_spec.config}' out of --data_dir {text}")
        return str(replace(hub_spec, config=name))
    folder, at, split = text.rpartition("@")
    return f"{Path(folder) / name}@{split}" if at else str(Path(text) / name)


def find_data_files(paths: str | Path | Iterable[str | Path],
                    extensions: Sequence[str] = SUPPORTED_EXTENSIONS, *,
                    splits: Sequence[str] = TRAIN_SPLITS, option: str = "--data_dir"
                    ) -> list[Path]:
    """The files of every spec in `paths` (one or several), sorted, no duplicates."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    found: set[Path] = set()
    for spec in paths:
        found.update(locate_data(spec, extensions=extensions, splits=splits,
                                 option=option).files)
    return sorted(found)


def iter_texts_from(paths: str | Path | Iterable[str | Path],
                    text_key: str | Sequence[str] = "text", *, skip_bad_records: bool = False,
                    stats: ReadStats | None = None, option: str = "--input") -> Iterator[str]:
    """`iter_texts` over every data file `paths` name, in sorted order."""
    stats = stats if stats is not None else ReadStats()
    for path in find_data_files(paths, option=option):
        yield from iter_texts(path, text_key, skip_bad_records=skip_bad_records, stats=stats)
