"""DataLoader workers leave a stop to the trainer.

A supervisor, SLURM or Kubernetes stops a job by signalling its whole process group, and
DataLoader workers are in it. A worker that died of the SIGTERM first would make the trainer
fail with "DataLoader worker ... killed by signal" before it could write its checkpoint, so
workers ignore the stop signals: the trainer finishes its step, checkpoints and exits, and
its workers are shut down with it (they also exit on their own when the trainer is gone).
"""

from __future__ import annotations

import signal

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def ignore_stop_signals(worker_id: int = 0) -> None:
    """A DataLoader `worker_init_fn`: SIGTERM / SIGINT / SIGHUP no longer end this process."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
