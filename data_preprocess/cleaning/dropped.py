"""`--write_dropped DIR`: every dropped document, one `DIR/<rule>.jsonl` per rule, as datatrove's
exclusion writer keeps what a filter removed, so a rule's judgement can be read in full and
not only in the report's three examples per rule:

    DIR/too_few_words.jsonl   {"text": "The end.", "source": "sub/b.jsonl", "line": 3,
                               "rule": "too_few_words", "value": 2}
    DIR/near_duplicate.jsonl  {..., "rule": "near_duplicate", "value": "a.jsonl:9"}
    DIR/.z2all_outputs.json   the data tools' ledger (utils/data_output_dir.py)

`text` is normalised as the shards' text is, `value` is what the report shows (the measured
value, the leaked n-gram, or the document it copies), and records are in source order (files
sorted, then line). Each file appears atomically once complete.

Whose folder: DIR must be new, empty, or this option's own earlier output, by the data tools'
shared rule and ledger (utils/data_output_dir.py), whose files may only be rule files (a copied
or edited ledger cannot make a user's file one to delete); and apart from --data_dir, --out_dir
and the --decontaminate sets (neither one of them, nor above or inside one, hidden or not:
dropped text read back as input, or mixed into training data, would undo the cleaning). A rerun
deletes the rule files it wrote before and does not write now (a rule that drops nothing any
more).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from utils.atomic_io import atomic_open
from utils.data_output_dir import OutputLedger
from utils.path_overlap import path_overlap

OPTION = "--write_dropped"
WRITER = "clean_pretrain_data --write_dropped"


def _overlap(folder: Path, path: str | Path) -> bool:
    """DIR is `path`, or above or inside it (a `DIR@split` spec counts as DIR)."""
    candidates = {str(path), str(path).rpartition("@")[0] or str(path)}
    return any(path_overlap(folder, candidate) for candidate in candidates)


def claim(folder: Path, inputs: Iterable[tuple[str, str | Path]], rules: Iterable[str]
          ) -> OutputLedger:
    """Check DIR before any work (ValueError, one line, naming the problem); its ledger.
    `inputs`: (option, path) pairs it must stay apart from, whether they exist yet or not (a
    Hub id names no folder here, and overlaps none); `rules`: every rule name a run can drop
    by."""
    for option, path in inputs:
        if _overlap(folder, path):
            raise ValueError(f"{OPTION} {folder} overlaps {option} {path}: the dropped "
                             "documents would be read back or mixed into the output; choose a "
                             "folder apart from both")
    ledger = OutputLedger.claim(folder, WRITER, option=OPTION)
    rule_files = {f"{rule}.jsonl" for rule in rules}
    for name, writer in sorted(ledger.files.items()):
        if writer == WRITER and name not in rule_files:
            raise ValueError(f"{OPTION} {folder} lists {name} as its own, which is no rule's "
                             "file: choose another folder")
    return ledger


def write_dropped(ledger: OutputLedger, rules: Iterable[str],
                  documents: Iterable[tuple[str, dict[str, Any]]]) -> list[str]:
    """Write `documents` ((rule, record) pairs, in source order) to one file per rule of
    `rules` in the ledger's folder; returns the file names. The ledger lists them (and the
    rule files of an earlier run that are not written now are deleted) before the first is
    written, so a run killed midway leaves nothing the next run would call foreign."""
    planned = sorted(f"{rule}.jsonl" for rule in rules)
    ledger.folder.mkdir(parents=True, exist_ok=True)
    ledger.begin(planned)
    with contextlib.ExitStack() as files:  # each file appears once all of it is written
        handles = {name.removesuffix(".jsonl"): files.enter_context(
            atomic_open(ledger.folder / name, "wb")) for name in planned}
        for rule, record in documents:
            line = json.dumps({**record, "rule": rule}, ensure_ascii=False) + "\n"
            handles[rule].write(line.encode("utf-8"))
    return planned
