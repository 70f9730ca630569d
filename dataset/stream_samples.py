"""Raw records of one shard -> training samples, each with the position right after it.

Pretraining packs exactly like the offline path (data_preprocess/pretokenize_pretrain_data.py
+ build_pretrain_sample_index_map.py): each non-empty text is encoded as given and followed by
EOS; the documents of one shard form one token stream; windows of L+1 tokens start every L
tokens; the last < L+1 tokens of a shard are left over (windows never cross shards).

The position after a window is where the *next* window starts: (record number of the document
holding that token, offset of the token in the document). That is all a resume needs: re-read
the shard from that record, re-encode it, drop `offset` tokens, and pack on. Worked example,
L = 4, documents of 3, 6 and 2 tokens (a, b, c; EOS included):

    stream   a0 a1 a2 b0 b1 b2 b3 b4 b5 c0 c1
    window 0 a0 a1 a2 b0 b1             -> next starts at b1: position (record of b, 1)
    window 1             b1 b2 b3 b4 b5 -> next starts at b5: position (record of b, 5)
    (b5 c0 c1 are 3 < L+1 tokens: left over at the end of the shard)

SFT and DPO: one record is one sample, rendered with the chat template (utils/conversation.py)
and cut like data_preprocess/pretokenize_chat.py; the position after it is the next record.

Bad records: an error naming shard and line, or with skip_bad_records a count by reason in
`skipped` (which travels in the position, so a resume neither loses nor repeats a count).
Records that are fine but not trained on as they are get counted there too, always, as the
pretokenizers count them (`POLICY_COUNTS`): empty or whitespace-only texts, SFT/DPO samples
dropped because nothing trained would survive the cut to seq_len, and samples cut to fit.
"""

from __future__ import annotations

import collections
from collections.abc import Generator, Iterator
from typing import Any, NamedTuple

import numpy as np

from data_preprocess.chat_records import RecordFormatError
from data_preprocess.pretokenize_chat import conversations_of, render_samples
from dataset.dataset_sft import chat_item
from utils.readers import BadRecordError, Record, text_of
from utils.tokenizer_protocol import Tokenizer

# Reasons in `skipped` that are policy, not bad input, and the metric each is reported as.
# ("truncated" is taken: readers use it for a file cut mid-record.)
POLICY_COUNTS = {"empty": "empty_records_skipped", "too_long": "too_long_records_dropped",
                 "cut_to_fit": "long_records_truncated"}
ENCODE_BATCH = 64  # texts per encode_batch call: amortises the tokenizer's per-call overhead


class Position(NamedTuple):
    record: int  # 1-based number of the record where the next sample starts (0: shard start)
    offset: int  # tokens of that record already used (pretraining; 0 for SFT/DPO)
    skipped: dict[str, int]  # records skipped (or cut) so far by this worker, by reason


# (sample, position after it) ..., then, returned at the end of the shard, its final counts
ShardSamples = Generator[tuple[dict[str, np.ndarray], Position], None, dict[str, int]]


class Document(NamedTuple):
    number: int
    ids: np.ndarray  # the text's ids followed by EOS
    skipped: dict[str, int]  # records counted before this one was read


def reject(error: BadRecordError, skip_bad_records: bool,
           skipped: collections.Counter[str]) -> None:
    """Raise a bad record (its message names shard and line), or count it by reason."""
    if not skip_bad_records:
        raise error
    skipped[error.reason] += 1


def good_records(items: Iterator[Record | BadRecordError], skip_bad_records: bool,
                 skipped: collections.Counter[str]) -> Iterator[Record]:
    for item in items:
        if isinstance(item, BadRecordError):
            reject(item, skip_bad_records, skipped)
        else:
            yield item


