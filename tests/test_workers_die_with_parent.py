"""Every data tool's workers die with it: kill the parent with SIGKILL mid-run (no handler of
its own can run), and none of its descendants may outlive it.

Rows: clean_pretrain_data, whose pool is the one every pretokenizer uses too
(data_preprocess/worker_pool.py: start_pool; its workers fork from a forkserver, and both it
and the workers must go, forkserver_guard.py), and the trainer's two
DataLoaders, whose forked workers are kept busy by a dataset that sleeps (a busy worker never
reaches the point where torch's own watchdog would notice its parent gone). Before the fix a
killed clean_pretrain_data left its forkserver and a worker spinning for 18 minutes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

# real tools killed mid-run, then waiting for their workers to go: in the slow lane
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
STARTUP_LIMIT_S = 120  # generous: on a shared machine the interpreter and imports are slow
CLEANUP_LIMIT_S = 15  # the kernel's signals act at once; this only bounds a failing test

SLOW_DATASETS = """
import sys, time
from pathlib import Path
from torch.utils.data import Dataset
from dataset.stream import StreamDataset, StreamLoader, StreamSettings
from dataset.stream_shards import StreamSource
from dataset.train_data import SampledTrainData

class SlowItems(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, index):
        time.sleep(600)  # a worker busy with a batch far longer than the test waits

class SlowStream(StreamDataset):
    def __iter__(self):
        time.sleep(600)
        yield {}

if sys.argv[1] == "stream":
    dataset = SlowStream([StreamSource("a", 1.0, Path("."), ())],
                         StreamSettings("pretrain", "", 8, seed=0), num_workers=2)
    next(iter(StreamLoader(dataset, 1, list, num_workers=2)))
else:
    next(iter(SampledTrainData(SlowItems(), list, 1, 0, 1, seed=0, num_workers=2)))
"""


def big_corpus(root: Path) -> Path:
    """400 documents of 5,000 words: minutes of work for two workers, killed in its first."""
    text = " ".join(f"word{i % 997} the of and" for i in range(1250))
    (root / "raw").mkdir()
    (root / "raw" / "a.jsonl").write_text(
        "".join(json.dumps({"text": f"{text} {n}"}) + "\n" for n in range(400)))
    return root / "raw"


def command(kind: str, tmp_path: Path) -> tuple[list[str], int]:
    """The command line and how many descendants it has once its workers run."""
    if kind == "clean_pretrain_data":  # resource tracker + forkserver + 2 workers
        return [sys.executable, "-m", "data_preprocess.clean_pretrain_data", "--data_dir",
                str(big_corpus(tmp_path)), "--out_dir", str(tmp_path / "out"),
                "--num_workers", "2", "--batch_size", "1"], 4
    return [sys.executable, "-c", textwrap.dedent(SLOW_DATASETS), kind], 2


def alive(process: psutil.Process) -> bool:
    """Running and not a zombie (an orphan's exit is reaped by whoever adopts it, if anyone)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("kind", ["clean_pretrain_data", "stream", "sampled"])
def test_sigkill_of_the_parent_leaves_no_worker(tmp_path, kind):
    argv, workers_up = command(kind, tmp_path)
    parent = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    descendants: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + STARTUP_LIMIT_S
        while len(descendants) < workers_up:
            assert parent.poll() is None, f"{kind} ended before it was killed: {parent.stderr}"
            assert time.monotonic() < deadline, f"{kind} never started its workers"
            time.sleep(0.05)
            descendants = psutil.Process(parent.pid).children(recursive=True)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + CLEANUP_LIMIT_S
        while any(alive(p) for p in descendants) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [(p.pid, " ".join(p.cmdline())[:120]) for p in descendants if alive(p)]
        assert not left, f"{kind}: workers outlived their parent: {left}"
    finally:
        parent.kill()
        for process in descendants:
            if alive(process):
                process.kill()
