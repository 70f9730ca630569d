"""Hugging Face Hub datasets by id, wherever data is taken: `hf:org/name[:config][@split]`.

    --data_dir hf:roneneldan/TinyStories                  its default config's `train` split
    --data_dir hf:HuggingFaceFW/fineweb-edu:sample-10BT   a config (as the dataset card names it)
    --data hf:org/name@validation                         a split (tools.evaluate's default:
                                                          validation, else test)

The files are read from the dataset's snapshot in the HF cache ($HF_HOME/hub/datasets--org--name/
snapshots/<commit>/, where `datasets` and `hf download` put them; utils/hub.py), offline with
HF_HUB_OFFLINE=1, else fetched first. Which files, step by step:

Step 1. The dataset card (README.md): its YAML header may list the configs and, for each, the
        files of each split, as the Hub's dataset viewer and `datasets` read them:
            configs:
            - config_name: default
              data_files:
              - split: train
                path: data/train-*
Step 2. The config: the one named; else the card's default (`default: true`, the one named
        `default`, or the only one). A repository whose card lists none has its configs as
        folders (`en/train-*.parquet`: config `en`), and without a config it is read whole.
Step 3. The split's files: the card's patterns, else the split their names say
        (utils/dataset_splits.py: data/train-00000-of-00001.parquet is `train`).
Step 4. Online, only those files are fetched, and only data files (.parquet, .arrow, .jsonl,
        .json, .txt). A `.py` loading script is code: never fetched, never run; a repository
        that holds nothing else is refused, saying so.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from utils.dataset_splits import data_files_under, files_of_split, pick_split
from utils.hub import dataset_snapshot

HUB_PREFIX = "hf:"
_SPEC = re.compile(r"hf:(?P<repo_id>[A-Za-z0-9][\w.-]*(?:/[\w.-]+)?)"
                   r"(?::(?P<config>[^:@/]+))?(?:@(?P<split>\w+(?:\.\w+)*))?")
SPELLING = "hf:org/name[:config][@split]"


@dataclass(frozen=True)
class HubDatasetSpec:
    """`hf:org/name:config@split`, parsed; config and split are None when not given."""

    repo_id: str
    config: str | None = None
    split: str | None = None

    @property
    def without_split(self) -> str:
        return f"{HUB_PREFIX}{self.repo_id}" + (f":{self.config}" if self.config else "")

    def __str__(self) -> str:
        return self.without_split + (f"@{self.split}" if self.split else "")


def parse_hub_spec(text: str, option: str) -> HubDatasetSpec:
    """`hf:org/name[:config][@split]` -> its parts; a one-line error for another spelling."""
    found = _SPEC.fullmatch(text)
    if found is None:
        raise ValueError(f"{option} {text}: not a Hugging Face dataset id; write {SPELLING}, "
                         "e.g. hf:roneneldan/TinyStories@validation")
    return HubDatasetSpec(**found.groupdict())


def card_configs(readme: Path) -> tuple[dict[str, dict[str, list[str]]], str | None]:
    """({config: {split: [glob pattern, ...]}}, the default config) from a dataset card's YAML
    header (Step 1); ({}, None) when it lists no configs."""
    text = readme.read_text(encoding="utf-8") if readme.is_file() else ""
    header = text.split("\n---", 1)[0].removeprefix("---\n") if text.startswith("---\n") else ""
    try:
        configs = (yaml.safe_load(header) or {}).get("configs") or []
    except (yaml.YAMLError, AttributeError):
        return {}, None
    splits, default = {}, None
    for config in configs:
        name = config.get("config_name", "default")
        splits[name] = _split_patterns(config.get("data_files", []))
        if config.get("default") or (name == "default" and default is None):
            default = name
    return splits, default or (next(iter(splits)) if len(splits) == 1 else None)


def _split_patterns(data_files: Any) -> dict[str, list[str]]:
    """A card's `data_files`, in any of its spellings, as {split: [pattern, ...]}:
    "a/*" | ["a/*", "b/*"] (all train) | [{split: s, path: p | [p, ...]}, ...] | {s: p, ...}."""
    def as_list(paths: Any) -> list[str]:
        return [paths] if isinstance(paths, str) else list(paths)

    if isinstance(data_files, dict):
        return {split: as_list(paths) for split, paths in data_files.items()}
    if isinstance(data_files, str) or all(isinstance(item, str) for item in data_files):
        return {"train": as_list(data_files)}
    patterns: dict[str, list[str]] = {}
    for item in data_files:
        patterns.setdefault(item.get("split", "train"), []).extend(as_list(item["path"]))
    return patterns


def hub_dataset_files(spec: HubDatasetSpec, wanted: Sequence[str], extensions: Sequence[str],
                      option: str) -> tuple[Path, list[Path]]:
    """(the snapshot directory, the data files of `spec`'s config and split), Steps 1-4."""
    wanted = [spec.split] if spec.split else wanted
    configs, default = _dataset_card(spec, option)  # Step 1
    if configs:
        config = spec.config or default
        if config not in configs:
            raise ValueError(_config_problem(spec, option, list(configs), listed=True))
        by_split = configs[config]
        patterns = by_split[pick_split(by_split, wanted, spec.without_split, option)]
        snapshot = dataset_snapshot(spec.repo_id, patterns, option, str(spec))  # Step 4
        files = sorted({path for pattern in patterns for path in snapshot.glob(pattern)
                        if path.is_file() and path.suffix.lower() in extensions})
    else:
        prefix = f"{spec.config}/" if spec.config else ""
        snapshot = dataset_snapshot(spec.repo_id, [f"{prefix}*{suffix}" for suffix in extensions],
                                    option, str(spec))  # Step 4
        folder = snapshot / spec.config if spec.config else snapshot
        if not folder.is_dir():
            folders = sorted(path.name for path in snapshot.iterdir()
                             if path.is_dir() and not path.name.startswith("."))
            raise ValueError(_config_problem(spec, option, folders, listed=False))
        files = files_of_split(data_files_under(folder, extensions, wanted), folder, wanted,
                               spec.without_split, option)  # Step 3
    _refuse_scripts(snapshot, files, spec, option)
    return snapshot, files


def _dataset_card(spec: HubDatasetSpec, option: str
                  ) -> tuple[dict[str, dict[str, list[str]]], str | None]:
    """Step 1: the configs of the dataset's card; none when the card is not there (a repository
    without one, or a snapshot fetched without it: `hf download --include 'data/*'`)."""
    try:
        snapshot = dataset_snapshot(spec.repo_id, ["README.md"], option, str(spec))
    except ValueError:  # no such dataset either: Step 4 says so
        return {}, None
    return card_configs(snapshot / "README.md")


def _config_problem(spec: HubDatasetSpec, option: str, configs: list[str], listed: bool) -> str:
    """No such config (or none named where the card lists several): which there are."""
    where = "its dataset card lists" if listed else "its card lists no configs; its folders are"
    named = f"no config {spec.config!r}" if spec.config else "name a config"
    fix = f"; e.g. {HUB_PREFIX}{spec.repo_id}:{configs[0]}" if configs else ""
    return f"{option} {spec}: {named} ({where} {', '.join(configs) or 'none'}){fix}"


def _refuse_scripts(snapshot: Path, files: list[Path], spec: HubDatasetSpec, option: str
                    ) -> None:
    """A loading script is never run (Step 4): said when there are data files beside it, refused
    when there are none."""
    scripts = sorted(path.name for path in snapshot.glob("*.py"))
    if not scripts:
        return
    if not files:
        raise ValueError(f"{option} {spec}: the repository holds a loading script "
                         f"({', '.join(scripts)}) and no data files; z2all never runs a "
                         "dataset's code: export it once to Parquet (datasets: "
                         "load_dataset(...).to_parquet(DIR)) and give that folder")
    _say_once(f"note: {spec}: not running its loading script {', '.join(scripts)}; reading "
              "its data files")


@functools.cache
def _say_once(note: str) -> None:
    """Print `note` the first time only: an entry point may resolve the same id several times
    (its option check, then its reader)."""
    print(note, file=sys.stderr)
