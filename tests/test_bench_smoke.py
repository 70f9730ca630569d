"""Every benchmark runs on a fresh clone: `python -m bench.bench_x --smoke` (tiny sizes,
generated data instead of `make demo`'s corpus and tokenizers) must exit 0, and so must each
mode that plain --smoke does not reach (EXTRA_MODES, e.g. `bench_parallel --context`). The benches
run side by side, one thread each, so the whole check costs about as long as the slowest one
(~10-20 s). Every bench also takes `--quick` (`make bench BENCH_FLAGS=--quick`,
docs/benchmarks.md), which is too slow to run here: its parser is checked instead, in this
process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_readme_commands import run_until_parsed

REPO = Path(__file__).resolve().parents[1]
BENCHES = sorted(REPO.glob("bench/bench_*.py"))
# Modes of a bench that its plain --smoke does not reach: {name: (module, extra flags)}.
EXTRA_MODES = {"bench_parallel --context": ("bench_parallel", ["--context"])}


def test_every_bench_runs_its_smoke_mode():
    assert len(BENCHES) >= 5
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    commands = {**{path.stem: (path.stem, []) for path in BENCHES}, **EXTRA_MODES}
    running = {name: subprocess.Popen([sys.executable, "-m", f"bench.{module}", *flags,
                                       "--smoke"],
                                      cwd=REPO, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True)
               for name, (module, flags) in commands.items()}
    failed = {}
    for name, process in running.items():
        output, _ = process.communicate(timeout=300)
        if process.returncode != 0 or not output.strip():
            failed[name] = output[-2000:]
    assert not failed, failed


@pytest.mark.parametrize("flag", ["--quick", "--smoke"])
def test_every_bench_takes_the_flags_make_bench_passes(flag, monkeypatch):
    """`make bench BENCH_FLAGS=--quick|--smoke` passes the flag to every script; one that does
    not know it exits 2 and stops the loop. Each script's own parser accepts the flag here, in
    this process, stopped before any work (the README check's `run_until_parsed`)."""
    for path in BENCHES:
        run_until_parsed(["-m", f"bench.{path.stem}", flag], monkeypatch)


def test_the_flag_check_can_fail(monkeypatch):
    with pytest.raises(SystemExit):
        run_until_parsed(["-m", "bench.bench_ddp", "--quik"], monkeypatch)
