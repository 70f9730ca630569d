"""clean_pretrain_data's array stages: each a separate command (`--stage`), run as an array
of tasks (`--num_tasks N --task_index I`, by default from the SLURM array) or, for clusters,
once; they hand over through files in CLEAN/.clean/ (docs/design.md §2.13):

    analyse  (array: files p % N == I)   -> <file>.analysis.json, <file>.bands.npy
    buckets  (array: bands b % N == I)   -> buckets/band-BBBB.pairs + .json (corpus_dedup.py)
    clusters (once)                      -> duplicates.json
    write    (array: files p % N == I)   -> CLEAN/<file stem>.jsonl, <file>.written.json
    merge    (once, clean_pretrain_data.clean_corpus) -> clean_report.json/.md, the one ledger

A stage reads only what the stages before it wrote for this very run (`file_passes.run_id`:
the settings and every input's size and mtime), and refuses to start, in one line naming the
missing files and the stage that makes them, when any is missing. Every task writes only its
own files (one per input file or per band, atomically, a commit mark last) under its own
ledger (utils/data_output_dir.py), so tasks never write the same file and a rerun of one task
redoes only what it lacks.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from data_preprocess import file_jobs
from data_preprocess.cleaning import analyse, corpus_dedup
from data_preprocess.cleaning.file_passes import (
    STATE_DIR,
    analyse_all,
    load_analysis,
    owned_outputs,
    run_id,
    settings_fingerprint,
    state_path,
    write_shard,
)
from utils.array_tasks import THE_ONLY_TASK, TaskShare
from utils.atomic_io import atomic_write_json


def refuse_until(stage: str, missing: list[str], out_dir: Path, earlier: str) -> None:
    """A stage whose inputs are incomplete stops before any work, in one line naming the
    missing files (relative to --out_dir) and the stage that makes them."""
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise ValueError(f"--stage {stage}: {out_dir} lacks {', '.join(missing[:3])}{more} "
                         "(missing, unfinished, or made with other options or inputs); run "
                         f"--stage {earlier} first, with the same options")


def finished_analyses(stage: str, jobs: list[file_jobs.FileJob], out_dir: Path,
                      fingerprint: dict[str, Any]) -> list[dict[str, Any]]:
    """Every job's analysis, made with these settings from these very files, or a refusal."""
    analyses = [load_analysis(job, out_dir,
                              {**fingerprint, **file_jobs.source_identity(job.source)})
                for job in jobs]
    refuse_until(stage, [f"{STATE_DIR}/{job.relative}.analysis.json"
                         for job, analysis in zip(jobs, analyses) if analysis is None],
                 out_dir, "analyse (every task)")
    return [analysis for analysis in analyses if analysis is not None]


def claim_share(jobs: list[file_jobs.FileJob], share: TaskShare, out_dir: Path,
                shard_jobs: Sequence[file_jobs.FileJob] = ()) -> None:
    """A stage's claim on --out_dir: it writes the state folder and the shards of
    `shard_jobs`; everything else the command writes is the other tasks' (kept)."""
    planned = [f"{STATE_DIR}/", *(f"{job.output_stem}.jsonl" for job in shard_jobs)]
    file_jobs.claim_out_dir("clean_pretrain_data", out_dir, planned, share,
                           [name for name in owned_outputs(jobs) if name not in planned])


def analyse_share(jobs: list[file_jobs.FileJob], share: TaskShare, out_dir: Path,
                  settings: analyse.CleanSettings, args: argparse.Namespace) -> dict[str, Any]:
    """Stage analyse (array): pass 1 for its share of the files, into the shared CLEAN/.clean/
    (one file per input, so tasks never write the same file), under its own ledger."""
    claim_share(jobs, share, out_dir)
    mine = share.take(jobs)
    fingerprint = settings_fingerprint(settings, args.text_key, args.skip_bad_records)
    analyse_all(mine, out_dir, settings, fingerprint, args)
    print(f"{share.label}: analysed its {len(mine)} of {len(jobs)} files; when every task is "
          "done, run --stage buckets (an array), or the same command without "
          "--num_tasks/--task_index to do the rest on one machine")
    return {"task": share.label, "files": [job.relative for job in mine]}


