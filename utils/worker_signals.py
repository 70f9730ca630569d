"""DataLoader workers leave a stop to the trainer, and die with it.

A supervisor, SLURM or Kubernetes stops a job by signalling its whole process group, and
DataLoader workers are in it. A worker that died of the SIGTERM first would make the trainer
fail with "DataLoader worker ... killed by signal" before it could write its checkpoint, so
workers ignore the stop signals: the trainer finishes its step, checkpoints and exits, and
its workers are shut down with it. If the trainer is killed outright (SIGKILL, the OOM
killer), the kernel kills its workers too (utils/parent_death.py): a worker busy with a batch
would otherwise not notice for as long as the batch takes.
"""

from __future__ import annotations

import multiprocessing
import signal

from utils.parent_death import die_with_parent

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def ignore_stop_signals(worker_id: int = 0) -> None:
    """A DataLoader `worker_init_fn`: SIGTERM / SIGINT / SIGHUP no longer end this process."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def init_loader_worker(worker_id: int = 0) -> None:
    """The `worker_init_fn` of every DataLoader: leave stops to the trainer, die with it
    (even if it died while this worker was starting: its pid is checked)."""
    ignore_stop_signals(worker_id)
    trainer = multiprocessing.parent_process()
    die_with_parent(signal.SIGKILL, None if trainer is None else trainer.pid)
