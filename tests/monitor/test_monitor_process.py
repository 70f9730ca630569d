"""monitor_process.py against tests/monitor/fake_trainer.py: crashes, hangs, signals, give-ups.

The reference for "resumed correctly" is always an uninterrupted run of the same fake trainer:
its state is a hash chain over the steps, so any lost or repeated step shows in the final state.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import monitor_process as mp
from utils.run_directory import RunLock, newest_checkpoint_step

REPO = Path(__file__).resolve().parents[2]
FAKE_TRAINER = [sys.executable, "-m", "tests.monitor.fake_trainer"]
# Short timings so the file stays fast; the heartbeat timeout is generous except in the hang
# test, so a slow, busy machine never looks "hung".
FAST = ["--restart_delay", "0.05", "--max_restart_delay", "0.2", "--kill_grace", "1",
        "--startup_timeout", "30", "--heartbeat_timeout", "20"]


def start_monitor(run_dir: Path, trainer_args: list[str], monitor_args: list[str] = ()):
    command = [sys.executable, "monitor_process.py", *FAST, *monitor_args, "--",
               *FAKE_TRAINER, "--out_dir", str(run_dir), *trainer_args]
    return subprocess.Popen(command, cwd=REPO, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen, timeout: float = 60) -> str:
    try:
        return process.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        process.kill()
        raise


def events(run_dir: Path, name: str) -> list[str]:
    lines = (run_dir / "monitor.log").read_text().splitlines()
    return [line for line in lines if line.split(" ")[1] == name]


def started_pids(run_dir: Path) -> list[int]:
    if not (run_dir / "monitor.log").exists():
        return []
    return [int(re.search(r" pid=(\d+)", line).group(1)) for line in events(run_dir, "START")]


def heartbeat(run_dir: Path) -> int:
    try:
        return json.loads((run_dir / "heartbeat").read_text())["step"]
    except (OSError, ValueError):
        return 0


def wait_for(condition, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def reference_state(tmp_path: Path, trainer_args: list[str]) -> dict:
    """The final state of the same fake run, uninterrupted and unsupervised."""
    run_dir = tmp_path / "reference"
    subprocess.run([*FAKE_TRAINER, "--out_dir", str(run_dir), *trainer_args], cwd=REPO,
                   check=True)
    return json.loads((run_dir / "final_state.json").read_text())


def is_dead(pid: int) -> bool:
    """Gone, or a zombie nobody reaped yet (orphans in containers often stay zombies)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


# ---- pure helpers ------------------------------------------------------------------------------

def test_run_flags_are_added_exactly_once():
    base = ["torchrun", "--nproc_per_node", "2", "train_my_ddp.py", "--lr=3e-4"]
    first = mp.with_run_flags(base, "out/r", resume=False)
    assert first == [*base, "--out_dir=out/r"]
    relaunch = mp.with_run_flags(first, "out/r", resume=True)
    assert relaunch == [*base, "--out_dir=out/r", "--resume"]
    assert mp.with_run_flags(relaunch, "out/r", resume=True) == relaunch
    own = [*base, "--out_dir", "out/mine", "--resume=false"]
    assert mp.with_run_flags(own, "out/mine", resume=True) == [*own[:-1], "--resume"]
    assert mp.command_out_dir(own) == "out/mine"
    assert mp.command_out_dir(base) is None
    dashed = [*base, "--out-dir", "out/mine", "--resume"]  # the trainer reads dashes too
    assert mp.command_out_dir(dashed) == "out/mine"
    assert mp.with_run_flags(dashed, "out/mine", resume=True) == dashed


def test_remote_command_is_quoted_for_the_remote_shell():
    command = ["torchrun", "train_my_ddp.py", '--eval_prompts=["What is 2 + 3?"]', "--lr=3e-4"]
    wrapped = mp.over_ssh(command, "me@gpu-node", "/home/me/z2all repo")
    assert wrapped[:5] == ["ssh", "-tt", "-o", "BatchMode=yes", "me@gpu-node"]
    # What the remote shell will split the one-string command into:
    assert shlex.split(wrapped[5]) == ["cd", "/home/me/z2all repo", "&&", "exec", *command]


