"""utils.readers against independent references (json.loads per line, json.load, pyarrow's
read_table), on freshly generated random data; bad input must name file, line and reason."""

from __future__ import annotations

import collections
import json
import random
import tracemalloc
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from utils.data_files import find_data_files, iter_texts_from
from utils.readers import BadRecordError, ReadStats, iter_records, iter_texts

# Characters that stress a reader: multi-byte UTF-8, JSON escapes, line separators inside strings.
ALPHABET = "abcdefghij KLMNOP 0123 中文字符测试 日本語 ü é ß 😀🚀 \" \\ \n \t \u2028 / {}[]"


def random_text(rng: random.Random, max_len: int = 120) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, max_len)))


def random_record(rng: random.Random) -> dict:
    record = {"text": random_text(rng), "id": rng.randint(-10**9, 10**9)}
    if rng.random() < 0.3:
        record["meta"] = {"score": rng.random(), "tags": [random_text(rng, 5) for _ in range(3)]}
    return record


def reference_jsonl(path: Path) -> list[tuple[int, dict]]:
    """The spec, read the simple way: split on newlines, json.loads every non-blank line."""
    lines = path.read_bytes().split(b"\n")
    return [(n, json.loads(line)) for n, line in enumerate(lines, 1) if line.strip()]


def test_jsonl_large_file_matches_reference(tmp_path):
    rng = random.Random()
    path = tmp_path / "big.jsonl"
    blank_lines = 0
    with open(path, "w", encoding="utf-8") as handle:
        for index in range(20_000):
            if rng.random() < 0.05:
                handle.write(rng.choice(["\n", "   \n", "\t\r\n"]))
                blank_lines += 1
            record = random_record(rng)
            if index == 7_777:  # one line far longer than any read buffer (0.3-2 MB)
                record["text"] = (random_text(rng, 20) + "長") * 100_000
            handle.write(json.dumps(record, ensure_ascii=rng.random() < 0.5) + "\n")
    assert path.stat().st_size > 3_000_000
    expected = reference_jsonl(path)

    stats = ReadStats()
    records = list(iter_records(path, stats=stats))
    assert [(r.number, r.data) for r in records] == expected
    assert all(r.path == path for r in records)
    assert stats.records_read == len(expected) and stats.blank_lines == blank_lines
    assert not stats.skipped
    assert list(iter_texts(path)) == [data["text"] for _, data in expected]


# Each bad line kind: (bytes of the line without newline, reason, needs text key to fail).
BAD_LINES = {
    "invalid_utf8": b'{"text": "caf\xc3 ok"}',
    "malformed_json": b'{"text": "unclosed}',
    "not_object": b'["text", "in a list"]',
    "missing_key": b'{"content": "wrong key"}',
    "not_text": b'{"text": 12345}',
}


def write_mixed_jsonl(path: Path, rng: random.Random, truncate_last: bool):
    """Good and bad lines at random; returns good (number, text) and bad (number, reason)."""
    good, bad, lines = [], [], []
    for number in range(1, 401):
        if rng.random() < 0.2:
            reason = rng.choice(sorted(BAD_LINES))
            lines.append(BAD_LINES[reason])
            bad.append((number, reason))
        else:
            record = random_record(rng)
            lines.append(json.dumps(record, ensure_ascii=False).encode())
            good.append((number, record["text"]))
    data = b"\n".join(lines) + b"\n"
    if truncate_last:  # the writer died mid-record: no newline, half a JSON object
        data += b'{"text": "cut o'
        bad.append((len(lines) + 1, "truncated"))
    path.write_bytes(data)
    return good, bad


@pytest.mark.parametrize("truncate_last", [False, True])
def test_jsonl_bad_lines_raise_or_are_counted_exactly(tmp_path, truncate_last):
    rng = random.Random()
    path = tmp_path / "mixed.jsonl"
    good, bad = write_mixed_jsonl(path, rng, truncate_last)

    stats = ReadStats()
    texts = list(iter_texts(path, skip_bad_records=True, stats=stats))
    assert texts == [text for _, text in good]
    assert stats.skipped == collections.Counter(reason for _, reason in bad)
    assert stats.records_read == len(good)

    first_number, first_reason = bad[0]
    with pytest.raises(BadRecordError) as caught:
        list(iter_texts(path))
    error = caught.value
    assert (error.path, error.number, error.reason) == (path, first_number, first_reason)
    assert str(error).startswith(f"{path}:{first_number}: {first_reason}: ")


def test_truncated_multibyte_character_and_valid_last_line_without_newline(tmp_path):
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(b'{"text": "a"}\n{"text": "\xe4\xb8')  # cut inside the 3 bytes of a CJK char
    with pytest.raises(BadRecordError, match=r"cut.jsonl:2: truncated"):
        list(iter_records(cut))
    complete = tmp_path / "no_final_newline.jsonl"
    complete.write_bytes(b'{"text": "a"}\n{"text": "b"}')  # fine: the last object is whole
    assert list(iter_texts(complete)) == ["a", "b"]


