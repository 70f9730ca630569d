"""clean_report.json and clean_report.md: what went in, what came out, and why each dropped
document was dropped, with a few examples per rule so a reader can check the rule's judgement.

    {"documents_in": 1200, "documents_out": 1010, "bytes_in": ..., "bytes_out": ...,
     "dropped": {"too_few_words": 40, "exact_duplicate": 90, ...},
     "examples": {"too_few_words": [{"document": "a.jsonl:17", "value": 12}, ...],
                  "near_duplicate": [{"document": "b.jsonl:3", "value": "a.jsonl:9"}], ...},
     "rules": {"too_few_words": {"threshold": "< 50 (--min_doc_words)",
                                 "datatrove": "gopher_short_doc"}, ...},
     "minhash": {"bands": 14, "rows": 9, "s_curve_50pct": 0.714}, "settings": {...}}

A document id is `<file relative to --data_dir>:<line or record number>`.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from utils.atomic_io import atomic_write_json, atomic_write_text

EXAMPLES_PER_RULE = 3


@dataclass
class CleanReport:
    documents_in: int = 0
    documents_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    dropped: collections.Counter[str] = field(default_factory=collections.Counter)
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    skipped_bad_records: collections.Counter[str] = field(default_factory=collections.Counter)

    def drop(self, rule: str, document: str, value: Any) -> None:
        """Count one dropped document; keep it as an example if its rule has few so far."""
        self.dropped[rule] += 1
        shown = self.examples.setdefault(rule, [])
        if len(shown) < EXAMPLES_PER_RULE:
            shown.append({"document": document, "value": value})

    def summary_line(self) -> str:
        kept = self.documents_out / max(self.documents_in, 1)
        rules = ", ".join(f"{rule} {n}" for rule, n in self.dropped.most_common())
        return (f"cleaned {self.documents_in:,} documents -> {self.documents_out:,} kept "
                f"({kept:.1%}), {self.bytes_in:,} -> {self.bytes_out:,} bytes; "
                f"dropped: {rules or 'none'}")

    def as_dict(self, extra: dict[str, Any]) -> dict[str, Any]:
        return {"format": "z2all-clean-report", "version": 1,
                "documents_in": self.documents_in, "documents_out": self.documents_out,
                "bytes_in": self.bytes_in, "bytes_out": self.bytes_out,
                "dropped": dict(self.dropped.most_common()),
                "examples": {rule: self.examples[rule] for rule, _ in self.dropped.most_common()},
                "skipped_bad_records": dict(sorted(self.skipped_bad_records.items())), **extra}


def markdown(report: dict[str, Any], summary: str) -> str:
    """The same report as a page a person reads: totals, then one table row per rule, its
    threshold beside the values measured on its examples, and datatrove's name for it."""
    lines = ["# Cleaning report", "", summary, "",
             "| rule | dropped | threshold | examples (document: measured value) | datatrove |",
             "|---|---:|---|---|---|"]
    for rule, count in report["dropped"].items():
        shown = "; ".join(f"`{ex['document']}`: {ex['value']}" for ex in report["examples"][rule])
        details = report["rules"].get(rule, {})
        cells = [rule, str(count), details.get("threshold", ""), shown,
                 details.get("datatrove", "")]
        lines.append("| " + " | ".join(cell.replace("|", "/") for cell in cells) + " |")
    if minhash := report.get("minhash"):
        lines += ["", f"MinHash LSH: {minhash['bands']} bands x {minhash['rows']} rows; a pair "
                  f"of Jaccard {minhash['s_curve_50pct']} is caught half the time."]
    return "\n".join(lines) + "\n"


def write_reports(out_dir: Path, report: CleanReport, extra: dict[str, Any]) -> dict[str, Any]:
    as_dict = report.as_dict(extra)
    atomic_write_json(out_dir / "clean_report.json", as_dict)
    atomic_write_text(out_dir / "clean_report.md", markdown(as_dict, report.summary_line()))
    return as_dict