def test_backoff_doubles_then_caps():
    base, cap = random.uniform(0.5, 2.0), 10.0
    delays = [mp.backoff_delay(k, base, cap) for k in range(8)]
    expected = [min(base * 2**k, cap) for k in range(8)]
    assert delays == pytest.approx(expected)


def test_stuck_means_the_last_n_failures_ended_at_one_step():
    rng = random.Random()
    for _ in range(200):
        steps = [rng.choice([None, 3, 7]) for _ in range(rng.randint(1, 6))]
        failures = [mp.Attempt(number, "exit code 1", step) for number, step in enumerate(steps)]
        stuck_after = rng.randint(0, 4)
        # Reference: count the run of equal steps at the end of the list.
        run_length = 1
        while run_length < len(steps) and steps[-run_length - 1] == steps[-1]:
            run_length += 1
        expected = 0 < stuck_after <= run_length
        assert mp.repeats_without_progress(failures, stuck_after) == expected, (steps, stuck_after)


def test_out_dir_is_required_and_must_agree(tmp_path):
    with pytest.raises(SystemExit):
        mp.parse_args(["--", "python", "train.py"])
    with pytest.raises(SystemExit):
        mp.parse_args(["--out_dir", "out/a", "--", "python", "train.py", "--out_dir=out/b"])
    config, command = mp.parse_args(["--max_restarts", "4", "--", "python", "t.py",
                                     "--out_dir=out/b"])
    assert (config.out_dir, config.max_restarts, command) == ("out/b", 4,
                                                              ["python", "t.py", "--out_dir=out/b"])


# ---- supervising the fake trainer --------------------------------------------------------------

def test_success_is_never_restarted(tmp_path):
    run_dir = tmp_path / "run"
    stderr = finish(start_monitor(run_dir, ["--max_iters", "12"]))
    assert "SUMMARY result=succeeded" in stderr
    assert len(events(run_dir, "START")) == 1
    assert events(run_dir, "RESTART") == []
    assert json.loads((run_dir / "final_state.json").read_text())["step"] == 12


def test_three_kill9_at_random_steps_resume_to_the_uninterrupted_state(tmp_path):
    trainer_args = ["--max_iters", "60", "--save_interval", "4", "--step_time", "0.03"]
    seed = random.randrange(10**6)
    kill_steps = sorted(random.Random(seed).sample(range(5, 48), 3))  # ckpt 4 exists
    run_dir = tmp_path / "run"
    monitor = start_monitor(run_dir, trainer_args, ["--max_restarts", "5"])
    for kills_done, kill_step in enumerate(kill_steps):
        wait_for(lambda n=kills_done, s=kill_step: len(started_pids(run_dir)) == n + 1
                 and heartbeat(run_dir) >= s)
        os.kill(started_pids(run_dir)[-1], signal.SIGKILL)
    stderr = finish(monitor)
    assert monitor.returncode == 0, stderr
    assert (json.loads((run_dir / "final_state.json").read_text())
            == reference_state(tmp_path, trainer_args)), f"seed {seed}, kills at {kill_steps}"
    restarts = events(run_dir, "RESTART")
    assert [re.search(r"attempt=(\d+)", line).group(1) for line in restarts] == ["2", "3", "4"]
    assert all('cause="signal SIGKILL"' in line for line in restarts)
    # The step the supervisor read from manifests is the one the trainer says it resumed from.
    monitor_steps = [int(re.search(r"resume_step=(\d+)", line).group(1)) for line in restarts]
    trainer_steps = [int(re.search(r" step=(\d+)", line).group(1))
                     for line in events(run_dir, "RESUMED")]
    assert monitor_steps == trainer_steps
    assert all(step <= kill for step, kill in zip(monitor_steps, kill_steps))


