"""Encode throughput of our tokenizer wrappers vs the raw libraries, on the same text.

    python -m bench.bench_tokenizer [--quick | --smoke] [--json]

Uses tokenizer/demo_hf and tokenizer/demo_sp with the demo corpus (data/demo/pretrain) when they
exist (`make demo` builds them); otherwise (and with --smoke) trains two small tokenizers on
generated text first.
Each path encodes the same list of documents; the best of a few repeats is kept. The ratio column
is throughput relative to the raw library: `tokenizers.Tokenizer.encode_batch_fast` on the same
tokenizer.json (the call our wrapper makes, so it measures the wrapper's own cost; target for
`encode_batch`: above 0.9), and for the sentencepiece kind `SentencePieceProcessor.encode(list)`
on the model our tokenizer.json was converted from (our `encode_batch` runs that very model
through sentencepiece: target above 0.95; `tok(texts)` and `encode` still go through
tokenizer.json).
(`encode_batch` with character offsets, the slower call most code uses, is listed too.)

Then end to end: `pretokenize_pretrain_data` (read JSONL, encode, write .bin/.idx; in this
process, no workers) on the documents repeated until the raw call takes END_TO_END_SECONDS
(the pipeline's start-up, ~0.1 s: loading the tokenizer, fsyncs, the report, then costs a few
percent; the figure is its throughput), against the raw call on the same texts (target above
0.9: what the pipeline keeps of the library). Reading a JSONL record costs about 40 us whatever
its length, as much as encoding 200 characters, so the generated texts (about 200 characters
each) are joined into documents of at least END_TO_END_DOCUMENT_CHARS first, the size of a
typical web page; the demo's documents are longer already and stay as they are.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import sentencepiece
import tokenizers

from bench import figures
from bench.size_flags import bench_parser
from data.toy_corpus import multilingual_corpus
from data_preprocess.pretokenize_pretrain_data import pretokenize_pretrain_data
from tokenizer import load_tokenizer
from tokenizer.train_tokenizer import build_tokenizer
from utils.data_files import iter_texts_from

REPO = Path(__file__).resolve().parents[1]
DEMO_CORPUS = REPO / "data" / "demo" / "pretrain"
DEMO_TOKENIZERS = {"hf": REPO / "tokenizer" / "demo_hf", "sp": REPO / "tokenizer" / "demo_sp"}


FALLBACK_VOCAB_SIZE = 1024  # what a few hundred generated documents can fill (4096 cannot)
# A generated text is about 200 characters, a document of the demo corpus a few thousand: the
# run encodes about as much text either way, enough that timings are not a few milliseconds.
GENERATED_PER_DOCUMENT = 20
ENCODE_BATCH_TARGETS = {"hf": 0.9, "sp": 0.95}  # ours encode_batch / the raw library call
END_TO_END_TARGET = 0.9  # pretokenize_pretrain_data / the raw library call
END_TO_END_DOCUMENT_CHARS = 4000
END_TO_END_SECONDS = 2.0  # of the raw call, on the repeated documents


def load_documents(limit: int, use_demo: bool = True) -> tuple[list[str], str]:
    """`limit` documents spread evenly over the demo corpus (all its files), or generated
    texts of about as many characters (GENERATED_PER_DOCUMENT short texts per document)."""
    if use_demo and DEMO_CORPUS.is_dir():
        texts = list(iter_texts_from(DEMO_CORPUS))
        return texts[::max(1, len(texts) // limit)][:limit], f"demo corpus ({DEMO_CORPUS})"
    return (multilingual_corpus(num_documents=limit * GENERATED_PER_DOCUMENT, seed=0),
            "generated multilingual text")


def tokenizer_dirs(texts: list[str], scratch: Path, use_demo: bool = True) -> dict[str, Path]:
    dirs = {}
    for kind, directory in DEMO_TOKENIZERS.items():
        if not (use_demo and directory.is_dir()):
            print(f"{directory} not used: training a {FALLBACK_VOCAB_SIZE}-token {kind} "
                  "tokenizer on the text")
            directory = scratch / kind
            build_tokenizer(kind, iter(texts), FALLBACK_VOCAB_SIZE, directory,
                            show_progress=False)
        dirs[kind] = directory
    return dirs


def best_seconds(paths: dict[str, Callable[[], list[list[int]]]], repeats: int
                 ) -> dict[str, tuple[float, list[list[int]]]]:
    """Fastest of `repeats` runs of each path, and its ids. The paths take turns within each
    repeat, so a burst of load from other processes hits them all alike."""
    results = {name: (float("inf"), encode()) for name, encode in paths.items()}  # warm-up
    for _ in range(repeats):
        for name, encode in paths.items():
            start = time.perf_counter()
            all_ids = encode()
            seconds = time.perf_counter() - start
            results[name] = (min(seconds, results[name][0]), all_ids)
    return results


def encode_paths(kind: str, directory: Path, texts: list[str]) -> dict[str, Callable]:
    """The same texts through the raw library (first entry = the reference) and our wrapper."""
    tok = load_tokenizer(directory)
    if kind == "hf":
        raw = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
        raw.encode_special_tokens = True  # special-token strings as text, as ours
        raw_paths = {  # the reference first: the very call our wrapper makes
            "raw Tokenizer.encode_batch_fast": lambda: [
                e.ids for e in raw.encode_batch_fast(texts, add_special_tokens=False)],
            "raw Tokenizer.encode_batch": lambda: [
                e.ids for e in raw.encode_batch(texts, add_special_tokens=False)],
        }
    else:
        model_file = str(directory / "sentencepiece.model")
        raw = sentencepiece.SentencePieceProcessor(model_file=model_file)
        raw_paths = {"raw SentencePieceProcessor.encode(list)": lambda: raw.encode(texts)}
    return {**raw_paths,
            "ours encode_batch(texts)": lambda: tok.encode_batch(texts),
            "ours tok(texts)['input_ids']": lambda: tok(texts)["input_ids"],
            "ours [encode(t) for t in texts]": lambda: [tok.encode(text) for text in texts]}


def documents_of_at_least(texts: list[str], chars: int) -> list[str]:
    """Consecutive texts joined by blank lines until each document has `chars` characters
    (the last one may be shorter); texts that long already stay alone."""
    documents, current = [], []
    for text in texts:
        current.append(text)
        if sum(map(len, current)) >= chars:
            documents.append("\n\n".join(current))
            current = []
    return documents + (["\n\n".join(current)] if current else [])


def end_to_end(kind: str, directory: Path, texts: list[str], scratch: Path, repeats: int
               ) -> tuple[float, float]:
    """(raw library tokens/s, pretokenize_pretrain_data tokens/s, EOS not counted) on `texts`,
    best of `repeats` runs taken in turns."""
    raw_encode = next(iter(encode_paths(kind, directory, texts).values()))
    (scratch / "raw").mkdir(parents=True)
    (scratch / "raw" / "part.jsonl").write_text("".join(
        json.dumps({"text": text}, ensure_ascii=False) + "\n" for text in texts), encoding="utf-8")
    raw_best = pipeline_best = float("inf")
    for run in range(repeats):
        start = time.perf_counter()
        tokens = sum(map(len, raw_encode()))
        raw_best = min(raw_best, time.perf_counter() - start)
        start = time.perf_counter()
        report = pretokenize_pretrain_data(scratch / "raw", directory, scratch / f"out{run}",
                                           num_workers=0)
        pipeline_best = min(pipeline_best, time.perf_counter() - start)
        assert report["num_tokens"] - report["num_documents"] == tokens, "tokens differ"
    return tokens / raw_best, tokens / pipeline_best


def main() -> None:
    parser = bench_parser(__doc__.split("\n")[0], quick="fewer documents and repeats",
                          smoke="seconds: tiny sizes, generated data; proves the bench runs")
    args = parser.parse_args()
    figures.start(args)
    limit, repeats = (1, 1) if args.smoke else (100, 5) if args.quick else (500, 7)
    texts, source = load_documents(limit, use_demo=not args.smoke)
    print(f"{len(texts)} documents, {sum(map(len, texts)) / 1e6:.2f} M characters, from {source}")
    with tempfile.TemporaryDirectory() as scratch:
        for kind, directory in tokenizer_dirs(texts, Path(scratch),
                                                           use_demo=not args.smoke).items():
            print(f"\n{kind}: {directory}")
            print(f"{'path':<42} {'tokens/s':>12} {'ratio':>7}")
            results = best_seconds(encode_paths(kind, directory, texts), repeats)
            (reference_name, (reference_seconds, reference_ids)), *ours = results.items()
            reference_rate = sum(map(len, reference_ids)) / reference_seconds
            for name, (seconds, all_ids) in results.items():
                rate = sum(map(len, all_ids)) / seconds
                same = "" if all_ids == reference_ids else "  (ids differ from raw!)"
                print(f"{name:<42} {rate:>12,.0f} {rate / reference_rate:>7.2f}{same}")
            for name, (seconds, all_ids) in ours:
                if not name.startswith("ours "):
                    continue  # another raw call, listed for comparison only
                target = ENCODE_BATCH_TARGETS[kind] if "encode_batch(texts)" in name else None
                figures.record(f"{kind}: {name.removeprefix('ours ')}",
                               sum(map(len, all_ids)) / seconds, reference_rate, "tokens/s",
                               reference_name, target=target)
            copies = 1 if args.smoke else max(1, round(END_TO_END_SECONDS / reference_seconds))
            documents = documents_of_at_least(texts * copies, END_TO_END_DOCUMENT_CHARS)
            raw_rate, pipeline_rate = end_to_end(kind, directory, documents,
                                                 Path(scratch) / f"e2e_{kind}", repeats)
            print(f"{'pretokenize end to end':<42} {pipeline_rate:>12,.0f} "
                  f"{pipeline_rate / raw_rate:>7.2f}  (raw {raw_rate:,.0f} on {copies}x the "
                  f"texts as {len(documents)} documents)")
            figures.record(f"{kind}: pretokenize end to end", pipeline_rate, raw_rate,
                           "tokens/s", reference_name, target=END_TO_END_TARGET)
    figures.finish()


if __name__ == "__main__":
    main()
