"""docs/design.md's options table is what the option dataclasses say (regenerate with
`python -m tools.options_table --write`)."""

from __future__ import annotations

import dataclasses

import pytest

from tools.options_table import DESIGN_DOC, END, START, options_table, with_table
from trainer.options import GROUPS, OPTION_TYPES


def test_committed_table_matches_the_code():
    document = DESIGN_DOC.read_text(encoding="utf-8")
    assert with_table(document, options_table()) == document, (
        "docs/design.md's options table is stale: run python -m tools.options_table --write")


def test_table_has_one_row_per_option_and_the_count():
    table = options_table()
    for name in OPTION_TYPES:
        assert f"| `{name}`" in table, name
    rows = [line for line in table.splitlines() if line.startswith("| ") and "`" in line]
    assert len(rows) == len(OPTION_TYPES) == sum(len(dataclasses.fields(c))
                                                 for c in GROUPS.values())
    assert table.startswith(f"{len(OPTION_TYPES)} options in {len(GROUPS)} groups")


def test_a_changed_default_makes_the_check_fail(monkeypatch):
    document = DESIGN_DOC.read_text(encoding="utf-8")
    spec = next(f for f in dataclasses.fields(GROUPS["optimization"]) if f.name == "min_lr")
    monkeypatch.setattr(spec, "default", 1.25e-5)
    assert with_table(document, options_table()) != document


def test_missing_markers_are_named():
    with pytest.raises(ValueError, match="markers"):
        with_table("no table here", "x")
    assert START in DESIGN_DOC.read_text() and END in DESIGN_DOC.read_text()
