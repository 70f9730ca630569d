"""Does the on-the-fly stream keep up with training? Samples/s side by side, and the ratios.

    python -m bench.bench_stream [--quick | --smoke] [--seq_len 256] [--batch_size 8]

Measured on this machine, one after another, all with L = seq_len:
1. stream:  `StreamLoader` (dataset/stream.py) with 2 DataLoader workers reading raw .jsonl
   shards, tokenizing, packing and shuffling (a buffer of 4 batches): samples/s after the
   first batch (worker start-up and the buffer's fill are a one-off cost, reported apart).
2. pretok:  the offline path, `PretokDatasetWithIndex` through a DataLoader with 2 workers
   and the checkpointable sampler, on the same corpus pretokenized beforehand.
3. training: one optimizer step (forward, backward, AdamW) of the `tiny` and `0.1B` presets on
   this machine's CPU, batch_size sequences per step: the samples/s training consumes.
Printed: each rate and the headroom ratios stream / training (> 1: the stream keeps up) and
stream / pretok. A GPU trains far faster than this CPU; scale the training figures by the
device's measured step time to judge there (docs/training.md, "Which data path").
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, default_collate

from bench import figures
from bench.bench_preprocess import corpus_texts, tokenizer_dir
from bench.size_flags import bench_parser
from data_preprocess.build_pretrain_sample_index_map import build_sample_index
from data_preprocess.pretokenize_pretrain_data import pretokenize_pretrain_data
from dataset.dataset_pretrain import PretokDatasetWithIndex
from dataset.sampler import StatefulDistributedSampler
from dataset.stream import StreamDataset, StreamLoader, StreamSettings
from dataset.stream_shards import find_sources
from model.configuration_z2all import Z2allConfig
from model.modeling_z2all import Z2allForCausalLM

NUM_SHARDS = 4
NUM_WORKERS = 2


def write_shards(texts: list[str], out: Path, repeats: int) -> Path:
    out.mkdir(parents=True)
    for shard in range(NUM_SHARDS):
        with open(out / f"shard_{shard}.jsonl", "w", encoding="utf-8") as handle:
            for _ in range(repeats):
                for text in texts[shard::NUM_SHARDS]:
                    handle.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    return out


def rate(batches, num_batches: int, batch_size: int) -> tuple[float, float]:
    """(seconds to the first batch, samples/s over the next num_batches)."""
    start = time.perf_counter()
    next(batches)
    first = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(num_batches):
        next(batches)
    return first, num_batches * batch_size / (time.perf_counter() - start)


def stream_rate(shards: Path, tokenizer: Path, args: argparse.Namespace) -> tuple[float, float]:
    settings = StreamSettings("pretrain", str(tokenizer), args.seq_len, seed=0, holdout_every=0)
    dataset = StreamDataset(find_sources(shards), settings, num_workers=NUM_WORKERS)
    loader = StreamLoader(dataset, args.batch_size, default_collate, NUM_WORKERS,
                          shuffle_buffer=4 * args.batch_size)
    return rate(iter(loader), args.num_batches, args.batch_size)


def pretok_rate(shards: Path, tokenizer: Path, scratch: Path, args: argparse.Namespace
                ) -> tuple[float, float]:
    pretok = scratch / "pretok"
    pretokenize_pretrain_data(shards, tokenizer, pretok, num_workers=NUM_WORKERS)
    build_sample_index(pretok, args.seq_len, valid_samples=1)
    dataset = PretokDatasetWithIndex(pretok, args.seq_len, "train")
    loader = DataLoader(dataset, args.batch_size, num_workers=NUM_WORKERS,
                        sampler=StatefulDistributedSampler(len(dataset), seed=0))
    return rate(iter(loader), args.num_batches, args.batch_size)


def training_rate(preset: str, args: argparse.Namespace, steps: int) -> float:
    """Samples/s one training step consumes: batch_size / (median step time)."""
    torch.manual_seed(0)
    model = Z2allForCausalLM(Z2allConfig.from_preset(preset,
                                                     max_position_embeddings=args.seq_len))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    vocab = model.config.vocab_size
    times = []
    for _ in range(steps + 1):  # the first step warms up allocations: not counted
        ids = torch.randint(0, vocab, (args.batch_size, args.seq_len + 1))
        start = time.perf_counter()
        model(ids[:, :-1], labels=ids[:, 1:]).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
    return args.batch_size / sorted(times[1:])[len(times[1:]) // 2]


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser(__doc__.split("\n\n")[0], quick="smaller corpus, fewer steps",
                          smoke="10 batches, 1 step of the tiny model: only checks that it runs")
    parser.add_argument("--seq_len", type=int, default=256)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--num_batches", type=int, default=None)
    args = parser.parse_args(argv)
    figures.start(args, "bench_stream")
    if args.smoke:
        args.seq_len = min(args.seq_len, 64)
    args.num_batches = args.num_batches or (10 if args.smoke else 100 if args.quick else 400)
    torch.set_num_threads(1)
    use_demo = not args.smoke  # the demo's corpus and tokenizer where built; --smoke never
    texts = corpus_texts(use_demo, 100 if args.smoke else 3000)
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        tokenizer = tokenizer_dir(texts, scratch, use_demo)
        shards = write_shards(texts, scratch / "shards",
                              repeats=1 if args.quick or args.smoke else 3)
        stream_first, stream = stream_rate(shards, tokenizer, args)
        pretok_first, pretok = pretok_rate(shards, tokenizer, scratch, args)
    steps = 1 if args.smoke else 2 if args.quick else 5
    presets = ("tiny",) if args.smoke else ("tiny", "0.1B")
    training = {preset: training_rate(preset, args, steps) for preset in presets}

    print(f"L={args.seq_len}, batch {args.batch_size}, {NUM_WORKERS} DataLoader workers, "
          f"{torch.get_num_threads()} torch thread")
    print(f"stream  {stream:9.1f} samples/s   (first batch after {stream_first:.2f} s)")
    print(f"pretok  {pretok:9.1f} samples/s   (first batch after {pretok_first:.2f} s)")
    for preset, consumed in training.items():
        print(f"train {preset:>4} consumes {consumed:9.1f} samples/s   headroom stream/train "
              f"= {stream / consumed:.1f}x")
        figures.record(f"stream vs training {preset}", stream, consumed, "samples/s",
                       f"what training the {preset} preset consumes", target=1.0)
    print(f"stream / pretok = {stream / pretok:.2f}")
    figures.record("stream vs pretokenized", stream, pretok, "samples/s",
                   "pretokenized .bin reads")
    figures.finish()


if __name__ == "__main__":
    main()
