"""Imported by the worker pool's forkserver, and only there: the import makes that process die
with the program that started it.

The data tools' workers (worker_pool.py) fork from a forkserver, a process of its own that the
program starts once. If the program is killed outright (SIGKILL, the OOM killer, a `timeout`
around it), nothing would stop the forkserver: each worker holds the pipe the forkserver waits
on to see its clients gone, and a worker busy with a batch never reads its (now dead) task
queue. Both would run on as orphans (one spun for 18 minutes, issue #38). So the kernel is
asked to kill the forkserver with its parent (utils/parent_death.py), and each worker with the
forkserver (worker_pool.start_pool), so the chain ends with the program.

`worker_pool.worker_context()` names this module in the forkserver's preload list, which the
forkserver imports before it forks anything. The setting is made at import because a preload
list can do nothing but import; importing this module anywhere else would tie *that* process
to its parent, so nothing else does. The kernel watches the *thread* that started the
forkserver (utils/parent_death.py), so pools are started from the main thread, as they are.
"""

from __future__ import annotations

import signal

from utils.parent_death import die_with_parent

die_with_parent(signal.SIGKILL)