def buckets_share(jobs: list[file_jobs.FileJob], share: TaskShare, out_dir: Path,
                  settings: analyse.CleanSettings, args: argparse.Namespace) -> dict[str, Any]:
    """Stage buckets (array): the candidate pairs of its share of the LSH bands, over every
    file's band keys (cleaning/corpus_dedup.py)."""
    fingerprint = settings_fingerprint(settings, args.text_key, args.skip_bad_records)
    analyses = finished_analyses("buckets", jobs, out_dir, fingerprint)
    claim_share(jobs, share, out_dir)
    bands = share.take(range(settings.bands)) if "minhash" in settings.dedup else []
    done = corpus_dedup.write_band_buckets(
        [job.relative for job in jobs], analyses,
        [state_path(out_dir, job, "bands.npy") for job in jobs], settings.bands, bands,
        out_dir / STATE_DIR, args.minhash_sort_records, run_id(fingerprint, jobs))
    print(f"{share.label}: the buckets of its {len(bands)} of {settings.bands} bands "
          f"({done} already done); when every task is done, run --stage clusters (once)")
    return {"task": share.label, "bands": bands}


def clusters_once(jobs: list[file_jobs.FileJob], out_dir: Path, settings: analyse.CleanSettings,
                  args: argparse.Namespace) -> dict[str, Any]:
    """Stage clusters (one task): exact copies and near-duplicate clusters over every band's
    pairs; the duplicates per file go to CLEAN/.clean/duplicates.json for the write stage."""
    fingerprint = settings_fingerprint(settings, args.text_key, args.skip_bad_records)
    analyses = finished_analyses("clusters", jobs, out_dir, fingerprint)
    run, state = run_id(fingerprint, jobs), out_dir / STATE_DIR
    if "minhash" in settings.dedup:
        refuse_until("clusters", [f"{STATE_DIR}/{name}" for name in corpus_dedup.missing_bands(
            state, settings.bands, run)], out_dir, "buckets (every task)")
    claim_share(jobs, THE_ONLY_TASK, out_dir)
    names = [job.relative for job in jobs]
    drops = corpus_dedup.duplicate_drops(
        names, analyses, [state_path(out_dir, job, "bands.npy") for job in jobs],
        settings.dedup, settings.bands, state, args.minhash_sort_records,
        staged_pairs=corpus_dedup.read_band_pairs(state, settings.bands))
    corpus_dedup.write_duplicates(state, run, names, drops)
    count = sum(len(file_drops) for file_drops in drops)
    print(f"clusters: {count} duplicates in {len(jobs)} files; next, --stage write (an array)")
    return {"duplicates": count}


def write_share(jobs: list[file_jobs.FileJob], share: TaskShare, out_dir: Path,
                settings: analyse.CleanSettings, args: argparse.Namespace) -> dict[str, Any]:
    """Stage write (array): the shards of its share of the files, each with a record of what
    it holds (`<file>.written.json`) that the merge reads instead of the shard."""
    fingerprint = settings_fingerprint(settings, args.text_key, args.skip_bad_records)
    mine = share.take(jobs)
    analyses = finished_analyses("write", mine, out_dir, fingerprint)
    run = run_id(fingerprint, jobs)
    duplicates = corpus_dedup.load_duplicates(out_dir / STATE_DIR, run,
                                              [job.relative for job in jobs])
    if duplicates is None:
        refuse_until("write", [f"{STATE_DIR}/{corpus_dedup.DUPLICATES_FILE}"], out_dir,
                     "clusters")
    claim_share(jobs, share, out_dir, mine)
    duplicates_of = dict(zip(jobs, duplicates or []))
    for job, analysis in zip(mine, analyses):
        drops = {**corpus_dedup.filter_drops(analysis), **duplicates_of[job]}
        shard = write_shard(job, drops, out_dir, run, args)
        atomic_write_json(state_path(out_dir, job, "written.json"), {"run": run, **shard})
    print(f"{share.label}: wrote its {len(mine)} of {len(jobs)} shards; when every task is "
          "done, run --stage merge (once)")
    return {"task": share.label, "files": [job.relative for job in mine]}
