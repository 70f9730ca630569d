"""Every benchmark runs on a fresh clone: `python -m bench.bench_x --smoke --json` (tiny sizes,
generated data instead of `make demo`'s corpus and tokenizers) must exit 0 and print exactly one
JSON object of its figures on stdout (its report on stderr), and so must each mode that plain
--smoke does not reach (bench/table.py's EXTRA_MODES, e.g. `bench_parallel --context`). The
benches run side by side, one thread each, so the whole check costs about as long as the
slowest one (~10-20 s).
Every bench also takes `--quick` (`make bench BENCH_FLAGS=--quick`,
docs/benchmarks.md), which is too slow to
run here: its parser is checked instead, in this process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.table import bench_commands
from tests.test_readme_commands import run_until_parsed

REPO = Path(__file__).resolve().parents[1]
BENCHES = sorted(REPO.glob("bench/bench_*.py"))


def smoke_run_problem(name: str, returncode: int, stdout: str, stderr: str) -> str | None:
    """What is wrong with one `--smoke --json` run, or None: it must exit 0, report on stderr,
    and print one JSON object naming the bench, with well-formed figures, on stdout."""
    if returncode != 0:
        return f"exit {returncode}: {stderr[-2000:]}"
    if not stderr.strip():
        return "no report on stderr"
    try:
        report = json.loads(stdout)
    except json.JSONDecodeError:
        return f"stdout is not one JSON object: {stdout[-500:]!r}"
    if report.get("bench") != name or report.get("mode") != "smoke":
        return f"bench/mode {report.get('bench')!r}/{report.get('mode')!r}"
    keys = {"name", "unit", "ours", "reference", "reference_name", "higher_is_better", "ratio",
            "target"}
    bad = [figure for figure in report["figures"] if set(figure) != keys]
    if bad or not (report["figures"] or report["notes"]):
        return f"figures {report['figures']!r}, notes {report['notes']!r}"
    return None


@pytest.mark.slow  # a minute of one-core work: it runs in the lane beside the others (Makefile)
def test_every_bench_runs_its_smoke_mode_and_prints_json():
    assert len(BENCHES) >= 5
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    commands = bench_commands()  # every bench_*.py, and the modes plain runs do not reach
    assert len(commands) > len(BENCHES)
    running = {name: subprocess.Popen([sys.executable, "-m", f"bench.{module}", *flags,
                                       "--smoke", "--json"],
                                      cwd=REPO, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True)
               for name, (module, flags) in commands.items()}
    failed = {}
    for name, process in running.items():
        stdout, stderr = process.communicate(timeout=300)
        if problem := smoke_run_problem(name, process.returncode, stdout, stderr):
            failed[name] = problem
    assert not failed, failed


@pytest.mark.parametrize("flag", ["--quick", "--smoke", "--json"])
def test_every_bench_takes_the_flags_make_bench_passes(flag, monkeypatch):
    """`make bench BENCH_FLAGS=--quick|--smoke` (and `python -m bench.table`, --json) passes the
    flag to every script; one that does
    not know it exits 2 and stops the loop. Each script's own parser accepts the flag here, in
    this process, stopped before any work (the README check's `run_until_parsed`)."""
    for path in BENCHES:
        run_until_parsed(["-m", f"bench.{path.stem}", flag], monkeypatch)


def test_the_flag_check_can_fail(monkeypatch):
    with pytest.raises(SystemExit):
        run_until_parsed(["-m", "bench.bench_ddp", "--quik"], monkeypatch)
