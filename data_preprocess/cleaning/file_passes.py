"""What clean_pretrain_data does to each input file, and the state that lets a rerun, or
another array task, reuse it: pass 1, the analysis of its documents, and pass 3, its shard.

Every file below CLEAN/.clean/ (`STATE_DIR`) is named after its input `<file>` (its path
relative to --data_dir):
    <file>.analysis.json  pass 1's verdicts (record number, bytes, rule, value, exact key) and
                          the settings and source size/mtime they were made with; written last,
                          so it commits the analysis
    <file>.bands.npy      pass 1's MinHash band keys, one (bands,) uint64 row per survivor
    <file>.shard.json     pass 3's commit mark of CLEAN/<file stem>.jsonl: the run it was
                          written for (`run_id`), its documents and text bytes
    <file>.written.json   the write stage's note to the merge (array_stages.py)
A shard or an analysis whose record names other settings or another version of the input is
made again; never half of one is reused.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from data_preprocess import file_jobs
from data_preprocess.cleaning import analyse
from data_preprocess.cleaning.text import normalise_unicode
from data_preprocess.worker_pool import batched, ordered_map, start_pool
from utils.atomic_io import atomic_open, atomic_write_json
from utils.readers import BadRecordError, ReadStats, iter_raw_items, text_of

STATE_DIR = ".clean"  # hidden: the readers skip it, so CLEAN stays a clean input folder
VERSION = 1


def settings_fingerprint(settings: analyse.CleanSettings, text_key: Sequence[str],
                         skip_bad_records: bool) -> dict[str, Any]:
    """What an analysis must have been made with to be reused (the eval set as a hash)."""
    index = settings.eval_index
    eval_hash = None
    if index is not None:
        digest = hashlib.sha256(json.dumps([index.ngram, index.min_words, sorted(index.grams),
                                            {n: sorted(s) for n, s in index.short_items.items()}
                                            ]).encode())
        eval_hash = digest.hexdigest()
    fields = {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)
              if f.name not in ("filter_options", "eval_index")}
    return {"format": "z2all-clean", "version": VERSION, **json.loads(json.dumps(fields)),
            "filter_options": dataclasses.asdict(settings.filter_options), "eval": eval_hash,
            "text_key": list(text_key), "skip_bad_records": skip_bad_records}


def numbered_texts(job: file_jobs.FileJob, text_key: Sequence[str], skip_bad_records: bool,
                   stats: ReadStats) -> Iterator[tuple[int, str]]:
    """(line/record number, text) of every record, bad ones raised as file:line or counted."""
    keys = ["text"] if job.source.suffix.lower() == ".txt" else list(text_key)
    for item in iter_raw_items(job.source, stats):
        text = item if isinstance(item, BadRecordError) else text_of(item, keys)
        if isinstance(text, BadRecordError):
            if not skip_bad_records:
                raise text
            stats.skipped[text.reason] += 1
            continue
        yield item.number, text


def state_path(out_dir: Path, job: file_jobs.FileJob, suffix: str) -> Path:
    return out_dir / STATE_DIR / f"{job.relative}.{suffix}"


def input_bar(jobs: list[file_jobs.FileJob], description: str) -> tqdm:
    """A bar over the files' bytes (a total known before reading, so it shows an ETA), on a
    terminal only: a log or a pipe would keep every redraw."""
    return tqdm(total=sum(job.source.stat().st_size for job in jobs), desc=description,
                unit="B", unit_scale=True, dynamic_ncols=True, disable=None)


def analyse_file(job: file_jobs.FileJob, out_dir: Path, expected: dict[str, Any],
                 pool: ProcessPoolExecutor | None, args: argparse.Namespace,
                 progress: tqdm) -> dict[str, Any]:
    """Pass 1 for one file: every document's verdict (sidecar) and band keys (.npy)."""
    sidecar_path = state_path(out_dir, job, "analysis.json")
    sidecar_path.unlink(missing_ok=True)
    stats, verdicts, band_rows = ReadStats(), [], []
    texts = numbered_texts(job, args.text_key, args.skip_bad_records, stats)
    bytes_before = progress.n  # .jsonl/.txt advance as read; other formats at the file's end
    for batch in ordered_map(pool, analyse.analyse_batch, batched(texts, args.batch_size),
                             4 * max(args.num_workers, 1)):
        progress.update(bytes_before + stats.bytes_read - progress.n)
        for verdict in batch:
            rule, value = verdict.drop if verdict.drop else (None, None)
            verdicts.append([verdict.number, verdict.bytes_in, rule, value, verdict.exact_key])
            if verdict.drop is None and verdict.band_keys is not None:
                band_rows.append(verdict.band_keys)
    with atomic_open(state_path(out_dir, job, "bands.npy"), "wb") as handle:
        keys = np.array(band_rows, dtype=np.uint64).reshape(len(band_rows), expected["bands"])
        np.save(handle, keys)
    sidecar = {**expected, "verdicts": verdicts, "skipped": dict(stats.skipped)}
    atomic_write_json(sidecar_path, sidecar, indent=None)
    progress.update(bytes_before + expected["source_size"] - progress.n)
    return sidecar


