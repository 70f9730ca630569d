"""monitor_process.py supervising the real train_my_ddp.py (tiny model, tiny data, CPU).

The reference is the uninterrupted run of the same command: after SIGKILLs (one of them in
the middle of a checkpoint write) or a hung rank, the supervised run must end with a
byte-identical model.safetensors and the same loss at every step.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.monitor.test_monitor_process import is_dead
from tests.train_helpers import (
    TINY_ARGS,
    data_args,
    final_weights,
    run_main,
    run_on_two_ranks,
    tiny_training_data,
    train_losses,
)
from utils import run_directory
from utils.run_directory import lock_holder

REPO = Path(__file__).resolve().parents[2]
TOTAL_STEPS = 100  # steps take milliseconds: room for a late kill on a busy machine
MONITOR_ARGS = ["--restart_delay", "0.05", "--max_restart_delay", "0.1", "--kill_grace", "10",
                "--startup_timeout", "300"]


@pytest.fixture(scope="module")
def data(tmp_path_factory, tiny_hf_tokenizer_dir):
    return tiny_training_data(tmp_path_factory.getbasetemp(), tiny_hf_tokenizer_dir)


def trainer_args(data) -> list[str]:
    return [*TINY_ARGS, *data_args(data, "pretrain"), f"--max_iters={TOTAL_STEPS}",
            "--save_interval=5", "--eval_interval=1000", "--keep_last=3"]


def start_monitor(run_dir: Path, monitor_args: list[str], command: list[str]):
    """The supervisor, its output in a file (a pipe would block on any process left behind)."""
    output = run_dir.parent / "monitor_output.txt"
    with open(output, "w") as handle:
        return subprocess.Popen(
            [sys.executable, "monitor_process.py", *MONITOR_ARGS, *monitor_args, "--",
             *command, f"--out_dir={run_dir}"], cwd=REPO, stdout=handle,
            stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})


def output_of(monitor: subprocess.Popen, run_dir: Path) -> str:
    monitor.wait(timeout=300)
    return (run_dir.parent / "monitor_output.txt").read_text()[-3000:]


def stop(monitor: subprocess.Popen) -> None:
    """After a failed test: a second signal makes the supervisor SIGKILL its whole run."""
    for _ in range(2):
        if monitor.poll() is None:
            monitor.send_signal(signal.SIGTERM)
            time.sleep(0.5)
    try:
        monitor.wait(timeout=30)
    except subprocess.TimeoutExpired:
        monitor.kill()


def log_lines(run_dir: Path, name: str) -> list[str]:
    path = run_dir / "monitor.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return [line for line in lines if line.split(" ")[1] == name]


def leader_pids(run_dir: Path) -> list[int]:
    return [int(re.search(r" pid=(\d+)", line).group(1)) for line in log_lines(run_dir, "START")]


def heartbeat_step(run_dir: Path) -> int:
    return run_directory.heartbeat_step(run_dir) or 0


def wait_until(condition, what: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.001)


def saving_steps(run_dir: Path) -> list[int]:
    """Steps of checkpoints being written right now (their temp dirs)."""
    names = os.listdir(run_dir / "ckpt") if (run_dir / "ckpt").is_dir() else []
    return [int(name.removeprefix(".tmp_step_")) for name in names
            if name.startswith(".tmp_step_")]


def kill_mid_checkpoint(run_dir: Path, pid: int, after_step: int) -> int:
    """SIGKILL `pid` while it writes a checkpoint newer than `after_step`; return that step.

    SIGSTOP first, then look again: only a process frozen with its temp dir still in place
    was caught mid-write (otherwise let it go on and catch the next checkpoint).
    """
    while True:
        wait_until(lambda: any(step > after_step for step in saving_steps(run_dir)),
                   "a checkpoint write")
        os.kill(pid, signal.SIGSTOP)
        writing = [step for step in saving_steps(run_dir) if step > after_step]
        if writing and not (run_dir / "ckpt" / f"step_{writing[0]:06d}").exists():
            os.kill(pid, signal.SIGKILL)
            return writing[0]
        os.kill(pid, signal.SIGCONT)


@pytest.mark.slow  # mostly waiting for kills and restarts: it runs in the lane beside the others
def test_three_sigkills_one_mid_checkpoint_end_byte_identical(data, tmp_path):
    full, run_dir = tmp_path / "full", tmp_path / "supervised"
    assert run_main([*trainer_args(data), f"--out_dir={full}"]) == 0
    rng = random.Random()
    first_kill = rng.randint(6, 20)  # after the first checkpoint (step 5): a real resume
    monitor = start_monitor(run_dir, ["--max_restarts", "5", "--heartbeat_timeout", "120"],
                            [sys.executable, "train_my_ddp.py", *trainer_args(data)])
    try:
        # 1: SIGKILL at a random step.
        wait_until(lambda: heartbeat_step(run_dir) >= first_kill, f"step {first_kill}")
        os.kill(leader_pids(run_dir)[0], signal.SIGKILL)
        wait_until(lambda: monitor.poll() is not None or len(leader_pids(run_dir)) == 2,
                   "the first relaunch")
        assert monitor.poll() is None
        # 2: SIGKILL in the middle of writing a checkpoint.
        torn_step = kill_mid_checkpoint(run_dir, leader_pids(run_dir)[1],
                                        after_step=heartbeat_step(run_dir))
        assert (run_dir / "ckpt" / f".tmp_step_{torn_step:06d}").is_dir()  # left half-written
        wait_until(lambda: monitor.poll() is not None or len(leader_pids(run_dir)) == 3,
                   "the second relaunch")
        assert monitor.poll() is None
        # 3: SIGKILL at a random later step.
        last_kill = rng.randint(torn_step + 1, max(torn_step + 1, min(torn_step + 15, 70)))
        wait_until(lambda: heartbeat_step(run_dir) >= last_kill, f"step {last_kill}")
        os.kill(leader_pids(run_dir)[2], signal.SIGKILL)
        output = output_of(monitor, run_dir)
    finally:
        stop(monitor)
    assert monitor.returncode == 0, output
    assert final_weights(run_dir, TOTAL_STEPS) == final_weights(full, TOTAL_STEPS)
    assert train_losses(run_dir) == train_losses(full)
    restarts = log_lines(run_dir, "RESTART")
    assert len(restarts) == 3 and all('cause="signal SIGKILL"' in line for line in restarts)
    # The half-written checkpoint was never loaded: the trainer resumed from an older one.
    resumed = [int(re.search(r" step=(\d+)", line).group(1))
               for line in log_lines(run_dir, "RESUMED")]
    assert len(resumed) == 3 and resumed[1] < torn_step


def rank_pids(leader: int) -> list[int]:
    """Children of torchrun (its ranks), from /proc."""
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == leader:
                children.append(int(entry))
    return children


@pytest.mark.slow  # mostly waiting for the hang to be seen
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds torchrun's ranks via /proc")
def test_a_stopped_rank_of_torchrun_is_detected_and_the_run_restarted(data, tmp_path):
    args = [*trainer_args(data), "--max_iters=12", "--save_interval=3"]  # later ones win
    full, run_dir = tmp_path / "full", tmp_path / "supervised"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node=2", "train_my_ddp.py", *args]
    monitor = start_monitor(run_dir, ["--max_restarts", "2", "--heartbeat_timeout", "8"],
                            torchrun)
    try:
        wait_until(lambda: heartbeat_step(run_dir) >= 4, "step 4")
        ranks = rank_pids(leader_pids(run_dir)[0])
        assert len(ranks) == 2
        stopped = random.choice(ranks)
        os.kill(stopped, signal.SIGSTOP)  # alive but silent: the other rank waits forever
        output = output_of(monitor, run_dir)
    finally:
        stop(monitor)
    assert monitor.returncode == 0, output
    (hang,) = log_lines(run_dir, "HANG")
    assert "killing all its processes" in hang
    assert all(not Path(f"/proc/{pid}").exists()
               or Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
               for pid in ranks)
    assert run_on_two_ranks([*args, f"--out_dir={full}"]) == [0]
    assert final_weights(run_dir, 12) == final_weights(full, 12)
    assert train_losses(run_dir) == train_losses(full)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("victim", ["supervisor", "torchrun"])
def test_kill9_of_the_supervisor_or_torchrun_leaves_no_rank_training(data, tmp_path, victim):
    """The ranks are in sessions of their own: only PR_SET_PDEATHSIG (the supervisor's for
    torchrun, each rank's own for torchrun) brings them down, and with them the run dir lock."""
    run_dir = tmp_path / "supervised"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node=2", "train_my_ddp.py", *trainer_args(data),
                "--max_iters=1000000", "--save_interval=100000"]
    monitor = start_monitor(run_dir, ["--max_restarts", "0"], torchrun)
    agent, ranks = None, []
    try:
        wait_until(lambda: heartbeat_step(run_dir) >= 2, "step 2")
        agent = leader_pids(run_dir)[0]
        ranks = rank_pids(agent)
        assert len(ranks) == 2 and lock_holder(run_dir) is not None
        os.kill(monitor.pid if victim == "supervisor" else agent, signal.SIGKILL)
        wait_until(lambda: all(is_dead(pid) for pid in ranks), "the ranks to die", timeout=10)
        # Forked DataLoader workers share rank 0's lock until they notice its death (<= 5 s)
        wait_until(lambda: lock_holder(run_dir) is None, "the lock to be freed", timeout=15)
    finally:
        stop(monitor)
        for pid in [agent, *ranks] if agent else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("launcher", [
    [sys.executable],
    [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"],
], ids=["python", "torchrun"])
def test_a_command_refused_as_bad_input_is_not_relaunched(data, tmp_path, launcher):
    """The trainer exits 2 on an unknown option (torchrun itself exits 1, and names its first
    failed rank's exit code 2): one attempt, the trainer's line, exit 2 (before: relaunched
    until --stuck_after, exit 3)."""
    run_dir = tmp_path / "supervised"
    monitor = start_monitor(run_dir, [], [*launcher, "train_my_ddp.py", *trainer_args(data),
                                          "--eval_at_strat"])
    try:
        output = output_of(monitor, run_dir)
    finally:
        stop(monitor)
    assert monitor.returncode == 2, output
    assert len(log_lines(run_dir, "START")) == 1, output
    refusal = "unknown option 'eval_at_strat'; did you mean --eval_at_start"
    assert f"error: command line: {refusal}" in output
    assert output.splitlines()[-1].startswith(
        f"monitor_process: the command refused its input (error: command line: {refusal}")
    (summary,) = log_lines(run_dir, "SUMMARY")
    assert "result=refused attempts=1" in summary
