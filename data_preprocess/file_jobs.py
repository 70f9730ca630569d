"""The files a data tool works on: one job per input file, its output prefix mirrored under
the output folder, the folder claimed before anything is written, and the identity (size,
mtime) that says whether an earlier output is still current.

Shared by the pretokenizers (pipeline.py) and the clean stage (clean_pretrain_data.py); kept
apart from pipeline.py so that the clean stage, which tokenizes nothing, imports no tokenizer
(its workers would each load transformers, ~0.7 s, for nothing:
tests/data_preprocess/test_clean_worker_imports.py).
"""

from __future__ import annotations

import collections
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from utils.array_tasks import THE_ONLY_TASK, TaskShare
from utils.data_files import locate_data
from utils.data_output_dir import LEDGER, OutputLedger, check_apart, task_ledger_name

DEFAULT_WORKERS = min(4, os.cpu_count() or 1)


@dataclass(frozen=True)
class FileJob:
    source: Path  # the raw input file
    relative: str  # its path relative to the data dir, as recorded in sidecars and reports
    prefix: Path  # output prefix: `<prefix>.bin`, `<prefix>.idx`, `<prefix>.json`

    @property
    def sidecar_path(self) -> Path:
        return self.prefix.with_name(self.prefix.name + ".json")

    @property
    def output_stem(self) -> str:
        """`sub/a` for the input `sub/a.jsonl`: its outputs' names below out_dir, unsuffixed."""
        return Path(self.relative).with_suffix("").as_posix()


def plan_file_jobs(data_dir: str | Path, out_dir: Path,
                   other_inputs: Sequence[tuple[str, str | Path | None]] = ()) -> list[FileJob]:
    """One job per data file `data_dir` names (a folder, its split, a Hub dataset:
    utils/data_files.py), in sorted order, their paths below its folder mirrored under out_dir.
    out_dir must lie apart from the data's folder and `other_inputs` (utils/data_output_dir.py)."""
    located = locate_data(Path(data_dir).resolve() if Path(data_dir).exists() else data_dir)
    check_apart(out_dir, [("--data_dir", located.root), *other_inputs])
    out_dir = Path(out_dir).resolve()
    jobs, owners = [], {}
    for source, relative in zip(located.files, located.relative_names()):
        prefix = out_dir / Path(relative).with_suffix("")
        if prefix in owners:
            raise ValueError(f"{owners[prefix]} and {relative} would both be written to {prefix}.*"
                             "; rename one of them")
        owners[prefix] = relative
        jobs.append(FileJob(source, relative, prefix))
    if not jobs:
        raise FileNotFoundError(f"no .jsonl/.json/.parquet/.txt files under {data_dir}")
    return jobs


def claim_out_dir(tool: str, out_dir: Path, planned: list[str],
                  share: TaskShare = THE_ONLY_TASK, others: Sequence[str] = ()) -> None:
    """Before any output is written: refuse an out_dir that is not `tool`'s own (new, empty or
    its earlier output), then delete its earlier outputs that this run does not write again,
    those of sources that are gone (utils/data_output_dir.py). `planned`: every name (relative
    to out_dir) this task writes; `others`: what the other array tasks write (kept)."""
    twice = sorted(name for name, count in collections.Counter([*planned, *others]).items()
                   if count > 1)
    if twice:
        raise ValueError(f"{out_dir / twice[0]} would be written twice (an input's output and "
                         "another's, or a report); rename that input")
    ledger = OutputLedger.claim(out_dir, tool,
                                name=LEDGER if share.alone else task_ledger_name(share.label))
    if removed := ledger.begin(planned, keep=others):
        shown = ", ".join(removed[:3]) + (", ..." if len(removed) > 3 else "")
        print(f"removed {len(removed)} earlier outputs of inputs that are gone from {out_dir}: "
              f"{shown}")


def source_identity(source: Path) -> dict[str, int]:
    """Size and mtime (ns) of a raw file: cheap to check, and they change when it is rewritten."""
    stat = source.stat()
    return {"source_size": stat.st_size, "source_mtime": stat.st_mtime_ns}
