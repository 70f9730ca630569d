"""A data tool's output folder: which folders it may write, and which of its files are stale.

Every command that writes a folder of data files (clean_pretrain_data, the pretokenizers, and,
beside their output, build_pretrain_sample_index_map) keeps a ledger there, the hidden file
`.z2all_outputs.json` (hidden, so readers never take it for data):

    {"format": "z2all data outputs", "version": 1, "owner": "pretokenize_pretrain_data",
     "files": {"a.bin": "pretokenize_pretrain_data", "a.idx": "pretokenize_pretrain_data",
               "a.json": "pretokenize_pretrain_data", "sub/b.bin": ...,
               "pretokenize_report.json": "pretokenize_pretrain_data",
               "train_L256.ibin": "build_pretrain_sample_index_map", ...}}

(each file, relative to the folder, with the tool that wrote it; a name ending in "/" is a
whole folder the tool keeps to itself, e.g. clean_pretrain_data's `.clean/` state). Files of
another writer are guests: the sample index beside the token files it indexes, or the demo's
bilingual lessons, which data/build_demo_corpus.py puts into the folder the clean stage then
writes (`OutputLedger.record`; a folder holding only guests has no owner yet, `"owner": null`).

The rules, in the order a tool applies them:
1. Apart from its inputs (`check_apart`): --out_dir is never an input, a folder above one (the
   input would be written over: `clean --data_dir c/en --out_dir c` once replaced c/wiki.jsonl),
   or a folder inside one (the outputs would be read back as input), except a hidden one, which
   the readers skip (the comparison: utils/path_overlap.py); and never inside a z2all run directory
   (its marker, utils/run_directory.py).
2. Only its own folder (`OutputLedger.claim`): a folder that does not exist, is empty, or holds
   this tool's earlier output: the ledger names the tool as owner (or no owner) *and* every
   entry is listed in it (or is an empty folder, or a temporary file of a listed one,
   `.<name>.*.tmp` from utils/atomic_io.py). Anything else is refused, naming the first foreign
   entry: a copied ledger does not make a user's books.json the tool's to replace.
3. No stale outputs (`OutputLedger.begin`): before writing, the tool lists everything this run
   writes (a guest's name on that list is refused); its files from an earlier run that are not
   on the list (their source was removed) are deleted, and the ledger is rewritten,
   atomically, before the first output is. A run killed midway thus leaves only listed files,
   and the next run recognises all of them. Guests are never deleted.

Tasks of a job array (utils/array_tasks.py) writing one folder at the same time never share a
ledger file: task I of N keeps its own, `.z2all_outputs.task-I-of-N.json`, listing its share's
outputs. The rules read every ledger of the folder together: all must name the tool (or no
owner), and an entry listed in any of them is known. A task deletes only its earlier outputs
that no task of this run writes (`begin(keep=...)`), so a file that moved to another task's
share (an input was added or removed) is left for that task. A later plain run (one task)
merges: it adopts every task ledger's files into `.z2all_outputs.json`, deletes what it does
not write (the task reports, outputs of gone inputs), then the task ledgers.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

from utils.atomic_io import atomic_write_json
from utils.path_overlap import path_overlap
from utils.run_directory import RUN_MARKER

LEDGER = ".z2all_outputs.json"
LEDGER_FORMAT, LEDGER_VERSION = "z2all data outputs", 1
TASK_LEDGER_PREFIX = ".z2all_outputs.task-"


def task_ledger_name(task_label: str) -> str:
    """The ledger of one array task (`task-I-of-N`, utils/array_tasks.py)."""
    return f".z2all_outputs.{task_label}.json"


def is_ledger_name(name: str) -> bool:
    return name == LEDGER or (name.startswith(TASK_LEDGER_PREFIX) and name.endswith(".json"))


def check_apart(out_dir: str | Path, inputs: Iterable[tuple[str, str | Path | None]],
                option: str = "--out_dir") -> None:
    """Rule 1: refuse (ValueError, one line) an output folder that overlaps an input (`inputs`:
    (option, path) pairs; None or a path that does not exist, e.g. a Hub id, is skipped) or
    lies inside a z2all run."""
    out = Path(out_dir).resolve()
    for name, value in inputs:
        if value is None or not Path(value).exists():
            continue
        overlap = path_overlap(out, value)
        if overlap in ("same", "holds"):
            relation = "is" if overlap == "same" else "holds"
            raise ValueError(f"{option} {out_dir} {relation} the input {name} {value}: its "
                             "files would be written over; choose a new folder outside it")
        if overlap == "inside" and not any(
                part.startswith(".") for part in out.relative_to(Path(value).resolve()).parts):
            raise ValueError(f"{option} {out_dir} lies inside the input {name} {value}: its "
                             "outputs would mix with the input (and be read back as input); "
                             "choose a folder outside it (or a hidden one: readers skip '.*')")
    for folder in (out, *out.parents):
        if (folder / RUN_MARKER).is_file():
            raise ValueError(f"{option} {out_dir} lies inside the z2all run directory {folder} "
                             f"({RUN_MARKER}): what is there belongs to the run; choose a "
                             "folder outside it")


class OutputLedger:
    """One tool's claim on its output folder and the list of what it wrote there (see above)."""

    def __init__(self, folder: Path, owner: str | None, files: dict[str, str],
                 name: str = LEDGER) -> None:
        self.folder = folder
        self.owner = owner  # None: no tool has claimed the folder yet (guests only)
        self.files = files  # relative name -> the tool that wrote it
        self.name = name  # LEDGER, or one array task's task_ledger_name
        self.others: dict[str, str] = {}  # what the folder's other ledgers list
        self.merged: list[str] = []  # task ledgers this (plain) ledger adopted, removed by begin

    @classmethod
    def read(cls, folder: str | Path, name: str = LEDGER) -> OutputLedger | None:
        """The folder's ledger `name`, or None when it has none (or a damaged one)."""
        try:
            record = json.loads((Path(folder) / name).read_text())
        except (OSError, ValueError):
            return None
        if not (isinstance(record, dict) and record.get("format") == LEDGER_FORMAT
                and isinstance(record.get("files"), dict)):
            return None
        owner = record.get("owner")
        return cls(Path(folder), None if owner is None else str(owner), dict(record["files"]),
                   name)

    @classmethod
    def read_all(cls, folder: str | Path) -> list[OutputLedger]:
        """Every ledger of the folder: the plain one first, then the array tasks' (sorted)."""
        folder = Path(folder)
        names = sorted(path.name for path in folder.glob(f"{TASK_LEDGER_PREFIX}*.json"))
        ledgers = (cls.read(folder, name) for name in [LEDGER, *names])
        return [ledger for ledger in ledgers if ledger is not None]

    @classmethod
    def claim(cls, folder: str | Path, tool: str, option: str = "--out_dir",
              name: str = LEDGER) -> OutputLedger:
        """Rule 2: the ledger `name` of a folder `tool` may write (new, empty or its own), or a
        ValueError naming the first entry it did not write. Reads only: nothing is created.
        The plain ledger adopts the array tasks' ones (see above)."""
        folder = Path(folder)
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"{option} {folder} is a file: name a new or empty folder")
        # The folder is listed before its ledgers are read: a concurrent task writes its
        # ledger before its first output, so every entry seen here is in a ledger read after.
        entries = _entries(folder) if folder.is_dir() else []
        ledgers = cls.read_all(folder) if folder.is_dir() else []
        for other in ledgers:
            if other.owner not in (None, tool):
                raise ValueError(f"{option} {folder} holds the output of {other.owner} "
                                 f"({other.name}), not of {tool}; choose a new or empty folder")
        known = {file: writer for other in reversed(ledgers)
                 for file, writer in other.files.items()}
        ledger = next((other for other in ledgers if other.name == name), None) \
            or cls(folder, None, {}, name)
        if name == LEDGER:
            ledger.files = known
            ledger.merged = [other.name for other in ledgers if other.name != LEDGER]
        else:
            ledger.others = {file: writer for file, writer in known.items()
                             if file not in ledger.files}
        foreign = _first_foreign(entries, known)
        if foreign is not None:
            unclaimed = "" if any(other.owner for other in ledgers) else (
                f" (an output of a z2all older than its {LEDGER} is not recognised either)")
            raise ValueError(f"{option} {folder} holds {foreign}, which {tool} did not write: "
                             "it writes only into a new or empty folder or its own earlier "
                             f"output{unclaimed}; choose another folder")
        ledger.owner = tool
        return ledger

    def begin(self, planned: Iterable[str], keep: Iterable[str] = ()) -> list[str]:
        """Rule 3: this run writes `planned` (relative names); delete what the owner wrote
        before and does not write now, record the list, and return the deleted names. An
        array task passes as `keep` what the other tasks write: its earlier files among them
        stay, and stay listed, for the task whose share they are now."""
        planned, keep = set(planned), set(keep) - set(planned)
        listed = {**self.others, **self.files}
        taken = sorted(name for name in planned if listed.get(name, self.owner) != self.owner)
        if taken:
            raise ValueError(f"{self.folder / taken[0]} was written by {listed[taken[0]]}, "
                             f"and {self.owner} would replace it; rename that input")
        stale = sorted(name for name, writer in self.files.items()
                       if writer == self.owner and name not in planned | keep)
        for name in stale:  # a task leaves emptied folders: another may be writing into them
            _remove_with_empty_parents(self.folder, name, prune=self.name == LEDGER)
        kept = {name: writer for name, writer in self.files.items()
                if writer != self.owner or name in keep}
        self.files = {**kept, **{name: self.owner for name in planned}}
        self._write()
        for name in self.merged:
            (self.folder / name).unlink(missing_ok=True)
        return stale

    @classmethod
    def record(cls, folder: str | Path, names: Iterable[str], writer: str) -> None:
        """Before a guest writes `names` into `folder` (which it does not own), list them as
        `writer`'s, so the owner's next run knows them and leaves them alone."""
        ledger = cls.read(folder) or cls(Path(folder), None, {})
        ledger.files.update({name: writer for name in names})
        ledger._write()

    def _write(self) -> None:
        record = {"format": LEDGER_FORMAT, "version": LEDGER_VERSION, "owner": self.owner,
                  "files": dict(sorted(self.files.items()))}
        atomic_write_json(self.folder / self.name, record)