def test_text_key_list_is_tried_in_order(tmp_path):
    rng = random.Random()
    records = [{k: random_text(rng) for k in rng.sample(["content", "text"], rng.randint(1, 2))}
               for _ in range(200)]
    path = tmp_path / "keys.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    expected = [r["content"] if "content" in r else r["text"] for r in records]
    assert list(iter_texts(path, ["content", "text"])) == expected
    for bad_key in (None, [], [1]):
        with pytest.raises(TypeError, match="text_key"):
            list(iter_texts(path, bad_key))


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet", ".txt"])
def test_empty_file_yields_nothing(tmp_path, suffix):
    path = tmp_path / f"empty{suffix}"
    if suffix == ".parquet":
        pq.write_table(pa.table({"text": pa.array([], pa.string())}), path)
    else:
        path.write_bytes(b"")
    assert list(iter_records(path)) == [] and list(iter_texts(path)) == []


def test_txt_one_document_per_line(tmp_path):
    rng = random.Random()
    lines = [random_text(rng).replace("\n", " ").replace("\u2028", " ") or "x" for _ in range(500)]
    raw = "".join(line + rng.choice(["\n", "\r\n"]) + rng.choice(["", "\n", "  \n"])
                  for line in lines)
    path = tmp_path / "docs.txt"
    path.write_bytes(raw.encode())
    stats = ReadStats()
    texts = list(iter_texts(path, stats=stats))
    assert texts == [line for line in lines if line.strip()]  # whitespace-only lines are blank
    reference_blank = sum(1 for line in raw.encode().split(b"\n")[:-1] if not line.strip())
    assert stats.blank_lines == reference_blank


