"""Every benchmark runs on a fresh clone: `python -m bench.bench_* --smoke` (tiny sizes,
generated data instead of `make demo`'s corpus and tokenizers) must exit 0. The benches run
side by side, one thread each, so the whole check costs about as long as the slowest one
(~10-20 s)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCHES = sorted(REPO.glob("bench/bench_*.py"))


def test_every_bench_runs_its_smoke_mode():
    assert len(BENCHES) >= 5
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # `-m bench.<name>` from the repository root: the project imports without sys.path edits.
    running = {path.name: subprocess.Popen([sys.executable, "-m", f"bench.{path.stem}",
                                            "--smoke"], cwd=REPO,
                                           env=env, stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT, text=True)
               for path in BENCHES}
    failed = {}
    for name, process in running.items():
        output, _ = process.communicate(timeout=300)
        if process.returncode != 0 or not output.strip():
            failed[name] = output[-2000:]
    assert not failed, failed
