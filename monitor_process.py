"""Supervise a training run: restart it from its newest checkpoint when it crashes or hangs.

    python monitor_process.py --max_restarts 5 --out_dir out/run1 -- \\
        torchrun --nproc_per_node 8 train_my_ddp.py --task_type=pretrain ...

Long runs die for reasons unrelated to the code: a node reboots, a NCCL collective times out,
one rank stops making progress while the others wait forever in an all-reduce. This
supervisor turns those into a short pause:

1. it starts the command in its own process group and keeps track of every process below it
   (torchrun starts each rank in a session of its own), so that a signal reaches all of them
   and nothing is left behind. It first checks the run dir's lock (utils/run_directory.py): a
   run dir in use by a live trainer is refused at start, and a relaunch waits up to
   `--kill_grace` seconds for the old holder to go;
2. it watches the exit status and `<run>/heartbeat`, which the trainer rewrites every step. A
   live process whose heartbeat has not changed for `--heartbeat_timeout` seconds is hung.
   Until the first new heartbeat of an attempt, `--startup_timeout` applies instead (loading
   data, building and compiling the model take longer than one step);
3. on a crash or a hang it kills all of them (SIGTERM and SIGCONT, so that stopped ranks can
   act on it; SIGKILL to whatever is left after `--kill_grace` seconds), waits
   `restart_delay * 2**k` seconds before the k-th relaunch (k = 0, 1, ...; capped by
   `--max_restart_delay`) and relaunches the command with `--resume --out_dir=<run>`. The
   trainer loads its newest valid checkpoint (data order and RNG included) and goes on as if
   nothing had happened. (A run that died before its first checkpoint starts over: the
   relaunch gets no `--resume`);
4. it gives up after `--max_restarts` relaunches, or earlier when `--stuck_after` consecutive
   failures ended at the same step: a crash that repeats deterministically is a bug to fix,
   not bad luck to retry; and at once, exit code 2, when the command refused its input (it
   exited 2, or under torchrun a rank did: an unknown option, a damaged file), repeating the
   command's error line: the same command would be refused again;
5. SIGINT/SIGTERM sent to the supervisor are forwarded to the run's group (the trainer
   checkpoints and exits); the supervisor then exits too, without restarting. A second
   signal SIGKILLs the group.

Every event goes to `<run>/monitor.log` (and stderr), one per line, timestamp first:

    2026-11-22T01:02:03.456Z START attempt=1 pid=4242 command=torchrun ... --out_dir=out/run1
    2026-11-22T01:09:11.002Z EXIT attempt=1 cause="signal SIGKILL" step=1234
    2026-11-22T01:09:11.003Z RESTART attempt=2 restart=1/5 cause="signal SIGKILL" \
                                     resume_step=1200 delay=10.0s  (one line in the file)
    2026-11-22T01:09:21.010Z START attempt=2 pid=4377 command=torchrun ... --resume
    2026-11-22T01:09:40.120Z RESUMED attempt=2 step=1200 checkpoint=out/run1/ckpt/step_001200
    2026-11-22T03:15:00.000Z SUMMARY result=succeeded attempts=2 restarts=1 last_step=5000 ...

The resume step in RESTART is read from files only (the newest `ckpt/step_*/manifest.json`);
RESUMED is the trainer's own `{"kind": "resume"}` line in metrics.jsonl, confirming it.

Exit status: 0 the run finished; 1 gave up after --max_restarts (or the run dir stayed locked);
3 stuck (same step again and again); 128+N stopped by signal N (130 for Ctrl-C, 143 for
SIGTERM); 2 bad usage, the command refused its input (step 4), the run dir is in use by
another live trainer or supervisor (monitor/supervisor_lock.py), or it is not a run's: a
directory holding anything a z2all run does not write gets no lock, no log and no launch
(utils/run_ownership.py; a new or empty directory, or a run's own, is supervised).

`--remote user@host` runs the command with `ssh -tt -o BatchMode=yes user@host 'cd DIR &&
exec ...'`: `-tt` gives the remote side a terminal, so killing the local ssh hangs it up and
the remote process group dies with it; BatchMode forbids password prompts (key-based auth
only; no secrets are ever passed). The run dir must then be readable here at the same path
(a shared filesystem) for hang detection, or pass `--heartbeat_timeout 0` to watch exit
status only.

A multi-node run gets one supervisor on every node, each supervising its own node's torchrun
agent (docs/design.md, "Multi-node runs"):

    node0$ python monitor_process.py --out_dir /shared/run1 -- torchrun --nnodes=2 \\
               --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=node0:29500 \\
               --rdzv_id=run1 train_my_ddp.py ...          (the same command on node1)

A command with `torchrun --nnodes` above 1 (or `--node_name`) makes the supervisor a node's:
its lock and log are `<run>/nodes/<node>.monitor.lock` and `.monitor.log` (<node>: --node_name,
default this host's name), so the supervisors of one run do not refuse each other, while a
second supervisor on the same node is still refused. A rank that dies on one node ends the
collectives of all, so every agent exits; each supervisor relaunches its own with --resume,
the agents meet again at the rendezvous, and the run continues from its newest complete
checkpoint (all nodes read the same run dir). Every supervisor watches the one heartbeat.
`--remote` instead drives a single command on another host from here: use it for a run on
one remote machine; for several nodes, run one supervisor on each (or let SLURM start them:
slurm/train_supervised.sbatch).

If the supervisor itself is killed (even with SIGKILL), the run goes down with it on Linux: the
command it starts gets `PR_SET_PDEATHSIG` = SIGKILL (utils/parent_death.py), and torchrun's
ranks set the same for themselves, so nothing trains on unsupervised. Elsewhere the run keeps
going in its own session, and a new supervisor refuses the run dir while it is locked.
The supervisor imports nothing of the trainer: it reads and locks-checks the run dir's files
through utils/run_directory.py, the module the trainer writes them with.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from monitor.attempt import Attempt, AttemptWatch, StopSignals, progress_step
from monitor.event_log import EventLog
from monitor.supervisor_lock import only_supervisor
from utils.cli_errors import EXIT_BAD_INPUT, run_main
from utils.option_checks import join_problems, range_problem
from utils.option_parser import OptionParser, underscored
from utils.run_directory import lock_holder, newest_checkpoint_step, supervisor_files
from utils.run_ownership import not_a_run_dir_problem

EXIT_GAVE_UP = 1
EXIT_STUCK = 3
EXIT_IN_USE = 2


@dataclass
class MonitorConfig:
    out_dir: str | None = field(default=None, metadata={
        "help": "run dir; default: the command's own --out_dir (one of the two is needed)"})
    max_restarts: int = field(default=10, metadata={"help": "relaunches before giving up"})
    restart_delay: float = field(default=10.0, metadata={
        "help": "seconds before the first relaunch; doubles with each further one"})
    max_restart_delay: float = field(default=300.0, metadata={"help": "cap on that delay"})
    heartbeat_timeout: float = field(default=900.0, metadata={
        "help": "seconds without a new heartbeat that count as a hang (longer than the "
                "slowest eval or checkpoint save); 0 disables hang detection"})
    startup_timeout: float = field(default=1800.0, metadata={
        "help": "grace before the first heartbeat of each attempt (start-up, compile)"})
    kill_grace: float = field(default=30.0, metadata={
        "help": "seconds between SIGTERM and SIGKILL when killing the run's processes"})
    stuck_after: int = field(default=3, metadata={
        "help": "give up after this many consecutive failures at the same step; 0 disables"})
    remote: str | None = field(default=None, metadata={
        "help": "user@host: run the command there over ssh (key-based auth only)"})
    remote_dir: str | None = field(default=None, metadata={
        "help": "directory to run in on the remote host (default: this one's path)"})
    node_name: str | None = field(default=None, metadata={
        "help": "this node's name when each node of a multi-node run has its own supervisor: "
                "its lock and log are <run>/nodes/<name>.monitor.lock/.log (default, for a "
                "command with torchrun --nnodes above 1: this host's name)"})


# ---- the command line of the run ---------------------------------------------------------------

def command_out_dir(command: list[str]) -> str | None:
    """The value of `--out_dir` in a command (`--out_dir=X` or `--out_dir X`, or dashed as
    `--out-dir`, which the trainer reads too), if any."""
    for index, arg in enumerate(command):
        name, equals, value = arg.partition("=")
        if underscored(name) != "--out_dir":
            continue
        if equals:
            return value
        if index + 1 < len(command):
            return command[index + 1]
    return None


def torchrun_max_nodes(command: list[str]) -> int:
    """The most nodes torchrun's `--nnodes` allows in `command` (`2`, or `1:4` for an elastic
    range); 1 without the option or when it cannot be read (torchrun then says why)."""
    for index, arg in enumerate(command):
        name, equals, value = arg.partition("=")
        if name != "--nnodes":
            continue
        if not equals:
            value = command[index + 1] if index + 1 < len(command) else ""
        maximum = value.rpartition(":")[2]
        return int(maximum) if maximum.isdigit() else 1
    return 1


def with_run_flags(command: list[str], run_dir: str, resume: bool) -> list[str]:
    """`command` with `--out_dir=<run_dir>` (and `--resume`) present exactly once.

    An existing `--out_dir` is kept (it names the same run dir); an existing `--resume` or
    `--resume=false` becomes `--resume`, so relaunching never stacks duplicate flags.
    """
    result = list(command)
    if command_out_dir(result) is None:
        result.append(f"--out_dir={run_dir}")
    if resume:
        result = [arg for arg in result if underscored(arg.partition("=")[0]) != "--resume"]
        result.append("--resume")
    return result


def over_ssh(command: list[str], remote: str, remote_dir: str) -> list[str]:
    """Wrap `command` to run on `remote`; see the module docstring for why `-tt` and BatchMode."""
    remote_line = f"cd {shlex.quote(remote_dir)} && exec {shlex.join(command)}"
    return ["ssh", "-tt", "-o", "BatchMode=yes", remote, remote_line]


def backoff_delay(restart_index: int, base: float, cap: float) -> float:
    """Seconds to wait before relaunch number `restart_index` (0-based): base * 2**k, capped."""
    return min(base * 2.0 ** restart_index, cap)


# ---- the restart policy and the attempt loop ---------------------------------------------------
# One attempt (start, watch, kill) lives in monitor/attempt.py; this loop judges each attempt
# and decides: relaunch, give up or stop.

def repeats_without_progress(failures: list[Attempt], stuck_after: int) -> bool:
    """True when the last `stuck_after` failures all ended at the same step (0: never)."""
    recent = failures[-stuck_after:] if stuck_after > 0 else []
    return len(recent) == stuck_after > 0 and len({failure.step for failure in recent}) == 1


class Supervisor:
    """The attempt loop of the module docstring: launch, judge the attempt, relaunch or stop."""

    def __init__(self, config: MonitorConfig, command: list[str], run_dir: Path):
        self.config = config
        self.command = command
        self.run_dir = run_dir
        self.lock_file, log_file = supervisor_files(config.node_name)
        self.log = EventLog(run_dir / log_file)
        self.stop = StopSignals(self.log)
        self.attempts = AttemptWatch(run_dir, self.log, self.stop,
                                     startup_timeout=config.startup_timeout,
                                     heartbeat_timeout=config.heartbeat_timeout,
                                     kill_grace=config.kill_grace)
        self.start = time.monotonic()

    def run(self) -> int:
        self.start = time.monotonic()
        self.stop.install()
        config = self.config
        failures: list[Attempt] = []
        command = with_run_flags(self.command, str(self.run_dir), resume=False)
        if holder := lock_holder(self.run_dir):
            self.log.event("REFUSED", f"run dir in use by {holder}")
            print(f"monitor_process: error: run dir {self.run_dir} is in use by {holder}; "
                  "stop that run first", file=sys.stderr, flush=True)
            return EXIT_IN_USE
        for restart in range(config.max_restarts + 1):
            if restart and (holder := self.wait_until_unlocked(config.kill_grace)):
                return self.finish("gave_up", f"run dir {self.run_dir} still in use by {holder} "
                                   f"{config.kill_grace}s after the run was killed; not "
                                   "relaunching over it", EXIT_GAVE_UP, restart)
            attempt = self.attempts.run(restart + 1, self.launchable(command))
            if self.stop.received:
                return self.interrupted(attempt.number)
            if attempt.cause is None:
                return self.finish("succeeded", "the run finished", 0, attempt.number)
            failures.append(attempt)
            if attempt.refused:
                return self.finish("refused", f"the command refused its input ({attempt.refused}"
                                   "); fix the command, then rerun", EXIT_BAD_INPUT,
                                   attempt.number)
            if repeats_without_progress(failures, config.stuck_after):
                return self.finish(
                    "stuck", f"{config.stuck_after} consecutive failures at step {attempt.step} "
                    f"without progress (last: {attempt.cause}); fix the cause, then rerun "
                    "with --resume", EXIT_STUCK, attempt.number)
            if restart == config.max_restarts:
                break
            delay = backoff_delay(restart, config.restart_delay, config.max_restart_delay)
            resume_step = self.announce_restart(restart, attempt, delay)
            if not self.stop.sleep_unless_stopped(delay):
                return self.interrupted(attempt.number)
            # Without a checkpoint the trainer would refuse --resume: start over instead.
            command = with_run_flags(self.command, str(self.run_dir),
                                     resume=resume_step is not None)
        last = failures[-1]
        return self.finish("gave_up", f"gave up after max_restarts={config.max_restarts} "
                           f"(last failure: {last.cause} at step {last.step})",
                           EXIT_GAVE_UP, last.number)

    def announce_restart(self, restart: int, attempt: Attempt, delay: float) -> int | None:
        """Log the RESTART line; return the step the relaunch will resume from (None: none)."""
        config = self.config
        resume_step = newest_checkpoint_step(self.run_dir)
        self.log.event("RESTART", f"attempt={attempt.number + 1} restart={restart + 1}/"
                                  f'{config.max_restarts} cause="{attempt.cause}" '
                                  f"resume_step={resume_step} delay={delay:.1f}s"
                                  + (" (no checkpoint yet: starting over)"
                                     if resume_step is None else ""))
        return resume_step

    def wait_until_unlocked(self, seconds: float) -> str | None:
        """None once no live trainer holds the run dir's lock, else who still holds it."""
        deadline = time.monotonic() + seconds
        while (holder := lock_holder(self.run_dir)) and time.monotonic() < deadline:
            time.sleep(0.1)
        return holder

    def launchable(self, command: list[str]) -> list[str]:
        if self.config.remote is None:
            return command
        return over_ssh(command, self.config.remote, self.config.remote_dir or os.getcwd())

    def finish(self, result: str, reason: str, exit_code: int, attempts: int) -> int:
        last_step = progress_step(self.run_dir)
        self.log.event("SUMMARY", f"result={result} attempts={attempts} "
                                  f"restarts={attempts - 1} last_step={last_step} "
                                  f"elapsed={time.monotonic() - self.start:.1f}s "
                                  f'reason="{reason}"')
        if exit_code != 0:
            print(f"monitor_process: {reason}", file=sys.stderr, flush=True)
        return exit_code

    def interrupted(self, attempts: int) -> int:
        signum = self.stop.received[0]
        return self.finish("interrupted", f"stopped by {signal.Signals(signum).name}; "
                           "not restarted", 128 + signum, attempts)


