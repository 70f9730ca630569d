"""What every pretokenize entry point shares: one output per input file, skip what is done,
tokenize in an ordered pool of worker processes (tokenizer_workers.py), and report what
happened.

The life of one input file `D/sub/a.jsonl` with `--out_dir O`:
1. `plan_file_jobs` (file_jobs.py) maps it to the output prefix `O/sub/a` (relative paths are
   mirrored), and
   `claim_out_dir` checks that O is the tool's own and deletes its outputs of inputs that are
   gone (utils/data_output_dir.py, docs/design.md §2.4a).
2. If `O/sub/a.json` (the sidecar) exists and records the same source size, mtime, tokenizer
   and settings, the file is already done: it is reused, not redone.
3. Otherwise its sidecar and old outputs are deleted first (a crash from here on leaves the
   file "not done", never a stale pair that looks current); records are read in the main
   process, sent in batches to the workers, and the results are written *in submission
   order* (so the output never depends on the number of workers).
4. The `.bin`/`.idx` files appear atomically; the sidecar is written last, as the commit mark.

As N array tasks (`--num_tasks N --task_index I`, utils/array_tasks.py) every task plans all
files, works on its share only, and writes its own ledger and report
(`pretokenize_report.task-I-of-N.json`); a file's outputs are the same bytes whichever task
makes them. The same command without the task options afterwards is the merge: it reuses
every finished file and writes the one ledger and `pretokenize_report.json`.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from data_preprocess.file_jobs import (
    DEFAULT_WORKERS,
    FileJob,
    claim_out_dir,
    plan_file_jobs,
    source_identity,
)
from data_preprocess.indexed_dataset import IndexedDatasetWriter, prefix_paths, token_dtype
from data_preprocess.tokenizer_workers import make_worker_pool
from data_preprocess.worker_pool import batched, ordered_map
from tokenizer import load_tokenizer
from utils.array_tasks import THE_ONLY_TASK, TaskShare, add_task_arguments, task_share
from utils.atomic_io import atomic_write_json
from utils.boolean_flags import add_boolean_flag
from utils.data_files import is_data_spec
from utils.option_checks import raise_problems, range_problem
from utils.readers import ReadStats

SIDECAR_VERSION = 1
REPORT_FILE = "pretokenize_report.json"


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
    add_task_arguments(parser)


def check_options(num_workers: int, batch_size: int, max_seq_len: int | None = None,
                  num_tasks: int | None = None, task_index: int | None = None) -> TaskShare:
    """The shared options' ranges, checked before any work (a `--batch_size 0` would read
    nothing and still mark every file done); returns this task's share of the files."""
    raise_problems([range_problem("--num_workers", num_workers, 0),
                    range_problem("--batch_size", batch_size, 1),
                    range_problem("--max_seq_len", max_seq_len, 2)])
    return task_share(num_tasks, task_index)


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


def report_name(share: TaskShare) -> str:
    """`pretokenize_report.json`, or an array task's own `pretokenize_report.task-I-of-N.json`."""
    return REPORT_FILE if share.alone else REPORT_FILE.replace(".json", f".{share.label}.json")


def run_pretokenize(task: PretokenizeTask, data_dir: str | Path, out_dir: str | Path | None,
                    tokenizer_dir: str | Path, num_workers: int, batch_size: int,
                    worker_settings: dict[str, Any],
                    share: TaskShare = THE_ONLY_TASK) -> dict[str, Any]:
    """Every file under data_dir (of `share`, this array task's) -> out_dir (reusing finished
    ones); returns the run report.

    out_dir defaults to `<data_dir>_pretok`, next to the data dir (never inside it); data
    named by id or split (`hf:org/name`, `DIR@test`) needs an explicit one.
    """
    started = time.perf_counter()
    if not out_dir:
        if is_data_spec(data_dir):
            raise ValueError(f"--data_dir {data_dir} names data by id or split: give --out_dir "
                             "(the default, <data_dir>_pretok, is for a folder)")
        out_dir = Path(data_dir).with_name(Path(data_dir).name + "_pretok")
    all_jobs = plan_file_jobs(data_dir, Path(out_dir), [("--tokenizer_dir", tokenizer_dir)])
    jobs = share.take(all_jobs)
    names_of = {job: [f"{job.output_stem}{name}" for name in task.output_names()]
                for job in all_jobs}
    others = set(all_jobs) - set(jobs)
    claim_out_dir(f"pretokenize_{task.kind}_data", Path(out_dir),
                  [*(name for job in jobs for name in names_of[job]), report_name(share)],
                  share, [name for job in all_jobs if job in others for name in names_of[job]])
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
    atomic_write_json(Path(out_dir) / report_name(share), report)
    print_summary(report, task.not_bad_reasons, Path(out_dir) / report_name(share))
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
