"""Plot a run's metrics.jsonl as PNGs: loss, learning rate, throughput, grad norm, DPO rewards.

    python -m tools.resplot out/run1                       # -> out/run1/plots/*.png
    python -m tools.resplot out/run1 out/run2 --out cmp/   # runs overlaid, labelled by name
    python -m tools.resplot out/run1 --watch 60            # re-plot every 60 s; Ctrl-C stops

What is drawn (a figure only when some run has its numbers, e.g. no DPO figure for pretraining):

    loss.png             train loss (solid) and validation loss (dashed) vs step
    loss_vs_tokens.png   the same vs tokens seen (eval points placed by their step's tokens)
    lr.png, tokens_per_sec.png, grad_norm.png (log scale: spikes stand out)
    dpo_rewards.png      rewards/chosen, rewards/rejected, rewards/margins, rewards/accuracies
                         (train, and validation's val_rewards/* when evaluated)

Each `{"kind": "resume"}` record is a dotted vertical line in its run's colour. Steps that a
crash made the run repeat are logged twice; the later value (what the resumed run did) wins,
so a curve never zig-zags back. A line torn by a crash (the last one, or one that a resumed
run appended to) is skipped and counted, never fatal. PNGs are written atomically (temp file
+ rename), so a viewer refreshing during --watch never sees half an image.
"""

from __future__ import annotations

import io
import json
import math
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from utils.atomic_io import atomic_write_bytes
from utils.cli_errors import run_main
from utils.option_parser import OptionParser


@dataclass(frozen=True)
class Curve:
    kind: str            # which records: "train" or "eval"
    key: str             # which field of them
    label: str           # legend text after the run's name
    linestyle: str = "-"


@dataclass(frozen=True)
class Panel:
    title: str
    curves: tuple[Curve, ...]
    x: str = "step"      # or "tokens"
    log_y: bool = False


TRAIN_LOSS = Curve("train", "loss", "train")
VALID_LOSS = Curve("eval", "val_loss", "valid", "--")
DPO_REWARDS = ("chosen", "rejected", "margins", "accuracies")

FIGURES: dict[str, tuple[Panel, ...]] = {
    "loss.png": (Panel("loss", (TRAIN_LOSS, VALID_LOSS)),),
    "loss_vs_tokens.png": (Panel("loss vs tokens seen", (TRAIN_LOSS, VALID_LOSS), x="tokens"),),
    "lr.png": (Panel("learning rate", (Curve("train", "lr", "lr"),)),),
    "tokens_per_sec.png": (Panel("throughput (tokens/s, all ranks)",
                                 (Curve("train", "tokens_per_sec", "tokens/s"),)),),
    "grad_norm.png": (Panel("gradient norm",
                            (Curve("train", "grad_norm", "grad norm"),), log_y=True),),
    "dpo_rewards.png": tuple(Panel(f"rewards/{name}", (Curve("train", f"rewards/{name}", "train"),
                                                       Curve("eval", f"val_rewards/{name}",
                                                             "valid", "--")))
                             for name in DPO_REWARDS),
}


# ---- reading -----------------------------------------------------------------------------------

@dataclass
class RunMetrics:
    name: str
    records: dict[str, list[dict]] = field(default_factory=dict)  # kind -> records, file order
    skipped_lines: list[int] = field(default_factory=list)        # 1-based numbers of bad lines

    @property
    def resume_steps(self) -> list[int]:
        return [record["step"] for record in self.records.get("resume", [])
                if is_number(record.get("step"))]


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def read_run(run_dir: Path, name: str) -> RunMetrics:
    """The records of `<run_dir>/metrics.jsonl` by kind; torn lines skipped and counted."""
    run = RunMetrics(name)
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return run
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            try:
                record = json.loads(line)
            except ValueError:  # also UnicodeDecodeError: a crash can cut a character in half
                run.skipped_lines.append(number)
                continue
            if isinstance(record, dict) and is_number(record.get("step")):
                run.records.setdefault(record.get("kind"), []).append(record)
            else:
                run.skipped_lines.append(number)
    return run


def run_names(run_dirs: list[Path]) -> list[str]:
    """Short labels: the dir names, or the full paths when two runs share a name."""
    names = [run_dir.resolve().name for run_dir in run_dirs]
    return names if len(set(names)) == len(names) else [str(run_dir) for run_dir in run_dirs]


# ---- turning records into curves --------------------------------------------------------------

