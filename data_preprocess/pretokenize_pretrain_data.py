"""Raw text -> Megatron `.bin`/`.idx` token files, one pair per input file (docs/design.md §2.3).

    python -m data_preprocess.pretokenize_pretrain_data --data_dir data/demo/pretrain \\
        --tokenizer_dir tokenizer/demo_hf --out_dir data/demo/pretok_hf --num_workers 2

Each document is its text encoded exactly as given (not stripped, no BOS) followed by
`<|endoftext|>`, so the model learns where documents end and the packed stream needs no other
separator. Empty or whitespace-only texts are skipped and counted as `empty`.

Who does what: the main process reads records (utils/readers) and writes the output; N worker
processes, each holding one tokenizer loaded once, turn batches of texts into token arrays
with the tokenizer's fast `encode_batch`. Workers return one flat numpy array per batch (cheap
to send between processes, unlike lists of ints). See data_preprocess/pipeline.py for how
order, skipping of finished files and crash safety work.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from data_preprocess import file_jobs, pipeline
from data_preprocess.indexed_dataset import IndexedDatasetWriter
from data_preprocess.tokenizer_workers import worker_state
from utils.cli_errors import run_main
from utils.option_parser import OptionParser
from utils.readers import ReadStats, iter_texts

DEFAULT_BATCH_SIZE = 512  # texts per task: large enough to amortise inter-process transfer


def encode_documents(texts: list[str]) -> tuple[np.ndarray, list[int]]:
    """In a worker: texts -> (their ids, each followed by EOS, as one flat array; lengths)."""
    tokenizer = worker_state()["tokenizer"]
    eos = tokenizer.eos_token_id  # a lookup by name in transformers: once, not per document
    flat: list[int] = []
    lengths = []
    for ids in tokenizer.encode_batch(texts):
        flat.extend(ids)
        flat.append(eos)
        lengths.append(len(ids) + 1)
    return np.array(flat, dtype=worker_state()["dtype"]), lengths


def non_empty_texts(job: file_jobs.FileJob, stats: ReadStats, counts: pipeline.FileCounts, *,
                    text_key: Sequence[str], skip_bad_records: bool) -> Iterator[str]:
    """Main process: the file's texts in order; empty/whitespace-only ones counted, not sent."""
    for text in iter_texts(job.source, text_key, skip_bad_records=skip_bad_records, stats=stats):
        if text.strip():
            yield text
        else:
            counts.skipped["empty"] += 1


def write_documents(job: file_jobs.FileJob, writers: list[IndexedDatasetWriter],
                    encoded: tuple[np.ndarray, list[int]], counts: pipeline.FileCounts) -> None:
    """Main process: one encoded batch -> the file's .bin, one document per text."""
    tokens, lengths = encoded
    writers[0].add_tokens(tokens, lengths)
    writers[0].end_documents(1)
    counts.num_documents += len(lengths)
    counts.num_tokens += tokens.size


def pretokenize_pretrain_data(data_dir: str | Path, tokenizer_dir: str | Path,
                              out_dir: str | Path | None = None,
                              text_key: Sequence[str] = ("text",),
                              num_workers: int = file_jobs.DEFAULT_WORKERS,
                              skip_bad_records: bool = False,
                              batch_size: int = DEFAULT_BATCH_SIZE,
                              num_tasks: int | None = None,
                              task_index: int | None = None) -> dict[str, Any]:
    """Tokenize every data file under `data_dir` (this array task's share of them: pipeline.py)
    into `out_dir`; return the run's report."""
    share = pipeline.check_options(num_workers, batch_size, None, num_tasks, task_index)
    dtype, settings = pipeline.tokenizer_settings("z2all-pretok", tokenizer_dir)
    settings["text_key"] = list(text_key)
    task = pipeline.PretokenizeTask(
        kind="pretrain", settings=settings, outputs=(("", dtype),),
        read=functools.partial(non_empty_texts, text_key=text_key,
                               skip_bad_records=skip_bad_records),
        work=encode_documents, write=write_documents)
    return pipeline.run_pretokenize(task, data_dir, out_dir, tokenizer_dir, num_workers,
                                    batch_size, {"dtype": np.dtype(dtype).name}, share)


def main(argv: list[str] | None = None) -> None:
    parser = OptionParser(description=__doc__.split("\n\n")[0])
    pipeline.add_common_arguments(parser, ".jsonl/.json/.parquet/.txt files", DEFAULT_BATCH_SIZE,
                                  "texts")
    parser.add_argument("--text_key", nargs="+", default=["text"],
                        help="record key(s) holding the text, tried in order")
    args = parser.parse_args(argv)
    pretokenize_pretrain_data(args.data_dir, args.tokenizer_dir, args.out_dir, args.text_key,
                              args.num_workers, args.skip_bad_records, args.batch_size,
                              args.num_tasks, args.task_index)


if __name__ == "__main__":
    sys.exit(run_main(main))