def first_foreign_entry(folder: Path, files: Mapping[str, str]) -> str | None:
    """The first entry (sorted, depth first, relative to `folder`) that rule 2 does not allow;
    None when there is none."""
    return _first_foreign(_entries(folder), files)


def _entries(folder: Path) -> list[tuple[str, bool]]:
    """Every entry below `folder`, sorted depth first, as (relative name, is a folder link)."""
    found = []
    for directory, subfolders, names in os.walk(folder):
        here = Path(directory).relative_to(folder)
        subfolders.sort()
        found += [((here / name).as_posix(), True) for name in subfolders
                  if os.path.islink(Path(directory) / name)]
        found += [((here / name).as_posix(), False) for name in sorted(names)]
    return found


def _first_foreign(entries: Iterable[tuple[str, bool]], files: Mapping[str, str]) -> str | None:
    whole_folders = tuple(name for name in files if name.endswith("/"))
    for relative, is_folder_link in entries:
        if relative.startswith(whole_folders):
            continue
        if is_folder_link:
            return relative
        here, _, name = relative.rpartition("/")
        if relative not in files and not is_ledger_name(relative) \
                and not _is_temporary_of(Path(here), name, files):
            return relative
    return None


def _is_temporary_of(here: Path, name: str, files: Mapping[str, str]) -> bool:
    """Whether `name` is utils.atomic_io's temporary file `.<final>.<random>.tmp` of a listed
    file `final` (or of a ledger) in the same folder."""
    if not (name.startswith(".") and name.endswith(".tmp")):
        return False
    final = name[1:-len(".tmp")].rpartition(".")[0]
    return is_ledger_name((here / final).as_posix()) or (here / final).as_posix() in files


def _remove_with_empty_parents(folder: Path, name: str, prune: bool = True) -> None:
    path = folder / name.rstrip("/")
    if name.endswith("/"):
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
    parent = path.parent
    while prune and parent != folder and parent.is_dir() and not any(parent.iterdir()):
        parent.rmdir()
        parent = parent.parent
