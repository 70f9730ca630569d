"""One attempt of a supervised run: start the command, watch it, kill all of it on failure.

An attempt ends in one of three ways, and `AttemptWatch.run` returns an `Attempt` saying which:
- exit code 0: the run finished (`cause` None);
- any other exit: a crash, e.g. `cause="exit code 3"` or `cause="signal SIGKILL"`;
- a live process whose heartbeat stopped changing: `cause="hang (no heartbeat for 900.2s)"`.
A crash that is the command refusing its input (exit code 2, utils/cli_errors.py; under
torchrun, the code of its first failed rank) also carries the command's error line
(`refused`): rerunning the same command cannot help.
On a crash or a hang every process of the attempt is killed (steps 2 and 3 of
monitor_process.py's docstring). `StopSignals` records Ctrl-C / SIGTERM sent to the supervisor
and forwards them to the attempt's processes. Progress is read from the run directory's files
only (utils/run_directory.py).
"""

from __future__ import annotations

import contextlib
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from monitor.event_log import EventLog
from monitor.process_tree import RunProcesses
from monitor.stderr_relay import StderrRelay
from utils.cli_errors import EXIT_BAD_INPUT
from utils.parent_death import die_with_parent
from utils.run_directory import HeartbeatWatch, ResumeLines, heartbeat_step, newest_checkpoint_step


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:  # e.g. a real-time signal
        return str(signum)


def progress_step(run_dir: Path) -> int | None:
    """How far the run got: its last heartbeat, else its newest checkpoint (files only)."""
    step = heartbeat_step(run_dir)
    return step if step is not None else newest_checkpoint_step(run_dir)


@dataclass
class Attempt:
    number: int
    cause: str | None  # None: exit code 0; else "exit code 3", "signal SIGKILL", "hang (...)"
    step: int | None   # how far the run got: its last heartbeat, else its newest checkpoint
    refused: str | None = None  # the command's error line when it exited 2 (bad input)


class StopSignals:
    """SIGINT/SIGTERM sent to the supervisor: recorded, forwarded to the run, logged later.

    Signal handlers run between two bytecodes of the main loop: they only record and forward
    (os.kill is safe there); the main loop writes the log line (`log_new`), which is not.
    """

    def __init__(self, log: EventLog):
        self.log = log
        self.received: list[int] = []
        self.logged = 0
        self.run: RunProcesses | None = None  # the attempt's processes, once one started

    def install(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self.on_signal)

    def on_signal(self, signum: int, _frame: object) -> None:
        self.received.append(signum)
        if self.run is not None and self.run.leader.returncode is None:
            first = len(self.received) == 1
            self.run.signal(signum if first else signal.SIGKILL)

    def log_new(self) -> None:
        for signum in self.received[self.logged:]:
            action = ("forwarded to the run's processes; no restart"
                      if self.logged == 0 else "again: SIGKILL the run's processes")
            self.log.event("STOP", f"signal={signal.Signals(signum).name} {action}")
            self.logged += 1

    def sleep_unless_stopped(self, seconds: float) -> bool:
        """Sleep `seconds`; False (early) if a stop signal arrives."""
        deadline = time.monotonic() + seconds
        while not self.received and time.monotonic() < deadline:
            time.sleep(min(0.05, seconds))
        self.log_new()
        return not self.received


class AttemptWatch:
    """One launch of the command: start it, watch exit status and heartbeat, kill it on failure."""

    def __init__(self, run_dir: Path, log: EventLog, stop: StopSignals, *, startup_timeout: float,
                 heartbeat_timeout: float, kill_grace: float):
        self.run_dir = run_dir
        self.log = log
        self.stop = stop
        self.startup_timeout = startup_timeout
        self.heartbeat_timeout = heartbeat_timeout
        self.kill_grace = kill_grace
        self.poll_seconds = min(1.0, heartbeat_timeout / 10 or 1.0)

    def run(self, number: int, command: list[str]) -> Attempt:
        heartbeat = HeartbeatWatch(self.run_dir, self.startup_timeout, self.heartbeat_timeout)
        resumes = ResumeLines(self.run_dir)
        process = subprocess.Popen(command, start_new_session=True,
                                   stderr=subprocess.PIPE,  # through monitor/stderr_relay.py
                                   preexec_fn=self.die_with_supervisor)
        relay = StderrRelay(process.stderr, lambda: bool(self.stop.received), self.log)
        processes = RunProcesses(process)
        self.stop.run = processes
        self.log.event("START", f"attempt={number} pid={process.pid} "
                                f"command={shlex.join(command)}")
        try:
            attempt = self.outcome(number, processes, heartbeat, resumes)
        finally:
            relay.join(timeout=self.kill_grace)  # its last lines, before the next attempt's
        if attempt.cause is not None:
            attempt.refused = relay.refused_line(process.returncode, EXIT_BAD_INPUT)
        return attempt

    def outcome(self, number: int, processes: RunProcesses, heartbeat: HeartbeatWatch,
                resumes: ResumeLines) -> Attempt:
        """Watch the attempt to its end; kill what is left of it unless it succeeded."""
        process = processes.leader
        hang_seconds = self.watch(number, processes, heartbeat, resumes)
        step = progress_step(self.run_dir)
        if hang_seconds is not None:
            cause = f"hang (no heartbeat for {hang_seconds:.1f}s)"
            self.log.event("HANG", f"attempt={number} step={step} pgid={process.pid}: "
                                   f"{cause}; killing all its processes")
        else:
            code = process.returncode
            if code == 0:
                self.log.event("EXIT", f"attempt={number} code=0 step={step}")
                return Attempt(number, None, step)
            cause = f"exit code {code}" if code > 0 else f"signal {signal_name(-code)}"
            self.log.event("EXIT", f'attempt={number} cause="{cause}" step={step}')
        self.kill(processes)
        return Attempt(number, cause, step)

    def watch(self, number: int, processes: RunProcesses, heartbeat: HeartbeatWatch,
              resumes: ResumeLines) -> float | None:
        """Poll until the command exits (None) or its heartbeat is overdue (seconds silent)."""
        while True:
            with contextlib.suppress(subprocess.TimeoutExpired):
                processes.leader.wait(timeout=self.poll_seconds)
            self.stop.log_new()
            for record in resumes.new():
                self.log.event("RESUMED", f"attempt={number} step={record.get('step')} "
                                          f"checkpoint={record.get('checkpoint')}")
            processes.refresh()
            if processes.leader.returncode is not None:
                return None
            if (hang_seconds := heartbeat.overdue_seconds()) is not None:
                return hang_seconds

    def kill(self, processes: RunProcesses) -> None:
        """SIGTERM + SIGCONT every process of the run, wait `kill_grace`, SIGKILL the rest.

        SIGCONT because a stopped process acts on SIGTERM only once resumed. Ranks that
        outlive the leader (or ignore SIGTERM) must not linger holding GPUs and ports.
        """
        processes.refresh()
        processes.signal(signal.SIGTERM)
        processes.signal(signal.SIGCONT)
        deadline = time.monotonic() + self.kill_grace
        while processes.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if processes.alive():
            self.log.event("KILL", f"still alive after {self.kill_grace}s: SIGKILL "
                                   f"pgid={processes.leader.pid} pids={sorted(processes.known)}")
        processes.signal(signal.SIGKILL)
        processes.leader.wait()

    @staticmethod
    def die_with_supervisor() -> None:
        """In the child between fork and exec: SIGKILL it if the supervisor dies (Linux)."""
        die_with_parent(signal.SIGKILL)