def load_analysis(job: file_jobs.FileJob, out_dir: Path,
                  expected: dict[str, Any]) -> dict[str, Any] | None:
    """A finished analysis made with exactly these settings from this very file, or None."""
    try:
        sidecar = json.loads(state_path(out_dir, job, "analysis.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    done = state_path(out_dir, job, "bands.npy").exists()
    return sidecar if done and all(sidecar.get(k) == v for k, v in expected.items()) else None


def analyse_all(jobs: list[file_jobs.FileJob], out_dir: Path, settings: analyse.CleanSettings,
                fingerprint: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    analyses: list[dict[str, Any] | None] = []
    for job in jobs:
        analyses.append(load_analysis(job, out_dir, {**fingerprint,
                                                     **file_jobs.source_identity(job.source)}))
    todo = [i for i, done in enumerate(analyses) if done is None]
    print(f"analysing {len(todo)} of {len(jobs)} files ({len(jobs) - len(todo)} already done)")
    pool = None
    if todo and args.num_workers > 0:
        # the analysis's modules (numpy, the filters: ~0.2 s) imported once, by the forkserver,
        # not by each worker before its first batch (bench_clean --quick, 2 workers vs 1: 1.6x
        # -> 1.75x)
        pool = start_pool(args.num_workers, analyse.init_worker, (settings,),
                          preload=[analyse.__name__])
    else:
        analyse.init_worker(settings)
    progress = input_bar([jobs[i] for i in todo], "analysing")
    try:
        for i in todo:
            expected = {**fingerprint, **file_jobs.source_identity(jobs[i].source)}
            analyses[i] = analyse_file(jobs[i], out_dir, expected, pool, args, progress)
    finally:
        progress.close()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    return [analysis for analysis in analyses if analysis is not None]


def shard_path(job: file_jobs.FileJob) -> Path:
    return job.prefix.with_name(job.prefix.name + ".jsonl")


def write_shard(job: file_jobs.FileJob, drops: dict[int, tuple[str, Any]], out_dir: Path,
                run: str, args: argparse.Namespace) -> dict[str, Any]:
    """Pass 3 for one file: its kept documents, normalised, as CLEAN/<relative>.jsonl."""
    shard = shard_path(job)
    sidecar_path = state_path(out_dir, job, "shard.json")
    try:
        done = json.loads(sidecar_path.read_text())
        if done.get("run") == run and shard.exists():
            return {**done, "reused": True}
    except (FileNotFoundError, json.JSONDecodeError):
        pass
    sidecar_path.unlink(missing_ok=True)
    documents = size = 0
    with atomic_open(shard, "wb") as handle:
        for number, text in numbered_texts(job, args.text_key, args.skip_bad_records,
                                           ReadStats()):
            if number in drops:
                continue
            text = normalise_unicode(text, args.unicode_form)
            record = {"text": text, "source": job.relative, "line": number}
            handle.write((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
            documents, size = documents + 1, size + len(text.encode("utf-8"))
    sidecar = {"run": run, "documents": documents, "bytes": size}
    atomic_write_json(sidecar_path, sidecar)  # written last: the shard's commit mark
    return {**sidecar, "reused": False}


def owned_outputs(jobs: list[file_jobs.FileJob]) -> list[str]:
    """Every name below --out_dir a run writes: one shard per input, the two reports
    (cleaning/report.py), and the state folder, which is the tool's alone."""
    return [*(f"{job.output_stem}.jsonl" for job in jobs), "clean_report.json",
            "clean_report.md", f"{STATE_DIR}/"]


def run_id(fingerprint: dict[str, Any], jobs: list[file_jobs.FileJob]) -> str:
    """What a shard sidecar and every stage's hand-over file name: a hash of the settings and
    of every input's size and mtime, so a file made for other options or inputs is never
    taken for this run's."""
    inputs = [[job.relative, file_jobs.source_identity(job.source)] for job in jobs]
    return hashlib.sha256(json.dumps([fingerprint, inputs]).encode()).hexdigest()


def written_record(job: file_jobs.FileJob, out_dir: Path, run: str) -> dict[str, Any] | None:
    """What the write stage left for the merge about one shard (its `write_shard` result), if
    it wrote or kept that shard for this very run."""
    try:
        record = json.loads(state_path(out_dir, job, "written.json").read_text())
    except (OSError, ValueError):
        return None
    current = isinstance(record, dict) and record.pop("run", None) == run
    return record if current and shard_path(job).exists() else None
