"""One trainer per run dir: rank 0 claims it for the whole run, and every rank hears the verdict.

    with exclusive_run_dir(options.run, env) as claim:   # train_my_ddp.py:main
        ... build the run ...
        claim.started = True                              # from here the dir is the run's record
        ... the loop asks claim.moved() after every step, and when a checkpoint save fails ...

Who may own a directory (a fresh run, --resume, --overwrite) is utils/run_ownership.py's rule,
asked by rank 0 alone (`claim_run_dir`: the lock first, then the contents); this module holds
that claim across the ranks and the run's lifetime: a problem is broadcast, so that every rank
exits at once instead of waiting for rank 0 in a collective, and a start that fails before the
loop removes the directory it created, so nothing that looks like a run is left behind. On
several ranks the same broadcast carries the token rank 0 wrote into the claimed directory,
which every rank then reads back through its own `--out_dir` (trainer/shared_filesystem.py).
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from trainer.distributed_env import DistributedEnv, broadcast_from_main
from trainer.options import RunOptions
from trainer.shared_filesystem import write_check_token
from utils.run_directory import RunDirInUse, RunLock
from utils.run_ownership import RunDirHoldsARun, claim_run_dir


@dataclass
class RunDirClaim:
    notes: list[str]                # to print at start
    lock: RunLock | None = None     # rank 0's
    started: bool = False           # the loop began: from then on the dir is the run's record
    check_token: str | None = None  # several ranks: rank 0's token in the dir, for every rank

    def moved(self) -> bool:
        """Rank 0: the run dir was moved or replaced since it was locked (other ranks: False)."""
        return self.lock is not None and not self.lock.in_place()


@contextlib.contextmanager
def exclusive_run_dir(run_options: RunOptions, env: DistributedEnv) -> Iterator[RunDirClaim]:
    """Rank 0 claims the run dir (`claim_run_dir`: its lock first, then a fresh run refuses one
    holding another run or moves it aside with --overwrite) and holds the lock while the run
    lasts; every rank exits at once on a problem. On several ranks rank 0 then writes the
    shared-filesystem check's token into it, and the verdict carries it to every rank
    (`claim.check_token`). A start that fails before the loop removes the directory it
    created, so nothing that looks like a run is left behind."""
    run_dir = Path(run_options.out_dir)
    created = env.is_main and not run_dir.exists()
    claim, problem = RunDirClaim([]), None
    try:
        if env.is_main:
            try:  # every rank must hear of a problem (the token's write too), or they wait
                claim.lock, claim.notes = claim_run_dir(run_dir, run_options.resume,
                                                        run_options.overwrite)
                if env.is_distributed:
                    claim.check_token = write_check_token(run_dir)
            except (RunDirInUse, RunDirHoldsARun, OSError) as error:
                problem = str(error)
        problem, claim.check_token = broadcast_from_main((problem, claim.check_token), env)
        if problem:
            raise ValueError(problem)  # bad input: exit code 2
        yield claim
    finally:
        if claim.lock is not None:
            claim.lock.release()
            if created and not claim.started:
                shutil.rmtree(run_dir, ignore_errors=True)
