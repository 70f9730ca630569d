"""Raw text -> cleaned `.jsonl` shards: quality filters, decontamination, exact and MinHash
near-duplicate removal, and a report of every document dropped (docs/design.md §2.12).

    python -m data_preprocess.clean_pretrain_data --data_dir RAW --out_dir CLEAN \\
        [--num_workers N] [--dedup exact,minhash] [--minhash_threshold J] \\
        [--decontaminate PATH ...]
    python -m data_preprocess.pretokenize_pretrain_data --data_dir CLEAN ...   # as it is

Each input file `RAW/sub/a.txt` becomes `CLEAN/sub/a.jsonl`, one `{"text", "source", "line"}`
per kept document, in source order. Three passes:
1. analyse (workers): per document, Unicode normalisation, the filter rules
   (cleaning/filters.py), decontamination (cleaning/decontaminate.py), then its exact key and
   MinHash band keys. Results per input file are kept in `CLEAN/.clean/` (band keys as .npy),
   committed by a sidecar written last, so a re-run skips files already analysed.
2. deduplicate (main process, the whole corpus): exact copies, then LSH clusters band by band
   from the .npy files (cleaning/dedup.py); the first document of a group is kept. Each
   band's keys are sorted externally (cleaning/external_sort.py): at most
   --minhash_sort_records in RAM, the rest as sorted runs in `CLEAN/.clean/sort-*`, deleted
   when the band is done (and, if a killed run left some, when the next run starts).
3. write: each shard atomically (temp file, fsync, rename), then its sidecar; a shard whose
   sidecar matches this run's inputs and settings is skipped. With --write_dropped DIR, the
   dropped documents go to DIR/<rule>.jsonl (cleaning/dropped.py). Last,
   `clean_report.json/.md`, each rule's threshold and datatrove's name beside its count.
On a terminal, passes 1 and 3 show a bar with an ETA.

Pass 1, the costly one, runs as independent array tasks (`--num_tasks N --task_index I`, by
default from the SLURM array: utils/array_tasks.py): task I analyses its share of the sorted
input files into the shared `CLEAN/.clean/` and stops (`analyse_share`). The same command
without the task options, run after every task has finished, is the merge: it reuses every
analysis, deduplicates over the whole corpus and writes the shards and reports, byte for byte
what one run would (docs/design.md, "Data stages as array tasks").
The output depends only on the input and the options, never on --num_workers or
--minhash_sort_records. CLEAN must be new, empty or an earlier CLEAN, apart from RAW; a rerun
deletes the shards of inputs that are gone (`owned_outputs`, docs/design.md §2.4a).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from data_preprocess import file_jobs
from data_preprocess.cleaning import analyse, dedup, dropped, external_sort, filters, minhash
from data_preprocess.cleaning.decontaminate import build_eval_index
from data_preprocess.cleaning.report import CleanReport, write_reports
from data_preprocess.cleaning.text import UNICODE_FORMS, normalise_unicode
from data_preprocess.worker_pool import batched, ordered_map, start_pool
from utils.array_tasks import TaskShare, add_task_arguments, task_share
from utils.atomic_io import atomic_open, atomic_write_json
from utils.boolean_flags import add_boolean_flag
from utils.cli_errors import run_main
from utils.option_checks import raise_problems, range_problem
from utils.option_parser import OptionParser
from utils.readers import BadRecordError, ReadStats, iter_raw_items, text_of

STATE_DIR = ".clean"  # hidden: the readers skip it, so CLEAN stays a clean input folder
VERSION = 1
DEDUP_KINDS = ("exact", "minhash")


class OneLineParser(OptionParser):
    """A bad option ends in one line (`error: ...`, exit 2 via run_main), not usage + error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ValueError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="clean_pretrain_data", description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--data_dir", required=True, help="folder (or file) of .jsonl/.json/.parquet/.txt, "
        "DIR@split, or hf:org/name[:config][@split] (utils/data_files.py)")
    add("--out_dir", required=True, help="where the cleaned .jsonl shards and report go")
    add("--num_workers", type=int, default=file_jobs.DEFAULT_WORKERS, help="0: in-process")
    add("--batch_size", type=int, default=256, help="documents per worker task")
    add("--text_key", nargs="+", default=["text"], help="record key(s) holding the text")
    add_boolean_flag(parser, "--skip_bad_records", help="skip and count malformed records")
    add("--filters", nargs="*", default=list(filters.RULE_GROUPS), choices=filters.RULE_GROUPS,
        help="rule groups to apply (none: no filtering)")
    add("--unicode_form", default="NFC", choices=UNICODE_FORMS, help="Unicode normalisation")
    add("--dedup", default="exact,minhash", help="comma list of exact, minhash ('' for none)")
    add("--minhash_threshold", type=float, default=0.7, help="target Jaccard of near-duplicates")
    add("--num_perm", type=int, default=128, help="MinHash hash functions")
    add("--shingle_words", type=int, default=5, help="words per shingle")
    add("--seed", type=int, default=0, help="seed of the MinHash permutations")
    add("--minhash_sort_records", type=int, default=external_sort.DEFAULT_RUN_RECORDS,
        help=f"band records sorted in RAM at once, {external_sort.BYTES_PER_RECORD_SORTED} bytes "
             "each (default ~96 MB); more spill to disk as sorted runs, merged streaming")
    add("--decontaminate", nargs="+", default=[], help="eval .jsonl/.json/.parquet files/dirs "
        "(of a datasets folder or hf: id, its validation/test split)")
    add("--decontaminate_ngram", type=int, default=13, help="words of a leaked n-gram")
    add("--decontaminate_min_words", type=int, default=8, help="shorter eval items are ignored")
    add("--write_dropped", metavar="DIR", default=None, help="also write every dropped document "
        "to DIR/<rule>.jsonl (new, empty or its own earlier output; cleaning/dropped.py)")
    add_task_arguments(parser)
    group = parser.add_argument_group("filter thresholds (Gopher's values by default)")
    for name, value_type, default, help_text in filters.option_fields():
        group.add_argument(f"--{name}", type=value_type, default=default, help=help_text)
    return parser


