"""Two "nodes" on loopback: two torchrun agents of one rank each, as the seed's README spells the
multi-node commands (static --master_addr/--master_port), and as slurm/train.sbatch starts them
(c10d rendezvous, a fake srun and scontrol).

The reference is one agent with 2 ranks (here: 2 spawned gloo ranks): the same losses at every
step and byte-identical final weights. A node whose run directory is its own (simulated: node 1
gets another --out_dir, as a node-local disk at the same path would be) is refused before the
first step, in one line naming the shared-filesystem requirement.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from parallel.local_ranks import find_free_port
from tests.train_helpers import (
    TINY_ARGS,
    data_args,
    final_weights,
    records,
    run_main,
    run_on_two_ranks,
    train_losses,
)
from utils.run_directory import SHARED_CHECK_FILE

# torchrun agents meeting on loopback: mostly waiting, in the slow lane beside the rest
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
STEPS = 2


def trainer_args(data, run_dir: Path) -> list[str]:
    return [*TINY_ARGS, *data_args(data, "pretrain"), f"--max_iters={STEPS}",
            f"--save_interval={STEPS}", "--eval_interval=1000", f"--out_dir={run_dir}"]


def run_two_agents(args_of_node: list[list[str]], log_dir: Path) -> list[str]:
    """The seed's master and remote commands (static rendezvous) on 127.0.0.1: start both
    agents, wait for both; their output, node 0's first."""
    port = find_free_port()
    agents, logs = [], []
    for node_rank, args in enumerate(args_of_node):
        logs.append(log_dir / f"node{node_rank}.txt")
        with open(logs[-1], "w") as handle:
            agents.append(subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
                 "--nproc_per_node=1", f"--node_rank={node_rank}",
                 "--master_addr=127.0.0.1", f"--master_port={port}",
                 "train_my_ddp.py", *args],
                cwd=REPO, stdout=handle, stderr=subprocess.STDOUT,
                env={**os.environ, "OMP_NUM_THREADS": "1"}))
    for agent in agents:
        agent.wait(timeout=300)
    return [log.read_text() for log in logs]


