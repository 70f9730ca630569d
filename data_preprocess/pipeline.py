"""What every pretokenize entry point shares: one output per input file, skip what is done,
tokenize in an ordered pool of worker processes (worker_pool.py), and report what happened.

The life of one input file `D/sub/a.jsonl` with `--out_dir O`:
1. `plan_file_jobs` maps it to the output prefix `O/sub/a` (relative paths are mirrored), and
   `claim_out_dir` checks that O is the tool's own and deletes its outputs of inputs that are
   gone (utils/data_output_dir.py, docs/design.md §2.4a).
2. If `O/sub/a.json` (the sidecar) exists and records the same source size, mtime, tokenizer
   and settings, the file is already done: it is reused, not redone.
3. Otherwise its sidecar and old outputs are deleted first (a crash from here on leaves the
   file "not done", never a stale pair that looks current); records are read in the main
   process, sent in batches to the workers, and the results are written *in submission
   order* (so the output never depends on the number of workers).
4. The `.bin`/`.idx` files appear atomically; the sidecar is written last, as the commit mark.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from data_preprocess.indexed_dataset import IndexedDatasetWriter, prefix_paths, token_dtype
from data_preprocess.worker_pool import batched, make_worker_pool, ordered_map
from tokenizer import load_tokenizer
from utils.atomic_io import atomic_write_json
from utils.boolean_flags import add_boolean_flag
from utils.data_files import is_data_spec, locate_data
from utils.data_output_dir import OutputLedger, check_apart
from utils.option_checks import raise_problems, range_problem
from utils.readers import ReadStats

SIDECAR_VERSION = 1
REPORT_FILE = "pretokenize_report.json"
DEFAULT_WORKERS = min(4, os.cpu_count() or 1)


def add_common_arguments(parser: argparse.ArgumentParser, inputs: str, batch_size: int,
                         batch_unit: str) -> None:
    """The options every pretokenize command shares (its own ones are added by the caller)."""
    parser.add_argument("--data_dir", required=True,
                        help=f"folder of {inputs} (recursive), DIR@split, or a Hugging Face "
                             "dataset hf:org/name[:config][@split] (utils/data_files.py)")
    parser.add_argument("--tokenizer_dir", required=True, help="a saved z2all tokenizer")
    parser.add_argument("--out_dir", default=None,
                        help="where the .bin/.idx pairs go (default: <data_dir>_pretok)")
    parser.add_argument("--num_workers", type=int, default=DEFAULT_WORKERS,
                        help="tokenizer worker processes (0: tokenize in the main process)")
    add_boolean_flag(parser, "--skip_bad_records",
                     help="skip and count malformed records instead of stopping at the first")
    parser.add_argument("--batch_size", type=int, default=batch_size,
                        help=f"{batch_unit} per worker task")


def check_options(num_workers: int, batch_size: int, max_seq_len: int | None = None) -> None:
    """The shared options' ranges, checked before any work (a `--batch_size 0` would read
    nothing and still mark every file done)."""
    raise_problems([range_problem("--num_workers", num_workers, 0),
                    range_problem("--batch_size", batch_size, 1),
                    range_problem("--max_seq_len", max_seq_len, 2)])


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


def claim_out_dir(tool: str, out_dir: Path, planned: list[str]) -> None:
    """Before any output is written: refuse an out_dir that is not `tool`'s own (new, empty or
    its earlier output), then delete its earlier outputs that this run does not write again,
    those of sources that are gone (utils/data_output_dir.py). `planned`: every name (relative
    to out_dir) this run writes."""
    twice = sorted(name for name, count in collections.Counter(planned).items() if count > 1)
    if twice:
        raise ValueError(f"{out_dir / twice[0]} would be written twice (an input's output and "
                         "another's, or a report); rename that input")
    ledger = OutputLedger.claim(out_dir, tool)
    if removed := ledger.begin(planned):
        shown = ", ".join(removed[:3]) + (", ..." if len(removed) > 3 else "")
        print(f"removed {len(removed)} earlier outputs of inputs that are gone from {out_dir}: "
              f"{shown}")


def source_identity(source: Path) -> dict[str, int]:
    """Size and mtime (ns) of a raw file: cheap to check, and they change when it is rewritten."""
    stat = source.stat()
    return {"source_size": stat.st_size, "source_mtime": stat.st_mtime_ns}


def finished_sidecar(job: FileJob, expected: dict[str, Any]) -> dict[str, Any] | None:
    """The job's sidecar if it says "done with exactly these settings" and its files exist."""
    try:
        sidecar = json.loads(job.sidecar_path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    if any(sidecar.get(key) != value for key, value in expected.items()):
        return None
    if sidecar.get("num_documents") == 0 and not sidecar.get("skipped") and \
            sidecar.get("source_size", 0) > 0:
        print(f"note: {job.sidecar_path} records 0 documents read from a non-empty "
              f"{job.relative}; redoing it")
        return None
    outputs = sidecar.get("outputs", [job.prefix.name])
    for name in outputs:
        if not all(path.exists() for path in prefix_paths(job.prefix.with_name(name))):
            return None
    return sidecar


@dataclass
class FileCounts:
    """What happened to one input file; stored in its sidecar and summed in the run report."""

    num_documents: int = 0
    num_tokens: int = 0
    num_truncated: int = 0
    skipped: collections.Counter[str] = field(default_factory=collections.Counter)  # by reason


@dataclass(frozen=True)
class PretokenizeTask:
    """The three task-specific steps; `run_pretokenize` does everything else.

    read(job, stats, counts)    main process: the file's items (texts, records), in file order
    work(batch)                 a worker: a batch of items -> an encoded batch (module-level fn)
    write(job, writers, encoded, counts)  main process: append it to the output pairs, count
    """

    kind: str  # "pretrain" | "sft" | "dpo": names the report and the sidecar format
    settings: dict[str, Any]  # sidecar fields that must match for a finished file to be reused
    outputs: tuple[tuple[str, type], ...]  # (suffix, dtype) per .bin/.idx pair of each file
    read: Callable[[FileJob, ReadStats, FileCounts], Iterable[Any]]
    work: Callable[[list[Any]], Any]
    write: Callable[[FileJob, list[IndexedDatasetWriter], Any, FileCounts], None]
    not_bad_reasons: tuple[str, ...] = ("empty",)  # skip reasons that are policy, not bad input

    def output_names(self) -> list[str]:
        """What one input file becomes, as suffixes of its output stem: the sidecar and the
        .bin/.idx of every pair."""
        return [".json", *(f"{suffix}{ext}" for suffix, _ in self.outputs
                           for ext in (".bin", ".idx"))]


def output_prefix(job: FileJob, suffix: str) -> Path:
    return job.prefix.with_name(job.prefix.name + suffix)


def process_file(task: PretokenizeTask, job: FileJob, pool: ProcessPoolExecutor | None,
                 batch_size: int, max_in_flight: int, progress: tqdm,
                 done_before: dict[str, int]) -> dict[str, Any]:
    """Tokenize one file into its output pair(s) and commit it with its sidecar; return that.
    The bar counts this run's input bytes, and its postfix this run's documents and tokens
    (`done_before`: those of the files this run finished before this one)."""
    identity = source_identity(job.source)  # taken before reading: an edit meanwhile redoes it
    job.sidecar_path.unlink(missing_ok=True)  # from here on the file counts as unfinished
    for suffix, _ in task.outputs:
        for old_output in prefix_paths(output_prefix(job, suffix)):
            old_output.unlink(missing_ok=True)
    job.prefix.parent.mkdir(parents=True, exist_ok=True)
    for stale in job.prefix.parent.glob(f".{job.prefix.name}.*.tmp"):
        stale.unlink()  # temp files (".<final name>.<random>.tmp") of a killed earlier run
    stats, counts = ReadStats(), FileCounts()
    batches = batched(task.read(job, stats, counts), batch_size)
    bytes_before = progress.n  # the bar counts input bytes: .jsonl/.txt as read, others whole
    with contextlib.ExitStack() as stack:
        writers = [stack.enter_context(IndexedDatasetWriter(output_prefix(job, suffix), dtype))
                   for suffix, dtype in task.outputs]
        for encoded in ordered_map(pool, task.work, batches, max_in_flight):
            task.write(job, writers, encoded, counts)
            progress.set_postfix(docs=done_before["num_documents"] + counts.num_documents,
                                 tokens=done_before["num_tokens"] + counts.num_tokens,
                                 refresh=False)
            progress.update(bytes_before + stats.bytes_read - progress.n)
    progress.update(bytes_before + identity["source_size"] - progress.n)
    counts.skipped.update(stats.skipped)
    sidecar = {**task.settings, "source": job.relative, **identity,
               "num_documents": counts.num_documents, "num_tokens": counts.num_tokens,
               "num_truncated": counts.num_truncated,
               "skipped": dict(sorted(counts.skipped.items())),
               "outputs": [output_prefix(job, suffix).name for suffix, _ in task.outputs]}
    atomic_write_json(job.sidecar_path, sidecar)  # written last: the file's commit mark
    return sidecar


def tokenizer_settings(sidecar_format: str, tokenizer_dir: str | Path) -> tuple[type, dict]:
    """The token dtype for this vocabulary, and the sidecar fields that name format + tokenizer."""
    tokenizer = load_tokenizer(tokenizer_dir)
    dtype = token_dtype(len(tokenizer))
    return dtype, {"format": sidecar_format, "version": SIDECAR_VERSION,
                   "tokenizer": tokenizer.fingerprint, "dtype": np.dtype(dtype).name}


def run_pretokenize(task: PretokenizeTask, data_dir: str | Path, out_dir: str | Path | None,
                    tokenizer_dir: str | Path, num_workers: int, batch_size: int,
                    worker_settings: dict[str, Any]) -> dict[str, Any]:
    """Every file under data_dir -> out_dir (reusing finished ones); returns the run report.

    out_dir defaults to `<data_dir>_pretok`, next to the data dir (never inside it); data
    named by id or split (`hf:org/name`, `DIR@test`) needs an explicit one.
    """
    started = time.perf_counter()
    if not out_dir:
        if is_data_spec(data_dir):
            raise ValueError(f"--data_dir {data_dir} names data by id or split: give --out_dir "
                             "(the default, <data_dir>_pretok, is for a folder)")
        out_dir = Path(data_dir).with_name(Path(data_dir).name + "_pretok")
    jobs = plan_file_jobs(data_dir, Path(out_dir), [("--tokenizer_dir", tokenizer_dir)])
    claim_out_dir(f"pretokenize_{task.kind}_data", Path(out_dir),
                  [*(f"{job.output_stem}{name}" for job in jobs for name in task.output_names()),
                   REPORT_FILE])
    per_file, todo = [], []
    for job in jobs:
        done = finished_sidecar(job, {**task.settings, **source_identity(job.source)})
        if done is None:
            todo.append(job)
        else:
            per_file.append({"source": job.relative, "reused": True, **summary_of(done)})
    if todo:
        pool = make_worker_pool(num_workers, tokenizer_dir, worker_settings)
        # A total known without reading: the input's bytes, so the bar shows an ETA.
        progress = tqdm(total=sum(job.source.stat().st_size for job in todo), unit="B",
                        unit_scale=True, dynamic_ncols=True)
        try:
            for number, job in enumerate(todo, start=1):
                progress.set_description(f"file {number}/{len(todo)} {job.relative}")
                done_before = {key: sum(entry[key] for entry in per_file if not entry["reused"])
                               for key in ("num_documents", "num_tokens")}  # as the bar: this run's
                sidecar = process_file(task, job, pool, batch_size, 4 * max(num_workers, 1),
                                       progress, done_before)
                per_file.append({"source": job.relative, "reused": False, **summary_of(sidecar)})
        finally:
            progress.close()
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
    per_file.sort(key=lambda entry: entry["source"])
    report = {"format": f"z2all-{task.kind}-report", "version": 1,
              "tokenizer": task.settings["tokenizer"], **totals_of(per_file),
              "seconds": round(time.perf_counter() - started, 3), "per_file": per_file}
    atomic_write_json(Path(out_dir) / REPORT_FILE, report)
    print_summary(report, task.not_bad_reasons, Path(out_dir) / REPORT_FILE)
    return report


def summary_of(sidecar: dict[str, Any]) -> dict[str, Any]:
    keys = ("num_documents", "num_tokens", "num_truncated", "skipped")
    return {key: sidecar[key] for key in keys}


def totals_of(per_file: list[dict[str, Any]]) -> dict[str, Any]:
    skipped: collections.Counter[str] = collections.Counter()
    for entry in per_file:
        skipped.update(entry["skipped"])
    return {"files": len(per_file), "files_reused": sum(entry["reused"] for entry in per_file),
            **{key: sum(entry[key] for entry in per_file)
               for key in ("num_documents", "num_tokens", "num_truncated")},
            "skipped": dict(sorted(skipped.items()))}


def print_summary(report: dict[str, Any], not_bad_reasons: tuple[str, ...],
                  report_path: Path) -> None:
    bad = sum(n for reason, n in report["skipped"].items() if reason not in not_bad_reasons)
    if bad:
        print(f"skipped {bad} bad records")
    new_tokens = sum(entry["num_tokens"] for entry in report["per_file"] if not entry["reused"])
    rate = new_tokens / max(report["seconds"], 1e-9)
    print(f"pretokenized {report['files']} files ({report['files_reused']} already done): "
          f"{report['num_documents']:,} documents, {report['num_tokens']:,} tokens, "
          f"{report['num_truncated']} truncated; {report['seconds']:.1f}s "
          f"({rate:,.0f} new tokens/s)")
    skipped = ", ".join(f"{reason}={n}" for reason, n in report["skipped"].items())
    print(f"skipped by reason: {skipped or 'none'}; report: {report_path}")
