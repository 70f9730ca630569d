"""`--write_dropped DIR`: every dropped document, one `DIR/<rule>.jsonl` per rule, as datatrove's
exclusion writer keeps what a filter removed, so a rule's judgement can be read in full and
not only in the report's three examples per rule:

    DIR/too_few_words.jsonl   {"text": "The end.", "source": "sub/b.jsonl", "line": 3,
                               "rule": "too_few_words", "value": 2}
    DIR/near_duplicate.jsonl  {..., "rule": "near_duplicate", "value": "a.jsonl:9"}
    DIR/.z2all_dropped.json   {"format": "z2all-dropped", "version": 1,
                               "files": ["near_duplicate.jsonl", "too_few_words.jsonl"]}

`text` is normalised as the shards' text is, `value` is what the report shows (the measured
value, the leaked n-gram, or the document it copies), and records are in source order (files
sorted, then line). Each file appears atomically once complete.

Whose folder: DIR must be new, empty, or this option's own earlier output (the marker names
every file in it, and nothing else is there), and apart from --data_dir, --out_dir and the
--decontaminate sets (neither one of them, nor above or inside one: dropped text read back as
input, or training data, would undo the cleaning). A rerun deletes the rule files it wrote
before and does not write now (a rule that drops nothing any more). This is a minimal check of
its own; the data tools' shared --out_dir rule is meant to replace it.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from utils.atomic_io import atomic_open, atomic_write_json

MARKER = ".z2all_dropped.json"
MARKER_FORMAT, MARKER_VERSION = "z2all-dropped", 1
OPTION = "--write_dropped"
TEMP_FILE = re.compile(r"^\.(.+\.jsonl|\.z2all_dropped\.json)\.\w+\.tmp$")  # atomic_io's temps


def _listed_files(folder: Path, rules: Iterable[str]) -> list[str]:
    """The files the marker says this option wrote; only names of rule files count (a copied
    or edited marker cannot make a user's file, or a path outside DIR, one to delete)."""
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return []
    if not (isinstance(marker, dict) and marker.get("format") == MARKER_FORMAT
            and isinstance(marker.get("files"), list)):
        return []
    rule_files = {f"{rule}.jsonl" for rule in rules}
    return [name for name in marker["files"] if name in rule_files]


def _overlap(folder: Path, path: str | Path) -> bool:
    """DIR is `path`, or above or inside it (a `DIR@split` spec counts as DIR)."""
    target = folder.resolve()
    for candidate in {str(path), str(path).rpartition("@")[0] or str(path)}:
        other = Path(candidate).resolve()
        if target == other or target in other.parents or other in target.parents:
            return True
    return False


def claim(folder: Path, inputs: Iterable[tuple[str, str | Path]],
          rules: Iterable[str]) -> list[str]:
    """Check DIR before any work (ValueError, one line, naming the problem); return the
    files an earlier run wrote there. `inputs`: (option, path) pairs it must stay apart from,
    whether they exist yet or not (a Hub id names no folder here, and overlaps none);
    `rules`: every rule name a run can drop by."""
    for option, path in inputs:
        if _overlap(folder, path):
            raise ValueError(f"{OPTION} {folder} overlaps {option} {path}: the dropped "
                             "documents would be read back or mixed into the output; choose a "
                             "folder apart from both")
    if not folder.exists():
        return []
    if not folder.is_dir():
        raise ValueError(f"{OPTION} {folder} is a file: name a new or empty folder")
    listed = _listed_files(folder, rules)
    allowed = {MARKER, *listed}
    for entry in sorted(folder.iterdir()):
        if entry.name not in allowed and not (entry.is_file() and TEMP_FILE.match(entry.name)):
            raise ValueError(f"{OPTION} {folder} holds {entry.name}, which it did not write: "
                             "it writes only into a new or empty folder or its own earlier "
                             "output; choose another folder")
    return listed


def _write_marker(folder: Path, files: list[str]) -> None:
    atomic_write_json(folder / MARKER, {"format": MARKER_FORMAT, "version": MARKER_VERSION,
                                        "files": files})


def write_dropped(folder: Path, earlier_files: list[str], rules: Iterable[str],
                  documents: Iterable[tuple[str, dict[str, Any]]]) -> list[str]:
    """Write `documents` ((rule, record) pairs, in source order) to one file per rule of
    `rules`; returns the file names. The marker lists the files about to be written before
    the first is, so a run killed midway leaves nothing the next run would call foreign."""
    planned = sorted(f"{rule}.jsonl" for rule in rules)
    folder.mkdir(parents=True, exist_ok=True)
    for leftover in folder.iterdir():
        if TEMP_FILE.match(leftover.name):
            leftover.unlink()  # of a killed run
    _write_marker(folder, sorted(set(earlier_files) | set(planned)))
    with contextlib.ExitStack() as files:  # each file appears once all of it is written
        handles = {name.removesuffix(".jsonl"): files.enter_context(
            atomic_open(folder / name, "wb")) for name in planned}
        for rule, record in documents:
            line = json.dumps({**record, "rule": rule}, ensure_ascii=False) + "\n"
            handles[rule].write(line.encode("utf-8"))
    for stale in sorted(set(earlier_files) - set(planned)):
        (folder / stale).unlink(missing_ok=True)  # a rule that drops nothing any more
    _write_marker(folder, planned)
    return planned
