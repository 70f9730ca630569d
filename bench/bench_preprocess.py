"""Pretokenization throughput vs the bare tokenizer, and dataset read speed vs training needs.

    python -m bench.bench_preprocess [--quick | --smoke] [--num_workers N]

1. End to end: `pretokenize_pretrain_data` (read JSONL -> tokenize in N workers -> write
   .bin/.idx) in tokens/s, against the raw speed of the tokenizer's `encode_batch` on the same
   texts in the same number of worker processes (texts already in memory, nothing written,
   workers return only a count). Both start their own pool, so both pay the same start-up.
   The ratio is what the pipeline keeps of the tokenizer's speed; the target is >= 0.85.
2. Random access: samples/s of `PretokDatasetWithIndex[i]` for random i in one process,
   against what training consumes. Assumed consumer: 500k tokens/s, about one H100 training a
   125M-parameter model (989 bf16 TFLOP/s x 40% MFU / 6N FLOPs per token, PaLM app. B ~ 530k).

Uses data/demo/pretrain and tokenizer/demo_hf when they exist (`make demo` builds them), else
generated text and a small tokenizer trained on it. The corpus is repeated to make the run
long enough that start-up does not dominate, and each measurement is the best of a few runs
taken in turns (--quick: a smaller corpus, fewer runs).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from bench import figures
from bench.size_flags import bench_parser
from data.toy_corpus import multilingual_corpus
from data_preprocess import tokenizer_workers, worker_pool
from data_preprocess.build_pretrain_sample_index_map import build_sample_index
from data_preprocess.pretokenize_pretrain_data import pretokenize_pretrain_data
from utils.data_files import iter_texts_from

REPO = Path(__file__).resolve().parents[1]
DEMO_CORPUS = REPO / "data" / "demo" / "pretrain"
DEMO_TOKENIZER = REPO / "tokenizer" / "demo_hf"
ASSUMED_TRAIN_TOKENS_PER_S = 500_000
BATCH_SIZE = 64  # texts per task, the same for both: small enough to balance long documents


def corpus_texts(use_demo: bool, num_documents: int = 3000) -> list[str]:
    if use_demo and DEMO_CORPUS.is_dir():
        return list(iter_texts_from(DEMO_CORPUS))
    return multilingual_corpus(num_documents=num_documents, seed=0)


def tokenizer_dir(texts: list[str], scratch: Path, use_demo: bool) -> Path:
    if use_demo and DEMO_TOKENIZER.is_dir():
        return DEMO_TOKENIZER
    from tokenizer.train_tokenizer import build_tokenizer

    print(f"{DEMO_TOKENIZER} not used: training a 1024-token tokenizer on the corpus")
    build_tokenizer("hf", iter(texts), 1024, scratch / "tokenizer", show_progress=False)
    return scratch / "tokenizer"


def count_tokens(texts: list[str]) -> int:
    """In a worker: the bare encode_batch call, returning only a count (nothing to transfer)."""
    tokenizer = tokenizer_workers.worker_state()["tokenizer"]
    return sum(len(ids) for ids in tokenizer.encode_batch(texts))


def raw_tokens_per_second(texts: list[str], tokenizer: Path, num_workers: int) -> float:
    started = time.perf_counter()
    pool = tokenizer_workers.make_worker_pool(num_workers, tokenizer, {})
    try:
        batches = worker_pool.batched(texts, BATCH_SIZE)
        total = sum(worker_pool.ordered_map(pool, count_tokens, batches, 4 * num_workers))
    finally:
        if pool is not None:  # --num_workers 0: tokenized in this process
            pool.shutdown()
    return (total + len(texts)) / (time.perf_counter() - started)  # + EOS, as pretokenize counts


def run(args: argparse.Namespace, scratch: Path) -> None:
    """Both measurements; every file they write lives under `scratch`."""
    use_demo = not args.smoke
    texts = [text for text in corpus_texts(use_demo, 100 if args.smoke else 3000) if text.strip()]
    texts *= 1 if args.quick or args.smoke else 3
    tokenizer = tokenizer_dir(texts, scratch, use_demo)
    (scratch / "raw").mkdir()
    with open(scratch / "raw" / "corpus.jsonl", "w") as handle:
        for text in texts:
            handle.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")

    raw_tokens_per_second(texts[:BATCH_SIZE], tokenizer, 1)  # warm up: forkserver, file cache
    raw_rates, pipeline_rates = [], []
    for repeat in range(args.repeats):  # alternate, keep the best: other load hits both alike
        raw_rates.append(raw_tokens_per_second(texts, tokenizer, args.num_workers))
        started = time.perf_counter()
        report = pretokenize_pretrain_data(scratch / "raw", tokenizer, scratch / f"pretok{repeat}",
                                           num_workers=args.num_workers, batch_size=BATCH_SIZE)
        pipeline_rates.append(report["num_tokens"] / (time.perf_counter() - started))
    print("runs (tokens/s): raw", [f"{rate:,.0f}" for rate in raw_rates],
          "end to end", [f"{rate:,.0f}" for rate in pipeline_rates])
    raw_rate, pipeline_rate = max(raw_rates), max(pipeline_rates)
    print(f"\n== pretokenization, {len(texts):,} documents, {report['num_tokens']:,} tokens, "
          f"{args.num_workers} worker processes")
    print(f"raw encode_batch      {raw_rate:>12,.0f} tokens/s")
    print(f"end to end (r->t->w)  {pipeline_rate:>12,.0f} tokens/s   "
          f"ratio {pipeline_rate / raw_rate:.2f} (target >= 0.85)")
    figures.record("pretokenize end to end", pipeline_rate, raw_rate, "tokens/s",
                   f"raw encode_batch in {args.num_workers} workers", target=0.85)

    # Imported only here: the raw workers above import this script to find `count_tokens`, and
    # must not pay for torch when the pipeline's workers do not.
    from dataset.dataset_pretrain import PretokDatasetWithIndex

    build_sample_index(scratch / "pretok0", args.max_seq_len, valid_samples=1)
    dataset = PretokDatasetWithIndex(scratch / "pretok0", args.max_seq_len, "train")
    reads = 200 if args.smoke else 2_000 if args.quick else 20_000
    order = np.random.default_rng(0).integers(0, len(dataset), size=reads)
    started = time.perf_counter()
    for index in order:
        dataset[int(index)]
    samples_per_s = reads / (time.perf_counter() - started)
    needed = ASSUMED_TRAIN_TOKENS_PER_S / args.max_seq_len
    print(f"\n== random access, PretokDatasetWithIndex, L={args.max_seq_len}, one process")
    print(f"read                  {samples_per_s:>12,.0f} samples/s "
          f"({samples_per_s * args.max_seq_len:,.0f} tokens/s)")
    print(f"training consumes     {needed:>12,.0f} samples/s (assumed "
          f"{ASSUMED_TRAIN_TOKENS_PER_S:,} tokens/s)   headroom x{samples_per_s / needed:.1f}")
    figures.record("random access reads", samples_per_s, needed, "samples/s",
                   f"training's consumption (assumed {ASSUMED_TRAIN_TOKENS_PER_S:,} tokens/s)",
                   target=1.0)


def main() -> None:
    parser = bench_parser(__doc__.split("\n\n")[0], quick="a smaller corpus, fewer reads",
                          smoke="seconds: tiny sizes, generated data; proves the bench runs")
    parser.add_argument("--num_workers", type=int, default=2,
                        help="tokenizer worker processes, the same for both measurements")
    parser.add_argument("--max_seq_len", type=int, default=256,
                        help="sample length for the random-access reads")
    parser.add_argument("--repeats", type=int, default=None, help="runs of each (best kept)")
    args = parser.parse_args()
    args.repeats = args.repeats or (1 if args.smoke else 2 if args.quick else 3)
    figures.start(args)
    with tempfile.TemporaryDirectory(prefix="bench_preprocess_") as scratch:
        run(args, Path(scratch))
    figures.finish()


if __name__ == "__main__":
    main()