# ---- command line ------------------------------------------------------------------------------

def node_name_problem(node_name: str | None) -> str | None:
    if node_name is None or re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", node_name):
        return None
    return (f"--node_name={node_name}: use letters, digits, '.', '_' and '-' only (it names "
            "files in the run dir)")


def parse_args(argv: list[str]) -> tuple[MonitorConfig, list[str]]:
    """Options before `--`, the training command after it."""
    parser = OptionParser(
        description="Run a training command; restart it with --resume when it crashes or hangs.",
        usage="python monitor_process.py [options] -- <training command ...>")
    for option in dataclasses.fields(MonitorConfig):
        kind = {"int": int, "float": float}.get(str(option.type), str)
        default = "" if option.default is None else f" (default: {option.default})"
        parser.add_argument(f"--{option.name}", type=kind, default=option.default,
                            help=option.metadata["help"] + default)
    if "--" not in argv:
        parser.parse_args(argv)  # answers --help; otherwise falls through to the error below
        parser.error("put the training command after `--`")
    split = argv.index("--")
    config = MonitorConfig(**vars(parser.parse_args(argv[:split])))
    command = argv[split + 1:]
    if not command:
        parser.error("the training command after `--` is empty")
    own_out_dir = command_out_dir(command)
    if config.out_dir is None and own_out_dir is None:
        parser.error("give --out_dir (or --out_dir in the command): the run dir holds the "
                     "heartbeat and checkpoints the supervisor watches")
    if config.out_dir and own_out_dir and Path(config.out_dir) != Path(own_out_dir):
        parser.error(f"--out_dir {config.out_dir} differs from the command's {own_out_dir}")
    config.out_dir = config.out_dir or own_out_dir
    if config.node_name is None and torchrun_max_nodes(command) > 1:
        config.node_name = socket.gethostname()
    problem = join_problems([
        node_name_problem(config.node_name),
        range_problem("--max_restarts", config.max_restarts, 0),
        range_problem("--stuck_after", config.stuck_after, 0),
        *(range_problem(f"--{name}", getattr(config, name), 0)
          for name in ("restart_delay", "max_restart_delay", "heartbeat_timeout",
                       "startup_timeout", "kill_grace"))])
    if problem:
        parser.error(problem)
    return config, command


def main(argv: list[str] | None = None) -> int:
    config, command = parse_args(sys.argv[1:] if argv is None else argv)
    # Its lock and log go into the run dir: only into a new or empty one or a run's own.
    problem = not_a_run_dir_problem(Path(config.out_dir), f"--out_dir={config.out_dir}")
    if problem:
        raise ValueError(problem)  # bad input: one line, exit 2, nothing written
    supervisor = Supervisor(config, command, Path(config.out_dir))
    with only_supervisor(config.out_dir, supervisor.lock_file):  # before anything is launched
        return supervisor.run()


if __name__ == "__main__":
    sys.exit(run_main(main))
