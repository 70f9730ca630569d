"""`python -m bench.table` renders the benches' JSON objects into docs/benchmarks.md between its
markers (the page's own text kept), and refuses in one line a page without markers or a folder
without saved objects. (That every bench prints such an object: tests/test_bench_smoke.py.)"""

from __future__ import annotations

import json

import pytest

from bench import table
from utils.cli_errors import run_main

REPORTS = [
    {"bench": "bench_tokenizer", "mode": "quick", "notes": [], "figures": [
        {"name": "sp: encode_batch(texts)", "unit": "tokens/s", "ours": 1_650_000.0,
         "reference": 1_700_000.0, "reference_name": "raw SentencePieceProcessor.encode(list)",
         "higher_is_better": True, "ratio": 0.9706, "target": 0.95},
        {"name": "sp: pretokenize end to end", "unit": "tokens/s", "ours": 1_000_000.0,
         "reference": 1_700_000.0, "reference_name": "raw SentencePieceProcessor.encode(list)",
         "higher_is_better": True, "ratio": 0.5882, "target": 0.9}]},
    {"bench": "bench_zero", "mode": "quick", "notes": [], "figures": [
        {"name": "ZeRO-1: peak memory", "unit": "bytes", "ours": 3 * 2**20,
         "reference": 6 * 2**20, "reference_name": "ZeRO-0", "higher_is_better": False,
         "ratio": 2.0, "target": None}]},
    {"bench": "bench_gpu", "mode": "quick", "figures": [],
     "notes": ["skipped: no CUDA device visible"]},
]
PAGE = f"# Benchmarks\n\nOur words.\n\n{table.BEGIN}\nstale table\n{table.END}\n\nAfter.\n"


@pytest.mark.parametrize("expected_row", [
    "| sp: encode_batch(texts) | 1,650,000 tokens/s | 1,700,000 tokens/s (raw "
    "SentencePieceProcessor.encode(list)) | 0.97x | ≥ 0.95 met |",
    "| sp: pretokenize end to end | 1,000,000 tokens/s | 1,700,000 tokens/s (raw "
    "SentencePieceProcessor.encode(list)) | 0.59x | ≥ 0.90 **not met** |",
    "| ZeRO-1: peak memory | 3 MiB | 6 MiB (ZeRO-0) | 2.00x |  |",
    "### bench_gpu\n\n- skipped: no CUDA device visible",
    "Measured 2026-11-29 on Test CPU, 2 cores (size mode: quick).",
])
def test_render_shows_every_figure(expected_row):
    assert expected_row in table.render(REPORTS, "Test CPU, 2 cores", "2026-11-29")


def test_the_page_is_regenerated_between_its_markers(tmp_path):
    saved, page = tmp_path / "saved", tmp_path / "benchmarks.md"
    saved.mkdir()
    for report in REPORTS:
        (saved / f"{report['bench']}.json").write_text(json.dumps(report))
    page.write_text(PAGE)
    for _ in range(2):  # a second run replaces the first table, it does not add another
        assert run_main(table.main, ["--from", str(saved), "--out", str(page)]) == 0
        text = page.read_text()
        assert text.startswith("# Benchmarks\n\nOur words.\n\n") and text.endswith("\nAfter.\n")
        assert "stale table" not in text and text.count("### bench_zero") == 1
        assert "| ZeRO-1: peak memory | 3 MiB |" in text


@pytest.mark.parametrize("case, expected", [
    ("no markers", "lacks the markers"),
    ("no saved objects", "no .json files there"),
    ("a broken object", "bench_x.json: not one JSON object"),
])
def test_bad_input_is_refused_in_one_line(tmp_path, capsys, case, expected):
    saved, page = tmp_path / "saved", tmp_path / "benchmarks.md"
    saved.mkdir()
    page.write_text("# no markers\n" if case == "no markers" else PAGE)
    if case != "no saved objects":
        (saved / "bench_x.json").write_text("{" if case == "a broken object" else "{}")
    capsys.readouterr()
    assert run_main(table.main, ["--from", str(saved), "--out", str(page)]) == 2
    error = capsys.readouterr().err
    assert expected in error and error.count("\n") == 1, error
    assert page.read_text() == ("# no markers\n" if case == "no markers" else PAGE)
