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
   committed by a sidecar written last, so a re-run skips files already analysed
   (cleaning/file_passes.py).
2. deduplicate (main process, the whole corpus): exact copies, then LSH clusters band by band
   from the .npy files (cleaning/corpus_dedup.py, cleaning/dedup.py); the first document of a
   group is kept. Each band's keys are sorted externally (cleaning/external_sort.py): at most
   --minhash_sort_records in RAM, the rest as sorted runs in `CLEAN/.clean/sort-*`, deleted
   when the band is done (and, if a killed run left some, when the next run starts).
3. write: each shard atomically (temp file, fsync, rename), then its sidecar; a shard whose
   sidecar matches this run's inputs and settings is skipped. With --write_dropped DIR, the
   dropped documents go to DIR/<rule>.jsonl (cleaning/dropped.py). Last,
   `clean_report.json/.md`, each rule's threshold and datatrove's name beside its count.
On a terminal, passes 1 and 3 show a bar with an ETA.

`--stage` splits the work into commands that run as independent array tasks
(`--num_tasks N --task_index I`, by default from the SLURM array: utils/array_tasks.py) and
hand over through `CLEAN/.clean/` (cleaning/array_stages.py; docs/design.md §2.13):
analyse (array) -> buckets (array, a share of the LSH bands) -> clusters (once) -> write
(array) -> merge (once: the reports, the dropped documents, the one ledger). `--stage all`,
the default outside an array, is every pass in this process, reusing whatever the stages
left for this very run: after the analyse tasks alone it is the merge of the old two-step
split. Both give, byte for byte, what one run on one machine writes.
The output depends only on the input and the options, never on --num_workers or
--minhash_sort_records. CLEAN must be new, empty or an earlier CLEAN, apart from RAW; a rerun
deletes the shards of inputs that are gone (`owned_outputs`, docs/design.md §2.4a).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from data_preprocess import file_jobs
from data_preprocess.cleaning import (
    analyse,
    corpus_dedup,
    dropped,
    external_sort,
    filters,
    minhash,
)
from data_preprocess.cleaning.array_stages import (
    analyse_share,
    buckets_share,
    clusters_once,
    finished_analyses,
    refuse_until,
    write_share,
)
from data_preprocess.cleaning.decontaminate import build_eval_index
from data_preprocess.cleaning.file_passes import (
    STATE_DIR,
    analyse_all,
    input_bar,
    numbered_texts,
    owned_outputs,
    run_id,
    settings_fingerprint,
    state_path,
    write_shard,
    written_record,
)
from data_preprocess.cleaning.report import CleanReport, write_reports
from data_preprocess.cleaning.text import UNICODE_FORMS, normalise_unicode
from utils.array_tasks import TaskShare, add_task_arguments, task_share
from utils.boolean_flags import add_boolean_flag
from utils.cli_errors import run_main
from utils.option_checks import raise_problems, range_problem
from utils.option_parser import OptionParser
from utils.readers import ReadStats

DEDUP_KINDS = ("exact", "minhash")
STAGES = ("all", "analyse", "buckets", "clusters", "write", "merge")
ARRAY_STAGES = ("analyse", "buckets", "write")  # the others run once


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
    add("--stage", default=None, choices=STAGES, help="all: every pass on one machine (the "
        "default); as array stages: analyse (the default of an array task), buckets, clusters "
        "(once), write, merge (once); docs/design.md §2.13")
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


