"""SFT and DPO records -> ChatML token ids + loss masks, as two aligned `.bin`/`.idx` pairs.

Shared by `pretokenize_sft_data`, `pretokenize_dpo_data` and the datasets' online cache
(dataset/build.py), so offline and online preparation produce the same bytes.

For each input file `<prefix>` (mirrored under the output dir, docs/design.md §2.3):
    <prefix>.bin/.idx        token ids (uint16 or int32), one sequence per rendered conversation
    <prefix>.mask.bin/.idx   uint8 loss mask, the same lengths: 1 = train on predicting this token
    <prefix>.json            sidecar {"format": "z2all-sft" | "z2all-dpo", ...}
SFT: one document = one sequence (the conversation). DPO: one document = two sequences,
(prompt + chosen, prompt + rejected), so document d of the ids file is pair d.

Truncation policy (max_seq_len L): a rendered sequence longer than L keeps its first L tokens
(the system prompt and the start of the conversation are never cut; the end is) and is counted
as truncated. A sample left with no trained token (a prompt that fills L by itself) is dropped
and counted as `too_long`. DPO truncates chosen and rejected independently and drops the pair
if either side loses its whole reply.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from data_preprocess import file_jobs, pipeline
from data_preprocess.chat_records import RecordFormatError, dpo_messages, sft_messages
from data_preprocess.indexed_dataset import IndexedDatasetWriter
from data_preprocess.tokenizer_workers import worker_state
from utils.conversation import render_conversations
from utils.option_parser import OptionParser
from utils.readers import BadRecordError, ReadStats, iter_records
from utils.tokenizer_protocol import Tokenizer

KINDS = {"sft": 1, "dpo": 2}  # sequences per document (sample)
MASK_SUFFIX = ".mask"
DEFAULT_BATCH_SIZE = 256  # records per worker task


class EncodedChats(NamedTuple):
    tokens: np.ndarray  # all kept sequences back to back
    mask: np.ndarray  # uint8, aligned with tokens
    lengths: list[int]  # one per kept sequence
    bad: list[tuple[int, str, str]]  # (record number, reason, detail) of malformed records
    too_long: int  # samples dropped because truncation left nothing to train on
    truncated: int  # samples kept but cut to max_seq_len


def conversations_of(kind: str, data: dict[str, Any]) -> list[list[dict[str, str]]]:
    """The conversation(s) one record renders to: [messages] for SFT, [chosen, rejected] for DPO."""
    if kind == "sft":
        return [sft_messages(data)]
    prompt, chosen, rejected = dpo_messages(data)
    return [prompt + chosen, prompt + rejected]


class RenderedSample(NamedTuple):
    """One sample's sequences as (ids, loss_mask) cut to max_seq_len; None when a cut one has
    no trained token left (`too_long`)."""

    sequences: list[tuple[list[int], list[int]]] | None
    truncated: bool  # a sequence was longer than max_seq_len


def render_samples(samples: list[list[list[dict[str, str]]]], tokenizer: Tokenizer,
                   system_prompt: str | None, max_seq_len: int) -> list[RenderedSample]:
    """Each sample's conversations (`conversations_of`) rendered, all in one batched encode,
    and cut by the truncation policy above. The pretokenizer's workers and the streaming
    dataset (dataset/stream_samples.py) both call it, so both paths agree."""
    rendered = iter(render_conversations(
        tokenizer, [messages for conversations in samples for messages in conversations],
        system_prompt))
    fitted = []
    for conversations in samples:
        sequences = [next(rendered) for _ in conversations]
        cut = [(ids[:max_seq_len], loss_mask[:max_seq_len]) for ids, loss_mask in sequences]
        trains = all(any(loss_mask[1:]) for _, loss_mask in cut)  # position 0 is never a target
        fitted.append(RenderedSample(cut if trains else None,
                                     any(len(ids) > max_seq_len for ids, _ in sequences)))
    return fitted


def encode_chat_records(records: list[tuple[int, dict[str, Any]]]) -> EncodedChats:
    """In a worker: (record number, record) pairs -> rendered, truncated ids and masks."""
    state = worker_state()
    samples, bad = [], []
    for number, data in records:
        try:
            samples.append(conversations_of(state["kind"], data))
        except RecordFormatError as error:
            bad.append((number, error.reason, error.detail))
    tokens: list[int] = []
    mask: list[int] = []
    lengths, too_long, truncated = [], 0, 0
    for sample in render_samples(samples, state["tokenizer"], state["system_prompt"],
                                 state["max_seq_len"]):
        if sample.sequences is None:
            too_long += 1
            continue
        truncated += sample.truncated
        for ids, loss_mask in sample.sequences:
            tokens += ids
            mask += loss_mask
            lengths.append(len(ids))
    return EncodedChats(np.array(tokens, dtype=state["dtype"]),
                        np.array(mask, dtype=np.uint8), lengths, bad, too_long, truncated)


def numbered_records(job: file_jobs.FileJob, stats: ReadStats, counts: pipeline.FileCounts, *,
                     skip_bad_records: bool) -> Iterator[tuple[int, dict[str, Any]]]:
    for record in iter_records(job.source, skip_bad_records=skip_bad_records, stats=stats):
        yield record.number, record.data


def write_chats(job: file_jobs.FileJob, writers: list[IndexedDatasetWriter],
                encoded: EncodedChats, counts: pipeline.FileCounts, *, kind: str,
                skip_bad_records: bool) -> None:
    """Main process: raise on (or count) malformed records, append the rest to both pairs."""
    if encoded.bad and not skip_bad_records:
        raise BadRecordError(job.source, *encoded.bad[0])
    for _, reason, _ in encoded.bad:
        counts.skipped[reason] += 1
    if encoded.too_long:
        counts.skipped["too_long"] += encoded.too_long
    ids_writer, mask_writer = writers
    ids_writer.add_tokens(encoded.tokens, encoded.lengths)
    mask_writer.add_tokens(encoded.mask, encoded.lengths)
    ids_writer.end_documents(KINDS[kind])
    mask_writer.end_documents(KINDS[kind])
    counts.num_documents += len(encoded.lengths) // KINDS[kind]
    counts.num_tokens += encoded.tokens.size
    counts.num_truncated += encoded.truncated


def pretokenize_chat_data(kind: str, data_dir: str | Path, tokenizer_dir: str | Path,
                          max_seq_len: int, out_dir: str | Path | None = None,
                          system_prompt: str | None = None,
                          num_workers: int = file_jobs.DEFAULT_WORKERS,
                          skip_bad_records: bool = False,
                          batch_size: int = DEFAULT_BATCH_SIZE,
                          num_tasks: int | None = None,
                          task_index: int | None = None) -> dict[str, Any]:
    """Render every SFT/DPO file under data_dir (this array task's share of them: pipeline.py)
    into out_dir; return the run's report."""
    share = pipeline.check_options(num_workers, batch_size, max_seq_len, num_tasks, task_index)
    dtype, settings = pipeline.tokenizer_settings(f"z2all-{kind}", tokenizer_dir)
    settings.update(max_seq_len=max_seq_len, system_prompt=system_prompt)
    task = pipeline.PretokenizeTask(
        kind=kind, settings=settings, outputs=(("", dtype), (MASK_SUFFIX, np.uint8)),
        read=functools.partial(numbered_records, skip_bad_records=skip_bad_records),
        work=encode_chat_records,
        write=functools.partial(write_chats, kind=kind, skip_bad_records=skip_bad_records),
        not_bad_reasons=("too_long",))
    worker_settings = {"kind": kind, "max_seq_len": max_seq_len, "system_prompt": system_prompt,
                       "dtype": np.dtype(dtype).name}
    return pipeline.run_pretokenize(task, data_dir, out_dir, tokenizer_dir, num_workers,
                                    batch_size, worker_settings, share)


def main(kind: str, argv: list[str] | None = None) -> None:
    parser = OptionParser(
        description=f"{kind.upper()} records -> ChatML ids + loss masks (.bin/.idx pairs)")
    pipeline.add_common_arguments(parser, f"{kind} .jsonl/.json/.parquet files",
                                  DEFAULT_BATCH_SIZE, "records")
    parser.add_argument("--max_seq_len", type=int, required=True,
                        help="longer samples are cut to this many tokens (see the docstring)")
    parser.add_argument("--system_prompt", default=None,
                        help="system message added to conversations that have none")
    args = parser.parse_args(argv)
    pretokenize_chat_data(kind, args.data_dir, args.tokenizer_dir, args.max_seq_len,
                          args.out_dir, args.system_prompt, args.num_workers,
                          args.skip_bad_records, args.batch_size, args.num_tasks,
                          args.task_index)
