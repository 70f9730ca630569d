"""A supervisor on every node: two monitor_process.py on loopback, each supervising its own
torchrun agent (one rank each, c10d rendezvous) of one two-node run.

SIGKILL of node 1's rank after the first checkpoint ends both agents; both supervisors
relaunch their own with --resume, the agents meet again, and the run ends with the losses and
byte-identical weights of the uninterrupted run (2 ranks, no kill).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from parallel.local_ranks import find_free_port
from tests.monitor.test_monitor_process_real_trainer import (
    heartbeat_step,
    rank_pids,
    stop,
    trainer_args,
    wait_until,
)
from tests.train_helpers import final_weights, run_on_two_ranks, tiny_training_data, train_losses

REPO = Path(__file__).resolve().parents[2]
STEPS = 40
MONITOR_ARGS = ["--restart_delay", "1", "--max_restart_delay", "2", "--kill_grace", "10",
                "--startup_timeout", "300", "--heartbeat_timeout", "120", "--max_restarts", "4"]


@pytest.fixture(scope="module")
def data(tmp_path_factory, tiny_hf_tokenizer_dir):
    return tiny_training_data(tmp_path_factory.getbasetemp(), tiny_hf_tokenizer_dir)


def node_log(run_dir: Path, node: str, event: str) -> list[str]:
    path = run_dir / "nodes" / f"{node}.monitor.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return [line for line in lines if line.split(" ")[1] == event]


def start_node_supervisor(node: str, run_dir: Path, port: int, args: list[str]
                          ) -> subprocess.Popen:
    with open(run_dir.parent / f"{node}_output.txt", "w") as handle:
        return subprocess.Popen(
            [sys.executable, "monitor_process.py", *MONITOR_ARGS, "--node_name", node, "--",
             sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
             "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=run",
             "train_my_ddp.py", *args, f"--out_dir={run_dir}"],
            cwd=REPO, stdout=handle, stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.slow  # ~45 s, mostly waiting for two rendezvous: run beside the rest
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds torchrun's ranks via /proc")
def test_sigkill_of_a_rank_on_node_1_both_supervisors_relaunch_and_the_result_is_unchanged(
        data, tmp_path):
    args = [*trainer_args(data), f"--max_iters={STEPS}"]
    full, run_dir = tmp_path / "full", tmp_path / "supervised"
    port = find_free_port()
    supervisors = [start_node_supervisor(node, run_dir, port, args) for node in ("node0", "node1")]
    try:
        wait_until(lambda: heartbeat_step(run_dir) >= 6, "step 6 (a checkpoint at step 5)")
        leader = int(re.search(r" pid=(\d+)", node_log(run_dir, "node1", "START")[0]).group(1))
        (rank,) = rank_pids(leader)
        os.kill(rank, signal.SIGKILL)
        for supervisor in supervisors:
            supervisor.wait(timeout=300)
    finally:
        for supervisor in supervisors:
            stop(supervisor)
    outputs = [(run_dir.parent / f"{node}_output.txt").read_text()[-3000:]
               for node in ("node0", "node1")]
    assert [supervisor.returncode for supervisor in supervisors] == [0, 0], outputs
    for node in ("node0", "node1"):  # each relaunched its own agent, which resumed
        assert len(node_log(run_dir, node, "RESTART")) >= 1, outputs
        assert all("--resume" in line for line in node_log(run_dir, node, "START")[1:])
    assert run_on_two_ranks([*args, f"--out_dir={full}"]) == [0]
    assert train_losses(run_dir) == train_losses(full)
    assert final_weights(run_dir, STEPS) == final_weights(full, STEPS)
