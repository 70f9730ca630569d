"""Where training numbers go: a one-line summary on stdout, `metrics.jsonl`, and TensorBoard.

`metrics.jsonl` is the run's source of truth (plots, reports and the supervisor read it): one
JSON object per line, appended and flushed as it happens, so a crash loses at most the line
being written (readers skip a torn last line). Every record has a `kind`:

    {"kind": "train", "step": 20, "loss": 5.91, "lr": 0.0006, "grad_norm": 1.3, ...}
    {"kind": "eval", "step": 100, "val_loss": 4.2, "val_ppl": 66.7, "val_bpb": 1.6, ...}
    {"kind": "resume", "step": 100, "checkpoint": "out/run/ckpt/step_000100"}

TensorBoard (optional: only if the `tensorboard` package is installed) gets every numeric
field as `<kind>/<field>`. Only rank 0 logs; other ranks get a logger that does nothing.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

try:
    from torch.utils.tensorboard import SummaryWriter
except ImportError:  # tensorboard is optional
    SummaryWriter = None


class MetricsLogger:
    def __init__(self, run_dir: str | Path, enabled: bool = True, tensorboard: bool = True):
        self.enabled = enabled
        self.path = Path(run_dir) / "metrics.jsonl"
        self._tb = None
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - lives with us
            if tensorboard and SummaryWriter is not None:
                self._tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))

    def log(self, kind: str, step: int, quiet: bool = False, **values: Any) -> None:
        """Append `{"kind", "step", "time", **values}`; print a short line unless quiet."""
        if not self.enabled:
            return
        record = {"kind": kind, "step": step, "time": round(time.time(), 3), **values}
        self._file.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
        self._file.flush()
        numbers = {k: v for k, v in values.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self._tb is not None:
            for key, value in numbers.items():
                self._tb.add_scalar(f"{kind}/{key}", value, step)
        if not quiet:
            shown = "  ".join(f"{k} {_short(v)}" for k, v in numbers.items())
            print(f"[{kind}] step {step}  {shown}", flush=True)

    def close(self) -> None:
        if self.enabled:
            self._file.close()
            if self._tb is not None:
                self._tb.close()


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