def settings_from(args: argparse.Namespace) -> analyse.CleanSettings:
    """Check every option (one ValueError naming all problems) before any work is done."""
    dedup_kinds = tuple(kind for kind in args.dedup.split(",") if kind)
    unknown = [kind for kind in dedup_kinds if kind not in DEDUP_KINDS]
    options = filters.FilterOptions(**{name: getattr(args, name)
                                       for name, *_ in filters.option_fields()})
    raise_problems([
        range_problem("--num_workers", args.num_workers, 0),
        range_problem("--batch_size", args.batch_size, 1),
        range_problem("--minhash_threshold", args.minhash_threshold, 0, 1, low_open=True,
                      high_open=True),
        range_problem("--num_perm", args.num_perm, 1),
        range_problem("--shingle_words", args.shingle_words, 1),
        range_problem("--seed", args.seed, 0),
        range_problem("--minhash_sort_records", args.minhash_sort_records,
                      external_sort.MIN_RUN_RECORDS),
        range_problem("--decontaminate_ngram", args.decontaminate_ngram, 1),
        range_problem("--decontaminate_min_words", args.decontaminate_min_words, 1),
        f"--dedup: unknown {unknown}; choose from {','.join(DEDUP_KINDS)}" if unknown else None,
        *filters.threshold_problems(options)])
    bands, rows = minhash.choose_bands(args.minhash_threshold, args.num_perm)
    eval_index = None
    if args.decontaminate:
        eval_index = build_eval_index(args.decontaminate, args.decontaminate_ngram,
                                      args.decontaminate_min_words)
    return analyse.CleanSettings(tuple(args.filters), options, args.unicode_form, dedup_kinds,
                                 args.num_perm, bands, rows, args.shingle_words, args.seed,
                                 eval_index)


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
        pool = start_pool(args.num_workers, analyse.init_worker, (settings,))
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