@pytest.fixture(scope="module")
def one_node_run(data, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("one_node") / "run"
    assert run_on_two_ranks(trainer_args(data, run_dir)) == [0]
    return run_dir


def test_the_seeds_two_commands_equal_one_agent_with_two_ranks(data, tmp_path, one_node_run):
    """Static rendezvous, master and remote on 127.0.0.1 (c10d rendezvous: the SLURM job
    below, whose two agents meet that way)."""
    run_dir = tmp_path / "run"
    outputs = run_two_agents([trainer_args(data, run_dir)] * 2, tmp_path)
    assert train_losses(run_dir) == train_losses(one_node_run), outputs[0][-3000:]
    assert final_weights(run_dir, STEPS) == final_weights(one_node_run, STEPS)


def node_local_copy(kind: str, data, tmp_path: Path) -> tuple[list[str], str]:
    """Node 1's own disk, as a test can make one: (its arguments that differ, the words of
    rank 0's refusal)."""
    node1_run = tmp_path / "node1" / "run"
    if kind == "run dir holding an earlier run's token":  # the same path can hold one
        node1_run.mkdir(parents=True)
        (node1_run / SHARED_CHECK_FILE).write_text("an earlier run's token\n")
    if kind != "data dir, one file short":
        return [f"--out_dir={node1_run}"], "rank 1 (host"
    node1_data = tmp_path / "node1" / "data"
    shutil.copytree(data["pretrain"], node1_data)
    next(node1_data.glob("*.bin")).unlink()
    return [f"--data_dir={node1_data}"], "--data_dir="


@pytest.mark.parametrize("kind", ["run dir holding an earlier run's token",
                                  "data dir, one file short"])
def test_a_node_local_directory_is_refused_before_the_first_step(data, tmp_path, kind):
    """The content is compared, not the path: a node's own `out/run` is refused even when it
    holds a check file of an earlier run, and so is its own copy of the data when it differs."""
    node0_run = tmp_path / "node0" / "run"
    node1_args, refusal = node_local_copy(kind, data, tmp_path)
    outputs = run_two_agents([trainer_args(data, node0_run),
                                        [*trainer_args(data, node0_run), *node1_args]], tmp_path)
    problem = [line for line in outputs[0].splitlines() if "shared filesystem" in line]
    assert len(problem) == 1 and refusal in problem[0] and "rank 1" in problem[0], outputs[0]
    for output in outputs:  # each rank exited 2; torchrun's own report aside, no traceback
        assert re.search(r"exitcode\s*: 2", output)
        assert not re.search(rf'File "{REPO}/(?!\.venv)', output)
    assert not (node0_run / "metrics.jsonl").exists()  # no step ran (and the new dir is gone)


@pytest.mark.parametrize("relaunch_count", ["TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"])
def test_a_relaunched_command_resumes_from_the_newest_checkpoint(data, tmp_path, monkeypatch,
                                                                 relaunch_count):
    """`torchrun --max_restarts` restarts failed ranks, and SLURM a requeued job, with their
    first command line (no --resume): that run continues from its checkpoint and equals the
    uninterrupted run."""
    args = [*TINY_ARGS, *data_args(data, "pretrain"), "--max_iters=4", "--eval_interval=1000"]
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert run_main([*args, f"--out_dir={full}"]) == 0
    assert run_main([*args, f"--out_dir={cut}", "--stop_at_iter=2"]) == 0  # then it "failed"
    monkeypatch.setenv(relaunch_count, "1")
    assert run_main([*args, f"--out_dir={cut}"]) == 0
    assert [record["step"] for record in records(cut, "resume")] == [2]
    assert train_losses(cut) == train_losses(full)
    assert final_weights(cut, 4) == final_weights(full, 4)


# ---- SLURM: slurm/train.sbatch and its supervised variant, with a fake srun and scontrol ----

FAKE_SCONTROL = """#!/bin/bash
# Bash's printf writes each line apart, as scontrol writes a long list in pieces; FAKE_MORE_HOSTS=N
# adds N hosts (a large job).
[ "$1 $2 $3" = "show hostnames $SLURM_JOB_NODELIST" ] || exit 1
printf '127.0.0.1\\nnode-b\\n'
[ -z "${FAKE_MORE_HOSTS:-}" ] || seq -f 'node-%06g' "$FAKE_MORE_HOSTS"
"""
FAKE_SRUN = """#!/bin/bash
# One task per node, in parallel, each with its SLURM_NODEID and SLURMD_NODENAME.
while [[ "$1" == --* ]]; do shift; done
pids=()
for ((node = 0; node < SLURM_NNODES; node++)); do
    SLURM_NODEID=$node SLURMD_NODENAME=node$node "$@" > "$FAKE_SLURM_LOGS/node$node.txt" 2>&1 &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
"""
RECORDING_PYTHON = """#!/bin/bash
printf '%s\\n' "$@" > "$FAKE_SLURM_LOGS/argv_$SLURM_NODEID"
"""


def fake_slurm_job(tmp_path: Path, port: int, **settings: str) -> dict[str, str]:
    """The environment of a 2-node job's batch script, our fake srun and scontrol first on PATH."""
    bin_dir, logs = tmp_path / "fake_bin", tmp_path / "slurm_logs"
    bin_dir.mkdir()
    logs.mkdir()
    for name, text in (("scontrol", FAKE_SCONTROL), ("srun", FAKE_SRUN),
                       ("recording_python", RECORDING_PYTHON)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1",
            "SLURM_NNODES": "2", "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "fake[1-2]",
            "SLURM_SUBMIT_DIR": str(REPO), "SLURM_GPUS_ON_NODE": "1", "RDZV_PORT": str(port),
            "FAKE_SLURM_LOGS": str(logs), **settings}


def job_report(job: subprocess.CompletedProcess, logs: Path) -> str:
    """What a failed fake job said: the batch script's stderr, then every node's log."""
    node_logs = [f"--- {path.name}:\n{path.read_text()[-3000:]}"
                 for path in sorted(logs.glob("node*.txt"))]
    return "\n".join([f"exit {job.returncode}; batch script's stderr:\n{job.stderr[-3000:]}",
                      *(node_logs or ["(srun wrote no node log)"])])


@pytest.mark.parametrize("script, supervisor", [
    ("slurm/train.sbatch", []),
    ("slurm/train_supervised.sbatch", ["monitor_process.py", "--node_name=node{node}",
                                       "--max_restarts", "5", "--"]),
])
def test_the_slurm_scripts_build_one_torchrun_per_node(tmp_path, script, supervisor):
    python = str(tmp_path / "fake_bin" / "recording_python")
    env = fake_slurm_job(tmp_path, 29512, PYTHON=python, MONITOR_ARGS="--max_restarts 5")
    subprocess.run(["bash", "-n", script], cwd=REPO, check=True)
    subprocess.run(["bash", script, "--task_type=pretrain", "--out_dir=/shared/run 1"],
                   cwd=REPO, env=env, check=True)
    for node in (0, 1):
        argv = (tmp_path / "slurm_logs" / f"argv_{node}").read_text().splitlines()
        assert argv == [*(arg.format(node=node) for arg in supervisor),
                        *([python] if supervisor else []), "-m", "torch.distributed.run",
                        "--nnodes=2", f"--node_rank={node}", "--nproc_per_node=1",
                        "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:29512",
                        "--rdzv_id=4242", "train_my_ddp.py", "--task_type=pretrain",
                        "--out_dir=/shared/run 1"]


def test_the_rendezvous_host_is_the_first_of_a_long_node_list(tmp_path):
    """scontrol writes a long node list in pieces: the batch script reads all of it (its
    `scontrol ... | head -n 1` under pipefail ended the job before srun whenever head had gone
    when the next piece came: always for a list this long, now and then for two hosts)."""
    python = str(tmp_path / "fake_bin" / "recording_python")
    env = fake_slurm_job(tmp_path, 29512, PYTHON=python, FAKE_MORE_HOSTS="100000")
    job = subprocess.run(["bash", "slurm/train.sbatch", "--task_type=pretrain"], cwd=REPO,
                         env=env, capture_output=True, text=True)
    assert job.returncode == 0, job_report(job, tmp_path / "slurm_logs")
    for node in (0, 1):
        argv = (tmp_path / "slurm_logs" / f"argv_{node}").read_text().splitlines()
        assert "--rdzv_endpoint=127.0.0.1:29512" in argv


def test_the_supervised_slurm_job_on_loopback_equals_one_node(data, tmp_path, one_node_run):
    run_dir = tmp_path / "run"
    env = fake_slurm_job(tmp_path, find_free_port(), PYTHON=sys.executable,
                         MONITOR_ARGS="--restart_delay 0.1 --startup_timeout 300")
    job = subprocess.run(["bash", "slurm/train_supervised.sbatch", *trainer_args(data, run_dir)],
                         cwd=REPO, env=env, capture_output=True, text=True)
    assert job.returncode == 0, job_report(job, tmp_path / "slurm_logs")
    assert sorted(path.name for path in (run_dir / "nodes").iterdir()) == [
        "node0.monitor.lock", "node0.monitor.log", "node1.monitor.lock", "node1.monitor.log"]
    assert train_losses(run_dir) == train_losses(one_node_run)
    assert final_weights(run_dir, STEPS) == final_weights(one_node_run, STEPS)