@pytest.mark.parametrize(("trainer_args", "cause"), [
    (["--fail_at_start", "7"], "exit code 7"),
    (["--crash_after_steps", "6"], "exit code 3"),  # progresses a little each time
])
def test_a_run_that_keeps_failing_stops_after_max_restarts(tmp_path, trainer_args, cause):
    run_dir = tmp_path / "run"
    max_restarts = 2
    monitor = start_monitor(run_dir, trainer_args, ["--max_restarts", str(max_restarts),
                                                    "--stuck_after", "4"])
    stderr = finish(monitor)
    assert monitor.returncode == mp.EXIT_GAVE_UP
    assert f"gave up after max_restarts={max_restarts} (last failure: {cause}" in stderr
    assert len(events(run_dir, "START")) == max_restarts + 1
    assert len(events(run_dir, "RESTART")) == max_restarts
    assert "result=gave_up" in events(run_dir, "SUMMARY")[0]
    # --resume only when there is a checkpoint to resume from (the trainer refuses otherwise).
    has_checkpoint = newest_checkpoint_step(run_dir) is not None
    assert [" --resume" in line for line in events(run_dir, "START")[1:]] \
        == [has_checkpoint] * max_restarts


def test_a_crash_at_the_same_step_is_reported_as_stuck(tmp_path):
    run_dir = tmp_path / "run"
    crash_step = random.randint(6, 12)
    monitor = start_monitor(run_dir, ["--crash_at_step", str(crash_step)],
                            ["--max_restarts", "10", "--stuck_after", "3"])
    stderr = finish(monitor)
    assert monitor.returncode == mp.EXIT_STUCK
    assert f"3 consecutive failures at step {crash_step - 1} without progress" in stderr
    assert len(events(run_dir, "RESTART")) == 2
    assert "result=stuck" in events(run_dir, "SUMMARY")[0]


def test_a_hang_is_detected_and_the_whole_group_killed_and_restarted(tmp_path):
    trainer_args = ["--max_iters", "30", "--step_time", "0.03", "--spawn_rank"]
    run_dir = tmp_path / "run"
    monitor = start_monitor(run_dir, trainer_args, ["--heartbeat_timeout", "2"])
    wait_for(lambda: heartbeat(run_dir) >= 5)
    hung_pid = started_pids(run_dir)[0]
    rank_pid = int((run_dir / "rank_pid").read_text())  # ignores SIGTERM: needs the SIGKILL
    os.kill(hung_pid, signal.SIGSTOP)
    stderr = finish(monitor)
    assert monitor.returncode == 0, stderr
    (hang,) = events(run_dir, "HANG")
    silence = float(re.search(r"no heartbeat for ([\d.]+)s", hang).group(1))
    assert silence >= 2
    (restart,) = events(run_dir, "RESTART")
    assert 'cause="hang' in restart
    assert is_dead(hung_pid) and is_dead(rank_pid)
    assert (json.loads((run_dir / "final_state.json").read_text())
            == reference_state(tmp_path, ["--max_iters", "30"]))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["term", "int"])
def test_a_stop_signal_is_forwarded_and_nothing_restarts(tmp_path, signum):
    run_dir = tmp_path / "run"
    monitor = start_monitor(run_dir, ["--max_iters", "1000", "--step_time", "0.03"])
    wait_for(lambda: heartbeat(run_dir) >= 3)
    monitor.send_signal(signum)
    stderr = finish(monitor)
    assert monitor.returncode == 128 + signum
    # The trainer got the signal, checkpointed the step it was on and exited on its own.
    stopped_at = int((run_dir / "stop_step").read_text())
    assert (run_dir / "ckpt" / f"step_{stopped_at:06d}" / "manifest.json").exists()
    assert f"signal={signal.Signals(signum).name} forwarded" in events(run_dir, "STOP")[0]
    assert len(events(run_dir, "START")) == 1 and events(run_dir, "RESTART") == []
    assert "result=interrupted" in stderr


