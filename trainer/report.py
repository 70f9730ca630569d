"""`out/<run>/report.md`: the run's report card, written at the end of every invocation.

It answers what a reader of a finished run asks first: which code (git commit), on what
(environment, data and tokenizer identity), with which settings (only those that differ from
the defaults), how fast (tokens/s, MFU), what happened (resumes), how well (final metrics and
sample generations), and where the plots are. Everything comes from the run dir's files plus
what the trainer passes in, so it is rewritten, never appended.
"""

from __future__ import annotations

import json
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

from dataset.stream_samples import POLICY_COUNTS
from trainer.metrics import read_metrics
from trainer.options import TrainingOptions
from utils.atomic_io import atomic_write_text
from utils.run_ownership import EVALUATIONS_MARKER

STREAM_COUNT_METRICS = (*POLICY_COUNTS.values(), "bad_records_skipped")


def git_commit() -> str:
    """`<hash>` (+ ` (dirty)` with uncommitted changes), or `unknown` outside a git checkout."""
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                                text=True, check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=here, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + (" (dirty)" if dirty.strip() else "")


def data_identity(data_dir: str) -> list[str]:
    """One line per data sidecar (sample index / pretokenized file) found under `data_dir`."""
    lines = []
    for sidecar in sorted(Path(data_dir).rglob("*.json"))[:20]:
        try:
            info = json.loads(sidecar.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(info, dict) and str(info.get("format", "")).startswith("z2all"):
            keys = ("format", "split", "num_samples", "num_documents", "num_tokens", "tokenizer",
                    "num_truncated", "skipped")  # skipped: bad records, counted by reason
            lines.append(f"`{sidecar}`: " + ", ".join(f"{k}={info[k]}" for k in keys if k in info))
    return lines or [f"`{data_dir}`"]


def _table(values: dict[str, Any]) -> list[str]:
    rows = ["| name | value |", "|---|---|"]
    rows += [f"| {key} | {_fmt(value)} |" for key, value in values.items()]
    return rows


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|")


def write_report(run_dir: Path, options: TrainingOptions, environment: dict[str, Any],
                 throughput: dict[str, Any], tokenizer_fingerprint: str) -> Path:
    records = read_metrics(run_dir)
    last = {kind: next((r for r in reversed(records) if r["kind"] == kind), None)
            for kind in ("train", "eval", "samples")}
    resumes = [r for r in records if r["kind"] == "resume"]
    lines = [f"# Run report: {run_dir.name}", "",
             f"- code: git commit {git_commit()}",
             f"- task: {options.data.task_type}; steps: "
             f"{last['train']['step'] if last['train'] else 0}"
             f" of max_iters {options.optimization.max_iters}",
             f"- environment: python {platform.python_version()}, torch {torch.__version__}, "
             + ", ".join(f"{k} {v}" for k, v in environment.items()),
             f"- tokenizer: `{options.data.tokenizer_dir}` (fingerprint {tokenizer_fingerprint})",
             "", "## Data", ""]
    lines += [f"- {line}" for line in data_identity(options.data.data_dir)]
    stream_counts = {key: value for key, value in (last["train"] or {}).items()
                     if key in STREAM_COUNT_METRICS}
    if stream_counts:  # streamed records dropped or cut, as the pretokenizer's sidecars say
        lines += [f"- streamed records not trained on as they are (to step "
                  f"{last['train']['step']}, all ranks): "
                  + ", ".join(f"{key}={value}" for key, value in stream_counts.items())]
    lines += ["", "## Config (differences from the defaults)", ""]
    lines += _table(options.diff_from_defaults()) + ["", "## Throughput", ""]
    lines += _table({k: v for k, v in throughput.items() if v}) + ["", "## Resume events", ""]
    lines += [f"- step {r['step']} from `{r['checkpoint']}`" for r in resumes] or ["- none"]
    lines += ["", "## Final metrics", ""]
    for kind in ("train", "eval"):
        if last[kind]:
            shown = {k: v for k, v in last[kind].items() if k not in ("kind", "time")}
            lines += [f"**{kind}** (step {shown.pop('step')})", ""] + _table(shown) + [""]
    lines += ["## Sample generations", ""]
    for sample in (last["samples"] or {}).get("samples", []):
        lines += [f"- `{sample['prompt']}` → `{sample['completion']}`"]
    plots = sorted((run_dir / "plots").glob("*.png"))
    lines += ["", "## Plots", "", f"Make or refresh them with `python -m tools.resplot {run_dir}`."]
    lines += [f"- [{p.name}](plots/{p.name})" for p in plots]
    path = run_dir / "report.md"
    old = path.read_text(encoding="utf-8") if path.is_file() else ""
    kept = old[old.index(EVALUATIONS_MARKER):] if EVALUATIONS_MARKER in old else ""
    atomic_write_text(path, "\n".join(lines) + "\n" + (f"\n{kept}" if kept else ""))
    return path
