"""`python -m bench.table`: the benchmark table in docs/benchmarks.md, generated from the benches'
own JSON figures, so it cannot drift from what they measure.

    python -m bench.table [--quick | --smoke] [--save DIR]   # run every bench with --json
    python -m bench.table --from DIR                         # or read saved objects (*.json)

1. Get one JSON object per bench (bench/figures.py): run `python -m bench.<name> --json` and the
   size flag for each bench_*.py (and each mode in EXTRA_MODES), one after another so they do
   not compete for the cores, or read the objects saved in --from (one file per bench).
2. Render them as markdown: per bench, one row per figure (ours, the reference's, the ratio,
   the target), and the notes (a reference not installed, no GPU).
3. Replace what sits between the two markers in --out (docs/benchmarks.md) with it, above it
   the date, the machine (lscpu's model name, the core count) and the mode; the text around the
   markers is the page's own and is kept. The file is written atomically.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from utils.atomic_io import atomic_write_bytes
from utils.cli_errors import run_main
from utils.option_parser import OptionParser

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "docs" / "benchmarks.md"
BEGIN, END = "<!-- bench-table:begin (python -m bench.table) -->", "<!-- bench-table:end -->"
# Modes of a bench that its plain run does not reach: {report name: (module, extra flags)}.
EXTRA_MODES = {"bench_parallel --context": ("bench_parallel", ["--context"])}


def bench_commands() -> dict[str, tuple[str, list[str]]]:
    """{report name: (module, flags)} for every bench_*.py, then the EXTRA_MODES."""
    benches = sorted(path.stem for path in (REPO / "bench").glob("bench_*.py"))
    return {**{name: (name, []) for name in benches}, **EXTRA_MODES}


def run_bench(module: str, flags: list[str]) -> dict[str, Any]:
    """One bench's figures: its stdout under --json (its report goes to our stderr)."""
    command = [sys.executable, "-m", f"bench.{module}", *flags, "--json"]
    print(f"running {' '.join(command[1:])}", file=sys.stderr, flush=True)
    done = subprocess.run(command, cwd=REPO, stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[1:])} failed (exit {done.returncode}); its "
                           "report is above")
    return json.loads(done.stdout)


def read_saved(directory: Path) -> list[dict[str, Any]]:
    """The objects saved in `directory` (*.json, one bench each), in file-name order."""
    files = sorted(directory.glob("*.json")) if directory.is_dir() else []
    if not files:
        raise ValueError(f"--from {directory}: no .json files there (save them with "
                         "python -m bench.table --save DIR, or python -m bench.bench_x --json "
                         "> DIR/bench_x.json)")
    reports = []
    for path in files:
        try:
            reports.append(json.loads(path.read_text(encoding="utf-8")))
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: not one JSON object ({error.msg}); rerun its bench "
                             "with --json") from None
    return reports


def machine_description() -> str:
    """"<CPU model>, <n> cores" from lscpu (Linux), else what platform knows."""
    model = platform.processor() or platform.machine()
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        model = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines()
                      if line.startswith("Model name:")), model)
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores"


def _value(value: float, unit: str) -> str:
    if unit == "bytes":
        value, unit = value / 2**20, "MiB"
    if abs(value) >= 1000:
        return f"{value:,.0f} {unit}"
    return f"{value:.3g} {unit}"


def render(reports: list[dict[str, Any]], machine: str, date: str) -> str:
    """The markdown that goes between the markers: a header, then one table per bench."""
    modes = ", ".join(sorted({report["mode"] for report in reports}))
    lines = [f"Measured {date} on {machine} (size mode: {modes}). Every ratio is ours against "
             "the reference measured side by side in the same run, so it carries to another "
             "machine better than either speed; > 1 means ours is better (for times and "
             "memory: the reference's / ours).", ""]
    for report in reports:
        lines += [f"### {report['bench']}", ""]
        if report["figures"]:
            lines += ["| figure | ours | reference | ratio | target |",
                      "|---|---:|---|---:|---:|"]
        for figure in report["figures"]:
            unit = figure["unit"]
            target = figure["target"]
            verdict = "" if target is None else (
                f"≥ {target:.2f} {'met' if figure['ratio'] >= target else '**not met**'}")
            lines.append(f"| {figure['name']} | {_value(figure['ours'], unit)} | "
                         f"{_value(figure['reference'], unit)} ({figure['reference_name']}) | "
                         f"{figure['ratio']:.2f}x | {verdict} |")
        lines += [*(f"- {note}" for note in report["notes"]), ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def replace_between_markers(page: str, table: str, page_name: str) -> str:
    """`page` with everything between BEGIN and END replaced by `table`."""
    start, end = page.find(BEGIN), page.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{page_name} lacks the markers {BEGIN} ... {END}: add them where the "
                         "table goes")
    return f"{page[:start + len(BEGIN)]}\n{table}{page[end:]}"


def main(argv: list[str] | None = None) -> None:
    parser = OptionParser(description=__doc__.split("\n")[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="run each bench with --quick")
    size.add_argument("--smoke", action="store_true", help="run each bench with --smoke")
    size.add_argument("--from", dest="saved", type=Path,
                      help="read the saved JSON objects in this folder instead of running")
    parser.add_argument("--save", type=Path, help="also save each bench's object here")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the page to update")
    args = parser.parse_args(argv)
    if not args.out.is_file():
        raise ValueError(f"--out {args.out} does not exist (it holds the text around the table)")
    page = args.out.read_text(encoding="utf-8")
    replace_between_markers(page, "", str(args.out))  # checked before any bench runs
    if args.saved is not None:
        reports = read_saved(args.saved)
    else:
        flags = ["--quick"] if args.quick else ["--smoke"] if args.smoke else []
        reports = [run_bench(module, [*extra, *flags])
                   for module, extra in bench_commands().values()]
    if args.save is not None:
        args.save.mkdir(parents=True, exist_ok=True)
        for report in reports:
            name = report["bench"].replace(" --", "_")
            atomic_write_bytes(args.save / f"{name}.json", json.dumps(report).encode("utf-8"))
    table = render(reports, machine_description(), datetime.date.today().isoformat())
    atomic_write_bytes(args.out, replace_between_markers(page, table, str(args.out))
                       .encode("utf-8"))
    print(f"{args.out}: {sum(len(r['figures']) for r in reports)} figures from "
          f"{len(reports)} benches", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(run_main(main))