def clean_corpus(jobs: list[file_jobs.FileJob], out_dir: Path, settings: analyse.CleanSettings,
                 args: argparse.Namespace, merging: bool) -> dict[str, Any]:
    """Stage all (every pass here; what earlier stages left for this run is reused) or merge
    (every stage's output required): the report, the dropped documents and the one ledger."""
    fingerprint = settings_fingerprint(settings, args.text_key, args.skip_bad_records)
    run, state, names = run_id(fingerprint, jobs), out_dir / STATE_DIR, [j.relative for j in jobs]
    # what the clusters and write stages left for this run, read once (None where absent)
    duplicates = corpus_dedup.load_duplicates(state, run, names)
    shards_written = [written_record(job, out_dir, run) for job in jobs]
    if merging:
        analyses = finished_analyses("merge", jobs, out_dir, fingerprint)
        if duplicates is None:
            refuse_until("merge", [f"{STATE_DIR}/{corpus_dedup.DUPLICATES_FILE}"], out_dir,
                         "clusters")
        refuse_until("merge", [f"{STATE_DIR}/{job.relative}.written.json"
                               for job, record in zip(jobs, shards_written) if record is None],
                     out_dir, "write (every task)")
    file_jobs.claim_out_dir("clean_pretrain_data", out_dir, owned_outputs(jobs))
    if "minhash" in settings.dedup:
        print(f"minhash: {settings.bands} bands x {settings.rows} rows of {settings.num_perm} "
              f"hashes; S-curve 50% point at Jaccard "
              f"{minhash.s_curve_midpoint(settings.bands, settings.rows):.3f}")
    details = rule_details(settings, args)
    if args.write_dropped:
        dropped_ledger = dropped.claim(Path(args.write_dropped), [
            ("--data_dir", args.data_dir), ("--out_dir", args.out_dir),
            *(("--decontaminate", path) for path in args.decontaminate)], details)
    if not merging:
        analyses = analyse_all(jobs, out_dir, settings, fingerprint, args)
    if duplicates is None:
        duplicates = corpus_dedup.duplicate_drops(
            names, analyses, [state_path(out_dir, job, "bands.npy") for job in jobs],
            settings.dedup, settings.bands, state, args.minhash_sort_records)
    drops = [{**corpus_dedup.filter_drops(analysis), **file_duplicates}
             for analysis, file_duplicates in zip(analyses, duplicates)]
    report, reused = CleanReport(), 0
    progress = input_bar(jobs, "writing")
    for job, analysis, file_drops, record in zip(jobs, analyses, drops, shards_written):
        for number, size, _, _, _ in analysis["verdicts"]:
            report.documents_in, report.bytes_in = report.documents_in + 1, report.bytes_in + size
            if number in file_drops:
                rule, value = file_drops[number]
                report.drop(rule, f"{job.relative}:{number}", value)
        report.skipped_bad_records.update(analysis["skipped"])
        shard = record or write_shard(job, file_drops, out_dir, run, args)
        report.documents_out += shard["documents"]
        report.bytes_out += shard["bytes"]
        reused += shard["reused"]
        progress.update(job.source.stat().st_size)
    progress.close()
    if args.write_dropped:
        written = dropped.write_dropped(dropped_ledger, report.dropped,
                                        dropped_documents(jobs, drops, args))
        print(f"dropped documents: {len(written)} file(s) in {args.write_dropped}")
    extra = {"files": len(jobs), "shards_reused": reused, "settings": fingerprint,
             "rules": {rule: details[rule] for rule in report.dropped}}
    if "minhash" in settings.dedup:
        extra["minhash"] = {"bands": settings.bands, "rows": settings.rows, "s_curve_50pct": round(
            minhash.s_curve_midpoint(settings.bands, settings.rows), 3)}
    if settings.eval_index is not None:
        extra["eval_items"] = {"items": settings.eval_index.items,
                               "too_short_to_match": settings.eval_index.too_short}
    result = write_reports(out_dir, report, extra)
    for job in jobs:  # the write stage's records are spent: a rerun finds its shards reused
        state_path(out_dir, job, "written.json").unlink(missing_ok=True)
    print(f"{report.summary_line()}\nreport: {out_dir / 'clean_report.md'}")
    return result


def chosen_stage(stage: str | None, share: TaskShare) -> str:
    """--stage, by default `analyse` in an array and `all` outside one; the stages that run
    once refuse an array task's options."""
    stage = stage or ("all" if share.alone else "analyse")
    if not share.alone and stage not in ARRAY_STAGES:
        raise ValueError(f"--stage {stage} runs once: run it without --num_tasks/--task_index "
                         f"(and outside a SLURM array); {share.label} was asked for")
    return stage


def clean_pretrain_data(args: argparse.Namespace) -> dict[str, Any]:
    """The stage --stage names (by default: all three passes, or as an array task the analysis
    of its share); returns what it did, for `all` and `merge` the report (also written as
    clean_report.json/.md)."""
    share = task_share(args.num_tasks, args.task_index)
    stage = chosen_stage(args.stage, share)
    if args.write_dropped and stage not in ("all", "merge"):
        raise ValueError(f"--write_dropped belongs to the merging run (--stage merge, or the "
                         f"plain command), not to --stage {stage}; drop it here")
    settings = settings_from(args)
    out_dir = Path(args.out_dir)
    jobs = file_jobs.plan_file_jobs(args.data_dir, out_dir,
                                   [("--decontaminate", path) for path in args.decontaminate])
    if stage == "analyse":
        return analyse_share(jobs, share, out_dir, settings, args)
    if stage == "buckets":
        return buckets_share(jobs, share, out_dir, settings, args)
    if stage == "clusters":
        return clusters_once(jobs, out_dir, settings, args)
    if stage == "write":
        return write_share(jobs, share, out_dir, settings, args)
    return clean_corpus(jobs, out_dir, settings, args, merging=stage == "merge")


def main(argv: list[str] | None = None) -> None:
    clean_pretrain_data(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(run_main(main))
