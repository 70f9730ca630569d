"""Figures a program can read: with `--json`, a bench prints exactly one JSON object on stdout.

Every bench calls `start(args)` once its options are parsed, `record(...)` for each figure (a
named ratio: ours, the reference's, both in the same unit, measured side by side in one run) and
`finish()` at the end. Without --json nothing changes: the human report goes to stdout. With
--json, file descriptor 1 points at stderr from `start` to `finish` (so prints, warnings, and
the output of worker processes all land there), and `finish` writes the object to the real
stdout. `python -m bench.table` turns these objects into docs/benchmarks.md.

The object, for `python -m bench.bench_tokenizer --quick --json`:

    {"bench": "bench_tokenizer", "mode": "quick",
     "figures": [{"name": "sp: encode_batch", "unit": "tokens/s",
                  "ours": 1650000.0, "reference": 1700000.0,
                  "reference_name": "raw SentencePieceProcessor.encode(list)",
                  "higher_is_better": true, "ratio": 0.97, "target": 0.95}, ...],
     "notes": []}

`ratio` is always "how many times better ours is": ours / reference for rates, reference / ours
for times and memory (`higher_is_better` false), so > 1 means ours wins. `notes` says why
figures are missing (a reference library not installed, no GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

_active: dict[str, Any] | None = None  # the report of this process's bench, between start/finish
_real_stdout_fd: int | None = None


def mode_of(args: argparse.Namespace) -> str:
    """"smoke", "quick" or "full": which size flag the bench ran with."""
    return "smoke" if args.smoke else "quick" if args.quick else "full"


def start(args: argparse.Namespace, bench: str | None = None) -> None:
    """Begin the report of this run; with `args.json`, send fd 1 to stderr until `finish`."""
    global _active, _real_stdout_fd
    bench = bench or os.path.basename(sys.argv[0]).removesuffix(".py")
    _active = {"bench": bench, "mode": mode_of(args), "figures": [], "notes": []}
    if args.json:
        sys.stdout.flush()
        _real_stdout_fd = os.dup(1)
        os.dup2(2, 1)  # inherited by worker processes and C libraries, unlike sys.stdout


def record(name: str, ours: float, reference: float, unit: str, reference_name: str,
           higher_is_better: bool = True, target: float | None = None) -> None:
    """One figure: ours and the reference's, side by side, in `unit`. `target`: the ratio it
    should reach (ours / reference for rates, reference / ours when lower is better)."""
    if _active is None:
        raise RuntimeError("bench.figures.record called before bench.figures.start")
    ratio = ours / reference if higher_is_better else reference / ours
    _active["figures"].append({
        "name": name, "unit": unit, "ours": float(ours), "reference": float(reference),
        "reference_name": reference_name, "higher_is_better": higher_is_better,
        "ratio": round(ratio, 4), "target": target})


def note(text: str) -> None:
    """Why a figure is missing (a reference library absent, no device), for the table."""
    if _active is not None:
        _active["notes"].append(text)


def finish() -> dict[str, Any]:
    """Print the report as one JSON object on the real stdout (with --json); return it."""
    global _real_stdout_fd
    if _active is None:
        raise RuntimeError("bench.figures.finish called before bench.figures.start")
    if _real_stdout_fd is not None:
        sys.stdout.flush()
        os.dup2(_real_stdout_fd, 1)
        os.close(_real_stdout_fd)
        _real_stdout_fd = None
        print(json.dumps(_active), flush=True)
    return _active