def shard_documents(records: Iterator[Record], text_keys: list[str], tokenizer: Tokenizer,
                    skip_bad_records: bool, skipped: collections.Counter[str]
                    ) -> Iterator[Document]:
    """Encoded documents in record order; empty/whitespace-only texts are skipped and
    counted as `empty` (as offline)."""
    pending: list[tuple[int, str, dict[str, int]]] = []

    def encode_pending() -> Iterator[Document]:
        ids_of = tokenizer.encode_batch([text for _, text, _ in pending])
        for (number, _, counted), ids in zip(pending, ids_of):
            yield Document(number, np.array([*ids, tokenizer.eos_token_id], dtype=np.int64),
                           counted)
        pending.clear()

    for record in records:
        text = text_of(record, text_keys)
        if isinstance(text, BadRecordError):
            reject(text, skip_bad_records, skipped)
            continue
        if text.strip():
            pending.append((record.number, text, dict(skipped)))
        else:
            skipped["empty"] += 1
        if len(pending) == ENCODE_BATCH:
            yield from encode_pending()
    yield from encode_pending()


def pack_windows(documents: Iterator[Document], seq_len: int, start: Position
                 ) -> Iterator[tuple[np.ndarray, Position]]:
    """Windows of seq_len+1 tokens every seq_len tokens, and the position after each."""
    pieces: collections.deque[list[Any]] = collections.deque()  # [document, first unused token]
    available = 0
    for document in documents:
        offset = start.offset if document.number == start.record else 0
        pieces.append([document, offset])
        available += len(document.ids) - offset
        while available >= seq_len + 1:
            window = np.empty(seq_len + 1, dtype=np.int64)
            filled = 0
            for piece_document, piece_offset in pieces:  # gather the first seq_len+1 tokens
                take = min(seq_len + 1 - filled, len(piece_document.ids) - piece_offset)
                window[filled: filled + take] = piece_document.ids[piece_offset:
                                                                    piece_offset + take]
                filled += take
                if filled == seq_len + 1:
                    break
            to_drop = seq_len  # advance by the stride: the last token is the next one's first
            while to_drop:
                piece = pieces[0]
                drop = min(to_drop, len(piece[0].ids) - piece[1])
                piece[1] += drop
                to_drop -= drop
                if piece[1] == len(piece[0].ids):
                    pieces.popleft()
            available -= seq_len
            head_document, head_offset = pieces[0]
            yield window, Position(head_document.number, head_offset, head_document.skipped)


def pretrain_samples(records: Iterator[Record | BadRecordError], start: Position, *,
                     tokenizer: Tokenizer, seq_len: int, text_keys: list[str],
                     skip_bad_records: bool) -> ShardSamples:
    """Items shaped like PretokDatasetWithIndex's: input = first L tokens, labels = last L.
    (numpy, not torch: DataLoader sends torch tensors through one shared-memory file each.)"""
    skipped = collections.Counter(start.skipped)
    documents = shard_documents(good_records(records, skip_bad_records, skipped), text_keys,
                                tokenizer, skip_bad_records, skipped)
    for window, position in pack_windows(documents, seq_len, start):
        yield {"input_ids": window[:-1], "labels": window[1:]}, position
    return dict(skipped)  # the whole shard's counts, its records after the last window included


def chat_samples(records: Iterator[Record | BadRecordError], start: Position, *, kind: str,
                 tokenizer: Tokenizer, seq_len: int, system_prompt: str | None,
                 skip_bad_records: bool) -> ShardSamples:
    """SFT/DPO items shaped like SupervisedDataset's / DPODataset's; `too_long` ones dropped."""
    skipped = collections.Counter(start.skipped)
    for record in good_records(records, skip_bad_records, skipped):
        try:
            conversations = conversations_of(kind, record.data)
        except RecordFormatError as error:
            reject(BadRecordError(record.path, record.number, error.reason, error.detail),
                   skip_bad_records, skipped)
            continue
        sample = render_samples([conversations], tokenizer, system_prompt, seq_len)[0]
        if sample.sequences is None:
            skipped["too_long"] += 1
            continue
        if sample.truncated:
            skipped["cut_to_fit"] += 1
        sides = [{key: tensor.numpy() for key, tensor in
                  chat_item(np.array(ids), np.array(mask)).items()}
                 for ids, mask in sample.sequences]
        item = sides[0] if kind == "sft" else {
            f"{side}_{key}": value for side, sequence in zip(("chosen", "rejected"), sides)
            for key, value in sequence.items()}
        yield item, Position(record.number + 1, 0, dict(skipped))
    return dict(skipped)  # the whole shard's counts, its records after the last sample included
