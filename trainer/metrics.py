"""Where training numbers go: a one-line summary on stdout, `metrics.jsonl`, and the trackers.

`metrics.jsonl` is the run's source of truth (plots, reports and the supervisor read it): one
JSON object per line, appended and flushed as it happens, so a crash loses at most the line
being written (readers skip a torn last line). Every record has a `kind`:

    {"kind": "train", "step": 20, "loss": 5.91, "lr": 0.0006, "grad_norm": 1.3, ...}
    {"kind": "eval", "step": 100, "val_loss": 4.2, "val_ppl": 66.7, "val_bpb": 1.6, ...}
    {"kind": "resume", "step": 100, "checkpoint": "out/run/ckpt/step_000100"}

The trackers chosen with `--tracker` (TensorBoard by default, W&B; trainer/trackers.py) get every
record too, each numeric field as the scalar `<kind>/<field>` at the same step. Only rank 0
logs; other ranks get a logger that does nothing.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer.trackers import Trackers, scalar_values


class MetricsLogger:
    """`echo` prints the short lines (the progress bar's `write` on a terminal, so they land
    above the bar)."""

    def __init__(self, run_dir: str | Path, enabled: bool = True,
                 trackers: Trackers | None = None,
                 echo: Callable[[str], None] | None = None) -> None:
        self.enabled = enabled
        self.path = Path(run_dir) / "metrics.jsonl"
        self.trackers = trackers
        self.echo = echo or functools.partial(print, flush=True)
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - lives with us

    def log(self, kind: str, step: int, quiet: bool = False, **values: Any) -> None:
        """Append `{"kind", "step", "time", **values}`; print a short line unless quiet."""
        if not self.enabled:
            return
        record = {"kind": kind, "step": step, "time": round(time.time(), 3), **values}
        self._file.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
        self._file.flush()
        if self.trackers is not None:
            self.trackers.log(kind, step, values)
        if not quiet:
            shown = "  ".join(f"{k} {_short(v)}" for k, v in scalar_values(values).items())
            self.echo(f"[{kind}] step {step}  {shown}")

    def close(self) -> None:
        if self.enabled:
            self._file.close()
            if self.trackers is not None:
                self.trackers.close()


def _short(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if value == 0 or not math.isfinite(value):
        return str(value)
    return f"{value:.3e}" if abs(value) < 1e-3 or abs(value) >= 1e6 else f"{value:.4f}"


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """All records of a run's metrics.jsonl, skipping a line torn by a crash.

    Read as bytes: a crash can cut a multi-byte UTF-8 character (sample texts are logged with
    `ensure_ascii=False`) in half, and a text-mode read would then fail on the whole file.
    """
    records = []
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return records
    with open(path, "rb") as handle:
        for line in handle:
            try:
                record = json.loads(line)
            except ValueError:  # JSONDecodeError and UnicodeDecodeError
                continue
            if isinstance(record, dict):
                records.append(record)
    return records