def decide_drops(jobs: list[file_jobs.FileJob], analyses: list[dict[str, Any]], out_dir: Path,
                 settings: analyse.CleanSettings,
                 sort_records: int) -> list[dict[int, tuple[str, Any]]]:
    """Pass 2, over the whole corpus: {record number: (rule, value)} of every dropped
    document, per file. Survivors of the filters are numbered in source order; exact copies
    go first, then near-duplicate clusters among what is left (their band keys sorted
    externally, `sort_records` at a time, in CLEAN/.clean/sort-*)."""
    drops: list[dict[int, tuple[str, Any]]] = [{} for _ in jobs]
    where: list[tuple[int, int]] = []  # survivor number -> (file index, record number)
    exact_keys, band_files = [], []
    for file_index, analysis in enumerate(analyses):
        first_survivor = len(where)
        for number, _, rule, value, key in analysis["verdicts"]:
            if rule is not None:
                drops[file_index][number] = (rule, value)
                continue
            if key is not None:
                exact_keys.append((len(where), key))
            where.append((file_index, number))
        band_files.append(dedup.BandFile(state_path(out_dir, jobs[file_index], "bands.npy"),
                                         first_survivor, len(where) - first_survivor))

    def name(survivor: int) -> str:
        file_index, number = where[survivor]
        return f"{jobs[file_index].relative}:{number}"

    copies = dedup.exact_duplicates(exact_keys)
    for survivor, first in copies.items():
        file_index, number = where[survivor]
        drops[file_index][number] = ("exact_duplicate", name(first))
    if "minhash" in settings.dedup:
        work_dir = out_dir / STATE_DIR
        if removed := external_sort.remove_leftover_work_dirs(work_dir):
            print(f"removed {removed} sort folder(s) left in {work_dir} by an interrupted run")
        for survivor, first in dedup.near_duplicates(
                band_files, settings.bands, np.array(sorted(copies), dtype=np.int64), work_dir,
                sort_records).items():
            file_index, number = where[survivor]
            drops[file_index][number] = ("near_duplicate", name(first))
    return drops


def rule_details(settings: analyse.CleanSettings,
                 args: argparse.Namespace) -> dict[str, dict[str, str]]:
    """Every rule's threshold and datatrove's name for it, for the report (filters.py has the
    filter rules'; the four steps after them are this command's)."""
    ngram = settings.eval_index.ngram if settings.eval_index else args.decontaminate_ngram
    return {"empty": {"threshold": "only whitespace",
                      "datatrove": "empty (GopherRepetitionFilter)"},
            **filters.rule_details(settings.filter_options),
            "eval_contamination": {"threshold": f"shares a {ngram}-word n-gram with an eval "
                                                "item (--decontaminate_ngram)",
                                   "datatrove": "contaminated (NGramsDecontFilter)"},
            "exact_duplicate": {"threshold": "the same words as an earlier document",
                                "datatrove": "ExactDedupFilter"},
            "near_duplicate": {"threshold": f"Jaccard >= ~{args.minhash_threshold} with an "
                                            "earlier document (--minhash_threshold)",
                               "datatrove": "MinhashDedupFilter"}}


def dropped_documents(jobs: list[file_jobs.FileJob], drops: list[dict[int, tuple[str, Any]]],
                      args: argparse.Namespace) -> Iterator[tuple[str, dict[str, Any]]]:
    """(rule, record) of every dropped document in source order, its text normalised as a
    shard's would be (files without drops are not read)."""
    for job, file_drops in zip(jobs, drops):
        if not file_drops:
            continue
        for number, text in numbered_texts(job, args.text_key, args.skip_bad_records,
                                           ReadStats()):
            if number in file_drops:
                rule, value = file_drops[number]
                yield rule, {"text": normalise_unicode(text, args.unicode_form),
                             "source": job.relative, "line": number, "value": value}


def write_shard(job: file_jobs.FileJob, drops: dict[int, tuple[str, Any]], out_dir: Path,
                run: str, args: argparse.Namespace) -> dict[str, Any]:
    """Pass 3 for one file: its kept documents, normalised, as CLEAN/<relative>.jsonl."""
    shard = job.prefix.with_name(job.prefix.name + ".jsonl")
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


