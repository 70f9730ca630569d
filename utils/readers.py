"""Streaming readers for raw text data, one file at a time: `.jsonl`, `.json`, `.parquet`,
`.txt` and `.arrow` (the shards `datasets` writes).

Every tool that reads a user's raw data (tokenizer training, pretokenization, SFT/DPO
preprocessing, the trainer's stream, evaluation) goes through this file, so all of them accept
the same formats, stream in constant memory, and fail the same way on bad input. Which files a
data option names (a folder, a `datasets` folder's split, a Hub dataset) is utils/data_files.py.

Formats (docs/design.md §2.1):
    .jsonl    one JSON object per line; read in binary, line by line, each line decoded as strict
              UTF-8 on its own so an invalid byte is reported with its line number.
    .json     a top-level array of objects, streamed element by element with ijson.
    .parquet  read one record batch at a time (pyarrow), only the needed columns for texts.
    .txt      one document per line: line `n` becomes the record `{"text": line}` (and its text,
              whatever `text_key` names: the key only selects a field of .jsonl/.json/.parquet).
    .arrow    an Arrow IPC stream, as `datasets` writes its shards (save_to_disk folders, its
              cache): memory-mapped, one record batch at a time.

Numbering: `Record.number` is the 1-based line number for `.jsonl`/`.txt` and the 1-based
record index for `.json`/`.parquet`/`.arrow`.

Blank lines (only whitespace) in `.jsonl` and `.txt` are not records: they are skipped, are
not bad records, and are counted in `ReadStats.blank_lines` so a report can still show them.
An empty file yields nothing and is not an error.

Bad records raise `BadRecordError("<file>:<number>: <reason>: <detail>")`. With
`skip_bad_records=True` a bad record is skipped and counted in `ReadStats.skipped[reason]`
instead -- never silently. Reasons:
    invalid_utf8     the line/record is not valid UTF-8
    malformed_json   the line/record is not valid JSON
    truncated        the file ends in the middle of a record (e.g. last line cut off)
    not_object       valid JSON, but not an object ({...})
    missing_key      none of the requested text keys is present (or all are null)
    not_text         the text value is not a string
Errors after which the rest of a file cannot be located -- a syntax error inside a `.json`
array, a `.json` file that is not an array (`not_array`), a corrupt `.parquet` file
(`corrupt_parquet`), a corrupt `.arrow` shard (`corrupt_arrow`) -- are raised even in skip mode,
because skipping would silently drop every later record; their number is the first record that
could not be read. In `.jsonl` each line is independent, so every bad line can be skipped on its
own.

Example (a `.jsonl` file):
    line 1  {"text": "hello"}         -> Record(path, 1, {"text": "hello"})
    line 2                            -> blank: stats.blank_lines += 1
    line 3  {"text": 5}               -> iter_texts: BadRecordError(".. :3: not_text: ..")
    line 4  {"text": "cut of          -> no final newline: BadRecordError(".. :4: truncated: ..")
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import ijson
import pyarrow as pa
import pyarrow.parquet as pq

SUPPORTED_EXTENSIONS = (".jsonl", ".json", ".parquet", ".txt", ".arrow")
PARQUET_BATCH_ROWS = 1024  # rows per record batch: bounds memory, amortises pyarrow's overhead
UTF8_BOM = b"\xef\xbb\xbf"  # some editors start UTF-8 files with it; it is not part of the data


class BadRecordError(ValueError):
    """A record that cannot be used, located by file and 1-based line/record number."""

    def __init__(self, path: Path, number: int, reason: str, detail: str) -> None:
        super().__init__(f"{path}:{number}: {reason}: {detail}")
        self.path = Path(path)
        self.number = number
        self.reason = reason
        self.detail = detail


class Record(NamedTuple):
    path: Path
    number: int  # 1-based line (.jsonl/.txt) or record index (.json/.parquet)
    data: dict[str, Any]


@dataclass
class ReadStats:
    """Counters filled while reading; pass the same object to several calls to sum them."""

    records_read: int = 0  # good records yielded
    skipped: collections.Counter[str] = field(default_factory=collections.Counter)  # by reason
    blank_lines: int = 0  # whitespace-only lines of .jsonl/.txt (not records, not errors)
    bytes_read: int = 0  # of .jsonl/.txt files, for progress bars (others count 0)


# ---------------------------------------------------------------------------------------------
# Raw readers: one per format. Each yields a Record for a good record and a BadRecordError
# *object* for a bad one, so the skip-or-raise policy lives in one place (`_apply_policy`).
# Fatal errors (the rest of the file is unreadable) are raised right here.
# ---------------------------------------------------------------------------------------------

RawItem = Record | BadRecordError
LineParser = Callable[[Path, int, str], RawItem]  # (path, line number, line) -> item


def _read_lines(path: Path, stats: ReadStats, parse_line: LineParser) -> Iterator[RawItem]:
    """Decode each non-blank line of a line-based file and hand it to `parse_line`."""
    with open(path, "rb") as handle:  # binary: lines of any length, decoded one at a time
        for number, raw in enumerate(handle, start=1):
            stats.bytes_read += len(raw)
            if number == 1 and raw.startswith(UTF8_BOM):
                raw = raw[len(UTF8_BOM):]
            if not raw.strip():
                stats.blank_lines += 1
                continue
            try:
                line = raw.decode("utf-8")  # strict: a bad byte is an error, never U+FFFD
            except UnicodeDecodeError as error:
                # A last line (no newline) cut inside a multi-byte character was truncated.
                cut_off = not raw.endswith(b"\n") and error.reason == "unexpected end of data"
                detail = f"byte {error.start} of the line: {error.reason}"
                yield BadRecordError(path, number, "truncated" if cut_off else "invalid_utf8",
                                     detail)
                continue
            yield parse_line(path, number, line)


def _parse_json_line(path: Path, number: int, line: str) -> RawItem:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as error:
        # Only the last line of a file can lack its newline: invalid JSON there means the
        # writer was cut off mid-record, which deserves its own name.
        reason = "malformed_json" if line.endswith("\n") else "truncated"
        # Some messages end in "at" ("Invalid control character at"): say it once.
        message = error.msg.removesuffix(" at")
        return BadRecordError(path, number, reason, f"{message} at column {error.colno}")
    if not isinstance(data, dict):
        return BadRecordError(path, number, "not_object", f"got JSON {type(data).__name__}")
    return Record(path, number, data)


def _parse_text_line(path: Path, number: int, line: str) -> RawItem:
    return Record(path, number, {"text": line.removesuffix("\n").removesuffix("\r")})


def _first_non_space_byte(handle: Any) -> bytes:
    """Peek at the first meaningful byte of a file (b"" if there is none), then rewind."""
    while (byte := handle.read(1)) and (byte.isspace() or byte in UTF8_BOM):
        pass
    handle.seek(0)
    return byte


def _ijson_reason(error: Exception, handle: Any) -> str:
    """Name a parse error. A file whose array is never closed was cut off, wherever the parser
    noticed it (the cut may fall inside a string, a number or a multi-byte character)."""
    handle.seek(0, 2)
    handle.seek(max(0, handle.tell() - 64))
    if not handle.read().rstrip().endswith(b"]"):
        return "truncated"
    return "invalid_utf8" if "UTF8" in str(error) else "malformed_json"


def _read_json_array(path: Path) -> Iterator[RawItem]:
    with open(path, "rb") as handle:
        first = _first_non_space_byte(handle)
        if not first:
            return  # empty file: nothing to read, not an error
        if first != b"[":
            raise BadRecordError(path, 1, "not_array", "a .json file must hold one array [...]")
        if handle.read(len(UTF8_BOM)) != UTF8_BOM:
            handle.seek(0)
        number = 0
        try:
            # use_float: numbers come back as float like json.loads, not decimal.Decimal.
            for number, data in enumerate(ijson.items(handle, "item", use_float=True), start=1):
                if not isinstance(data, dict):
                    yield BadRecordError(path, number, "not_object", f"got {type(data).__name__}")
                else:
                    yield Record(path, number, data)
        except ijson.JSONError as error:
            detail = str(error).splitlines()[0] + " (the rest of the file cannot be read)"
            raise BadRecordError(path, number + 1, _ijson_reason(error, handle), detail) from error


def _read_batches(path: Path, columns: list[str] | None, reason: str) -> Iterator[RawItem]:
    """The records of a `.parquet` file or an `.arrow` shard, one record batch at a time, only
    the `columns` present (none present: all, so each record reports the missing key)."""
    number = 0  # records yielded so far; a failure is located at the next one
    try:
        if reason == "corrupt_parquet":
            parquet_file = pq.ParquetFile(path)
            names = parquet_file.schema_arrow.names
            present = [name for name in columns or [] if name in names] or None
            batches = parquet_file.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=present)
        else:
            batches = pa.ipc.open_stream(pa.memory_map(str(path)))
            present = [name for name in columns or [] if name in batches.schema.names] or None
        for batch in batches:
            for data in (batch.select(present) if present else batch).to_pylist():
                number += 1
                yield Record(path, number, data)
    except (pa.ArrowException, OSError) as error:
        raise BadRecordError(path, number + 1, reason, str(error)) from error


def _raw_items(path: Path, stats: ReadStats, columns: list[str] | None) -> Iterator[RawItem]:
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _read_lines(path, stats, _parse_json_line)
    if suffix == ".json":
        return _read_json_array(path)
    if suffix in (".parquet", ".arrow"):
        return _read_batches(path, columns, f"corrupt_{suffix[1:]}")
    if suffix == ".txt":
        return _read_lines(path, stats, _parse_text_line)
    raise ValueError(f"{path}: unsupported file type; expected one of {SUPPORTED_EXTENSIONS}")


def _apply_policy(error: BadRecordError, skip_bad_records: bool, stats: ReadStats) -> None:
    """The one place that decides: raise the error, or count it and move on."""
    if not skip_bad_records:
        raise error
    stats.skipped[error.reason] += 1


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------


def iter_records(
    path: str | Path, *, skip_bad_records: bool = False, stats: ReadStats | None = None
) -> Iterator[Record]:
    """Every good record of one file, in file order, in constant memory."""
    path, stats = Path(path), stats if stats is not None else ReadStats()
    for item in _raw_items(path, stats, columns=None):
        if isinstance(item, BadRecordError):
            _apply_policy(item, skip_bad_records, stats)
            continue
        stats.records_read += 1
        yield item


def text_of(record: Record, keys: Sequence[str]) -> str | BadRecordError:
    """The value of the first key present (and not null); it must be a string."""
    for key in keys:
        value = record.data.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            detail = f"key {key!r} holds {type(value).__name__}, expected a string"
            return BadRecordError(record.path, record.number, "not_text", detail)
        return value
    detail = f"none of the keys {list(keys)} found; record has {sorted(record.data)[:8]}"
    return BadRecordError(record.path, record.number, "missing_key", detail)


def iter_raw_items(path: str | Path, stats: ReadStats | None = None) -> Iterator[RawItem]:
    """Every record of one file in order: a good one as a Record, a bad one as a BadRecordError
    *object*, not raised. For a caller that owns only some records (a stream worker takes
    every n-th record of a shard) and so decides itself which bad records concern it."""
    return _raw_items(Path(path), stats if stats is not None else ReadStats(), columns=None)


def iter_texts(
    path: str | Path,
    text_key: str | Sequence[str] = "text",
    *,
    skip_bad_records: bool = False,
    stats: ReadStats | None = None,
) -> Iterator[str]:
    """The text of every record of one file; `text_key` may list several keys tried in order."""
    keys = [text_key] if isinstance(text_key, str) else list(text_key or [])
    if not keys or not all(isinstance(key, str) for key in keys):
        raise TypeError(f"text_key must be a key or a non-empty list of keys; got {text_key!r}")
    path, stats = Path(path), stats if stats is not None else ReadStats()
    if path.suffix.lower() == ".txt":
        keys = ["text"]  # a .txt line is its own text, whatever key the record files use
    for item in _raw_items(path, stats, columns=keys):
        text = item if isinstance(item, BadRecordError) else text_of(item, keys)
        if isinstance(text, BadRecordError):
            _apply_policy(text, skip_bad_records, stats)
            continue
        stats.records_read += 1
        yield text