def test_remote_mode_runs_through_ssh_and_restarts(tmp_path):
    """A stand-in `ssh` on PATH runs the remote line locally, checking the options it got."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    ssh = fake_bin / "ssh"
    ssh.write_text('#!/bin/sh\n[ "$1 $2 $3 $4" = "-tt -o BatchMode=yes me@gpu-node" ] || exit 97\n'
                   'exec /bin/sh -c "$5"\n')
    ssh.chmod(0o755)
    run_dir = tmp_path / "run"
    trainer_args = ["--max_iters", "20", "--crash_after_steps", "12"]
    monitor = subprocess.Popen(
        [sys.executable, str(REPO / "monitor_process.py"), *FAST, "--remote", "me@gpu-node",
         "--remote_dir", str(REPO), "--", *FAKE_TRAINER, "--out_dir", str(run_dir),
         *trainer_args], cwd=tmp_path / "bin", stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}"})
    # (cwd is not the repo: the remote side must cd to --remote_dir to find
    # tests.monitor.fake_trainer)
    stderr = finish(monitor)
    assert monitor.returncode == 0, stderr
    assert all("command=ssh -tt -o BatchMode=yes me@gpu-node " in line
               for line in events(run_dir, "START"))
    assert len(events(run_dir, "RESTART")) == 1
    assert (json.loads((run_dir / "final_state.json").read_text())
            == reference_state(tmp_path, ["--max_iters", "20"]))


# ---- one writer per run dir; nothing outlives the supervisor -----------------------------------

def test_a_run_dir_in_use_is_refused_before_starting_anything(tmp_path):
    run_dir = tmp_path / "run"
    lock = RunLock(run_dir)
    lock.acquire()
    try:
        monitor = start_monitor(run_dir, ["--max_iters", "3"])
        stderr = finish(monitor)
    finally:
        lock.release()
    assert monitor.returncode == 2, stderr
    assert f"run dir {run_dir} is in use by PID {os.getpid()}" in stderr
    assert events(run_dir, "START") == [] and not (run_dir / "heartbeat").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_kill9_of_the_supervisor_takes_its_run_down(tmp_path):
    run_dir = tmp_path / "run"
    monitor = start_monitor(run_dir, ["--max_iters", "100000", "--step_time", "0.05"])
    try:
        # (the supervisor logs START once Popen returns: a fast child may beat it to a step)
        wait_for(lambda: heartbeat(run_dir) >= 1 and started_pids(run_dir))
        (trainer,) = started_pids(run_dir)
        monitor.kill()
        monitor.wait()
        wait_for(lambda: is_dead(trainer), timeout=10)
    finally:
        for pid in started_pids(run_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_torchruns_own_traceback_after_a_stop_is_one_line(tmp_path):
    """torchrun answers the forwarded Ctrl-C by stopping its rank and re-raising its
    SignalException (~30 lines of its own traceback): the monitor shows one line for it."""
    run_dir = tmp_path / "run"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node=1", "-m", "tests.monitor.fake_trainer"]
    monitor = subprocess.Popen(
        [sys.executable, "monitor_process.py", *FAST, "--max_restarts", "0", "--", *torchrun,
         "--out_dir", str(run_dir), "--max_iters", "1000", "--step_time", "0.03"],
        cwd=REPO, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: heartbeat(run_dir) >= 3)
    monitor.send_signal(signal.SIGINT)
    stderr = finish(monitor)
    assert monitor.returncode == 128 + signal.SIGINT
    assert "Traceback" not in stderr, stderr
    said = [line for line in stderr.splitlines() if "SignalException" in line]
    assert len(said) == 1 and "TORCHRUN_STOPPED signal=SIGINT" in said[0], stderr
    assert events(run_dir, "TORCHRUN_STOPPED")