def step_series(records: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) sorted by step; a step logged again after a resume keeps its last value."""
    by_step = {record["step"]: record[key] for record in records if is_number(record.get(key))}
    steps = np.array(sorted(by_step), dtype=float)
    return steps, np.array([by_step[step] for step in sorted(by_step)], dtype=float)


def steps_to_tokens(run: RunMetrics, steps: np.ndarray) -> np.ndarray | None:
    """Tokens seen at each step, interpolated between logged train steps (None: not logged)."""
    logged_steps, tokens = step_series(run.records.get("train", []), "tokens")
    if len(logged_steps) == 0:
        return None
    return np.interp(steps, logged_steps, tokens)


def curve_data(run: RunMetrics, curve: Curve, x: str) -> tuple[np.ndarray, np.ndarray] | None:
    steps, values = step_series(run.records.get(curve.kind, []), curve.key)
    if len(steps) == 0:
        return None
    if x == "step":
        return steps, values
    tokens = steps_to_tokens(run, steps)
    return None if tokens is None else (tokens, values)


# ---- drawing -----------------------------------------------------------------------------------

def draw_panel(axes, panel: Panel, runs: list[RunMetrics]) -> bool:
    """Draw one panel for all runs; False if no run had anything for it."""
    drawn = False
    for index, run in enumerate(runs):
        color = f"C{index % 10}"
        run_drawn = False
        for curve in panel.curves:
            data = curve_data(run, curve, panel.x)
            if data is None:
                continue
            marker = "o" if len(data[0]) < 30 or curve.kind == "eval" else None
            axes.plot(*data, color=color, linestyle=curve.linestyle, marker=marker,
                      markersize=3, linewidth=1.2, label=f"{run.name} {curve.label}")
            run_drawn = drawn = True
        if run_drawn and run.resume_steps:
            resumes = np.array(run.resume_steps, dtype=float)
            positions = resumes if panel.x == "step" else steps_to_tokens(run, resumes)
            for position_index, position in enumerate(positions if positions is not None else []):
                axes.axvline(position, color=color, linestyle=":", linewidth=1,
                             label=f"{run.name} resumed" if position_index == 0 else None)
    if drawn:
        axes.set_title(panel.title)
        axes.set_xlabel("step" if panel.x == "step" else "tokens seen")
        if panel.log_y:
            axes.set_yscale("log")
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize=8)
    return drawn


def render_figure(panels: tuple[Panel, ...], runs: list[RunMetrics]) -> bytes | None:
    """The PNG bytes of one figure, or None when none of its panels has data."""
    columns = 2 if len(panels) > 1 else 1
    rows = math.ceil(len(panels) / columns)
    figure = Figure(figsize=(6 * columns + 2 * (columns == 1), 4 * rows), layout="constrained")
    FigureCanvasAgg(figure)  # headless: render with Agg whatever backend pyplot would pick
    axes_list = figure.subplots(rows, columns, squeeze=False).ravel()
    drawn = [draw_panel(axes, panel, runs) for axes, panel in zip(axes_list, panels)]
    if not any(drawn):
        return None
    for axes, has_data in zip(axes_list, drawn + [False] * len(axes_list)):
        axes.set_visible(has_data)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def plot_runs(run_dirs: list[Path], out_dir: Path) -> list[Path]:
    """Write every figure that has data for these runs into `out_dir`; return the paths."""
    runs = [read_run(run_dir, name) for run_dir, name in zip(run_dirs, run_names(run_dirs))]
    for run_dir, run in zip(run_dirs, runs):
        if not run.records:
            print(f"{run_dir / 'metrics.jsonl'}: no metrics yet")
        if run.skipped_lines:
            print(f"{run_dir / 'metrics.jsonl'}: skipped {len(run.skipped_lines)} unreadable "
                  f"line(s) (torn by a crash?): line {run.skipped_lines[0]} ...")
    written = []
    for filename, panels in FIGURES.items():
        png = render_figure(panels, runs)
        if png is not None:
            atomic_write_bytes(out_dir / filename, png)
            written.append(out_dir / filename)
    return written


def metrics_signature(run_dirs: list[Path]) -> list[tuple[int, int] | None]:
    """(mtime, size) of each metrics file: --watch re-plots only when one changed."""
    signature = []
    for run_dir in run_dirs:
        path = run_dir / "metrics.jsonl"
        stat = path.stat() if path.exists() else None
        signature.append((stat.st_mtime_ns, stat.st_size) if stat else None)
    return signature


def main(argv: list[str] | None = None) -> int:
    parser = OptionParser(prog="python -m tools.resplot",
                                     description="Plot the metrics.jsonl of one or more runs.")
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (out/<run>)")
    parser.add_argument("--out", type=Path, default=None,
                        help="where to write the PNGs (default: <run>/plots; needed for 2+ runs)")
    parser.add_argument("--watch", type=float, nargs="?", const=30.0, default=None,
                        metavar="SECONDS", help="re-plot every SECONDS (default 30) until Ctrl-C")
    args = parser.parse_args(argv)
    if args.out is None and len(args.runs) > 1:
        parser.error("comparing several runs: say where the plots go with --out DIR")
    missing = [str(run_dir) for run_dir in args.runs if not run_dir.is_dir()]
    if missing:  # a typo, not a run that has yet to log: "no metrics yet" would mislead
        raise ValueError(f"run directory does not exist: {', '.join(missing)} "
                         f"(pass the run's --out_dir, e.g. out/<run>)")
    out_dir = args.out or args.runs[0] / "plots"

    stop = threading.Event()  # Ctrl-C sets it: a SIGINT inside matplotlib's C code would
    # surface as a bogus ValueError ("Invalid bounding box"), so a plot is always finished first
    if args.watch is not None:
        signal.signal(signal.SIGINT, lambda signum, frame: stop.set())
    last_signature = None
    while not stop.is_set():
        signature = metrics_signature(args.runs)
        if signature != last_signature:
            last_signature = signature
            written = plot_runs(args.runs, out_dir)
            for path in written:
                print(path)
            if not written and args.watch is None:
                print("nothing to plot: no metrics found")
                return 1
        if args.watch is None:
            return 0
        stop.wait(args.watch)
    print("stopped watching")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