def analyse_share(jobs: list[file_jobs.FileJob], share: TaskShare, out_dir: Path,
                  settings: analyse.CleanSettings, args: argparse.Namespace) -> dict[str, Any]:
    """An array task: pass 1 for its share of the files, into the shared CLEAN/.clean/ (one
    file per input, so tasks never write the same file), under its own ledger."""
    state = f"{STATE_DIR}/"
    file_jobs.claim_out_dir("clean_pretrain_data", out_dir, [state], share,
                           [name for name in owned_outputs(jobs) if name != state])
    mine = share.take(jobs)
    fingerprint = settings_fingerprint(settings, args.text_key, args.skip_bad_records)
    analyse_all(mine, out_dir, settings, fingerprint, args)
    print(f"{share.label}: analysed its {len(mine)} of {len(jobs)} files; when every task is "
          "done, run the same command without --num_tasks/--task_index to deduplicate and "
          "write the shards")
    return {"task": share.label, "files": [job.relative for job in mine]}


def clean_pretrain_data(args: argparse.Namespace) -> dict[str, Any]:
    """All three passes; returns the report (also written as clean_report.json/.md). As one
    of several array tasks, pass 1 of its share only (`analyse_share`)."""
    share = task_share(args.num_tasks, args.task_index)
    if not share.alone and args.write_dropped:
        raise ValueError("--write_dropped belongs to the merging run (the same command without "
                         "--num_tasks/--task_index): an array task only analyses; drop it here")
    settings = settings_from(args)
    out_dir = Path(args.out_dir)
    jobs = file_jobs.plan_file_jobs(args.data_dir, out_dir,
                                   [("--decontaminate", path) for path in args.decontaminate])
    if not share.alone:
        return analyse_share(jobs, share, out_dir, settings, args)
    file_jobs.claim_out_dir("clean_pretrain_data", out_dir, owned_outputs(jobs))
    if "minhash" in settings.dedup:
        print(f"minhash: {settings.bands} bands x {settings.rows} rows of {settings.num_perm} "
              f"hashes; S-curve 50% point at Jaccard "
              f"{minhash.s_curve_midpoint(settings.bands, settings.rows):.3f}")
    if args.write_dropped:
        dropped_ledger = dropped.claim(Path(args.write_dropped), [
            ("--data_dir", args.data_dir), ("--out_dir", args.out_dir),
            *(("--decontaminate", path) for path in args.decontaminate)],
            rule_details(settings, args))
    fingerprint = settings_fingerprint(settings, args.text_key, args.skip_bad_records)
    analyses = analyse_all(jobs, out_dir, settings, fingerprint, args)
    drops = decide_drops(jobs, analyses, out_dir, settings, args.minhash_sort_records)
    inputs = [[job.relative, file_jobs.source_identity(job.source)] for job in jobs]
    run = hashlib.sha256(json.dumps([fingerprint, inputs]).encode()).hexdigest()
    report, reused = CleanReport(), 0
    progress = input_bar(jobs, "writing")
    for job, analysis, file_drops in zip(jobs, analyses, drops):
        for number, size, _, _, _ in analysis["verdicts"]:
            report.documents_in, report.bytes_in = report.documents_in + 1, report.bytes_in + size
            if number in file_drops:
                rule, value = file_drops[number]
                report.drop(rule, f"{job.relative}:{number}", value)
        report.skipped_bad_records.update(analysis["skipped"])
        shard = write_shard(job, file_drops, out_dir, run, args)
        report.documents_out += shard["documents"]
        report.bytes_out += shard["bytes"]
        reused += shard["reused"]
        progress.update(job.source.stat().st_size)
    progress.close()
    if args.write_dropped:
        written = dropped.write_dropped(dropped_ledger, report.dropped,
                                        dropped_documents(jobs, drops, args))
        print(f"dropped documents: {len(written)} file(s) in {args.write_dropped}")
    details = rule_details(settings, args)
    extra = {"files": len(jobs), "shards_reused": reused, "settings": fingerprint,
             "rules": {rule: details[rule] for rule in report.dropped}}
    if "minhash" in settings.dedup:
        extra["minhash"] = {"bands": settings.bands, "rows": settings.rows, "s_curve_50pct": round(
            minhash.s_curve_midpoint(settings.bands, settings.rows), 3)}
    if settings.eval_index is not None:
        extra["eval_items"] = {"items": settings.eval_index.items,
                               "too_short_to_match": settings.eval_index.too_short}
    result = write_reports(out_dir, report, extra)
    print(f"{report.summary_line()}\nreport: {out_dir / 'clean_report.md'}")
    return result


def main(argv: list[str] | None = None) -> None:
    clean_pretrain_data(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(run_main(main))