def test_json_array_streams_and_matches_json_load(tmp_path):
    rng = random.Random()
    records = [random_record(rng) for _ in range(3000)]
    path = tmp_path / "array.json"
    path.write_text(json.dumps(records, indent=rng.choice([None, 2]), ensure_ascii=False))
    expected = json.loads(path.read_text(encoding="utf-8"))
    assert [(r.number, r.data) for r in iter_records(path)] == list(enumerate(expected, 1))

    # Cut the file inside record k (0-based): records 1..k are whole, record k+1 is not.
    pieces = [json.dumps(r).encode() for r in records]
    k = rng.randrange(len(records) // 4, len(records) * 3 // 4)
    cut = tmp_path / "cut.json"
    cut.write_bytes(b"[" + b", ".join(pieces[:k + 1])[: -len(pieces[k]) // 2])
    with pytest.raises(BadRecordError) as caught:  # raised even in skip mode: rest is lost
        list(iter_records(cut, skip_bad_records=True))
    assert (caught.value.reason, caught.value.number) == ("truncated", k + 1)


def test_json_bad_elements_and_wrong_top_level(tmp_path):
    path = tmp_path / "mixed.json"
    path.write_text('[{"text": "a"}, 7, {"text": "b"}, {"body": "c"}]')
    stats = ReadStats()
    assert list(iter_texts(path, skip_bad_records=True, stats=stats)) == ["a", "b"]
    assert stats.skipped == collections.Counter({"not_object": 1, "missing_key": 1})
    with pytest.raises(BadRecordError, match=r"mixed.json:2: not_object"):
        list(iter_texts(path))
    not_array = tmp_path / "object.json"
    not_array.write_text('{"text": "a"}')
    with pytest.raises(BadRecordError, match="not_array"):
        list(iter_records(not_array))
    bad_utf8 = tmp_path / "bad_utf8.json"
    bad_utf8.write_bytes(b'[{"text": "a"}, {"text": "\xff"}]')
    with pytest.raises(BadRecordError, match=r"bad_utf8.json:2: invalid_utf8"):
        list(iter_records(bad_utf8))


def write_parquet(path: Path, rng: random.Random, num_rows: int) -> None:
    texts = [random_text(rng) if rng.random() > 0.1 else None for _ in range(num_rows)]
    table = pa.table({
        "id": list(range(num_rows)),
        "title": [random_text(rng, 10) for _ in range(num_rows)],
        "text": texts,
    })
    pq.write_table(table, path, row_group_size=rng.randint(300, 900))  # several row groups


def test_parquet_row_groups_match_read_table(tmp_path):
    rng = random.Random()
    path = tmp_path / "data.parquet"
    write_parquet(path, rng, num_rows=5000)
    assert pq.ParquetFile(path).metadata.num_row_groups > 3
    expected = pq.read_table(path).to_pylist()
    assert [(r.number, r.data) for r in iter_records(path)] == list(enumerate(expected, 1))
    # Null text falls back to the next key; a missing column counts like a missing key.
    assert list(iter_texts(path, ["text", "title"])) == [
        row["text"] if row["text"] is not None else row["title"] for row in expected]
    stats = ReadStats()
    texts = list(iter_texts(path, "text", skip_bad_records=True, stats=stats))
    assert texts == [row["text"] for row in expected if row["text"] is not None]
    assert stats.skipped == {"missing_key": sum(row["text"] is None for row in expected)}


def test_corrupt_parquet_names_file_and_position(tmp_path):
    rng = random.Random()
    path = tmp_path / "data.parquet"
    write_parquet(path, rng, num_rows=5000)
    expected = pq.read_table(path).to_pylist()
    data = path.read_bytes()

    truncated = tmp_path / "truncated.parquet"
    truncated.write_bytes(data[: rng.randint(100, len(data) - 100)])
    with pytest.raises(BadRecordError, match=r"truncated.parquet:1: corrupt_parquet"):
        list(iter_records(truncated, skip_bad_records=True))

    # Destroy the page header of one middle row group: the rows before it still come out.
    metadata = pq.ParquetFile(path).metadata
    group = metadata.num_row_groups // 2
    offset = metadata.row_group(group).column(0).data_page_offset
    broken = bytearray(data)
    broken[offset: offset + 64] = b"\xff" * 64
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(bytes(broken))
    yielded = []
    with pytest.raises(BadRecordError) as caught:
        yielded.extend(record.data for record in iter_records(corrupt))
    first_row_of_group = sum(metadata.row_group(g).num_rows for g in range(group))
    assert caught.value.reason == "corrupt_parquet" and caught.value.path == corrupt
    assert caught.value.number == len(yielded) + 1 and len(yielded) <= first_row_of_group
    assert yielded == expected[: len(yielded)]


def _peak_bytes_reading(path) -> tuple[int, int]:
    """(records read, peak traced bytes while reading them all)."""
    tracemalloc.start()
    count = sum(1 for _ in iter_texts(path))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return count, peak


def test_reading_uses_constant_memory(tmp_path):
    """Reading 10x the records must not take 10x the memory. tracemalloc also counts what
    other threads allocate meanwhile (a test run has a few), so the peaks are compared with
    each other and with the file size, not with an exact figure."""
    rng = random.Random()
    records = [random_record(rng) for _ in range(2000)]
    for name, write in (("jsonl", lambda path, rows: path.write_text(
                            "".join(json.dumps(r) + "\n" for r in rows))),
                        ("json", lambda path, rows: path.write_text(json.dumps(rows)))):
        small, big = tmp_path / f"small.{name}", tmp_path / f"big.{name}"
        write(small, records)
        write(big, records * 10)  # ~3-4 MB
        small_count, small_peak = _peak_bytes_reading(small)
        big_count, big_peak = _peak_bytes_reading(big)
        assert (small_count, big_count) == (2_000, 20_000)
        assert big_peak < 2 * small_peak, f"{name}: peak {small_peak} -> {big_peak} bytes"
        assert big_peak < big.stat().st_size / 5, f"{big.name}: peak {big_peak} bytes"


def test_find_data_files_recursive_sorted_and_filtered(tmp_path):
    for name in ["b/2.jsonl", "b/1.txt", "a.json", "c/d/e.parquet", "notes.md", ".hidden.jsonl",
                 ".tmp/x.jsonl", "b/.part.jsonl.tmp"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    found = find_data_files(tmp_path)
    assert found == sorted(tmp_path / n for n in ["a.json", "b/1.txt", "b/2.jsonl",
                                                   "c/d/e.parquet"])
    assert find_data_files([tmp_path / "b", tmp_path / "a.json", tmp_path / "b/1.txt"]) == [
        tmp_path / "a.json", tmp_path / "b/1.txt", tmp_path / "b/2.jsonl"]
    assert find_data_files(tmp_path, extensions=(".txt",)) == [tmp_path / "b/1.txt"]
    with pytest.raises(FileNotFoundError):
        find_data_files(tmp_path / "missing")
    with pytest.raises(ValueError, match="unsupported"):
        find_data_files(tmp_path / "notes.md")


def test_iter_texts_from_chains_files_and_shares_stats(tmp_path):
    rng = random.Random()
    expected = []
    for index in range(3):
        texts = [random_text(rng).replace("\n", " ").replace("\u2028", " ") or "y"
                 for _ in range(50)]
        (tmp_path / f"part{index}.txt").write_text("\n".join(texts) + "\n")
        expected += [t for t in texts if t.strip()]
    (tmp_path / "part3.jsonl").write_text('{"text": "z"}\n{"text": 1}\n')
    stats = ReadStats()
    assert list(iter_texts_from(tmp_path, skip_bad_records=True, stats=stats)) == expected + ["z"]
    assert stats.records_read == len(expected) + 1 and stats.skipped == {"not_text": 1}
    # Another key for the record files leaves the .txt lines as they are.
    (tmp_path / "part3.jsonl").write_text('{"content": "z"}\n{"text": "not this"}\n')
    assert list(iter_texts_from(tmp_path, ["content"], skip_bad_records=True)) == expected + ["z"]
