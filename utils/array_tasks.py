"""One task of a job array: which share of the input files this process works on.

A data tool run as N independent tasks (a SLURM array, N shells, N machines) takes
`--num_tasks N --task_index I`; by default they come from the SLURM array the process runs in
(`SLURM_ARRAY_TASK_COUNT`, and `SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN`, so `--array=1-3`
works as well as `--array=0-2`), and outside an array a run is the single task 0 of 1.

The share is deterministic and needs no talking between tasks: every task lists the same
input files in the same sorted order and takes those whose position p has p % N == I. Each
file's output depends on that file alone, so N tasks write exactly the bytes one task would.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

Item = TypeVar("Item")


@dataclass(frozen=True)
class TaskShare:
    num_tasks: int
    index: int

    @property
    def alone(self) -> bool:
        """Whether this is the only task (the plain one-machine run)."""
        return self.num_tasks == 1

    @property
    def label(self) -> str:
        """`task-I-of-N`: names this task's own files (ledger, report) in a shared folder."""
        return f"task-{self.index}-of-{self.num_tasks}"

    def take(self, items: Sequence[Item]) -> list[Item]:
        """This task's share of `items` (already in their one sorted order)."""
        return list(items[self.index::self.num_tasks])


THE_ONLY_TASK = TaskShare(1, 0)  # a plain run: every file, the folder's one ledger and report


def _from_environment(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a whole number; unset it or pass "
                         "--num_tasks/--task_index") from None


def add_task_arguments(parser: argparse.ArgumentParser) -> None:
    """--num_tasks and --task_index (None: from the SLURM array, else 1 and 0)."""
    parser.add_argument("--num_tasks", type=int, default=None,
                        help="split the input files among N independent tasks (default: "
                             "SLURM_ARRAY_TASK_COUNT, else 1)")
    parser.add_argument("--task_index", type=int, default=None,
                        help="which of the N tasks this is, 0..N-1 (default: SLURM_ARRAY_TASK_ID"
                             " - SLURM_ARRAY_TASK_MIN, else 0)")


def task_share(num_tasks: int | None, task_index: int | None,
               environ: Mapping[str, str] | None = None) -> TaskShare:
    """The share the options (or, where they are None, the SLURM array) name; a ValueError
    naming the option when it is not 0 <= index < count."""
    environ = os.environ if environ is None else environ
    count_from = index_from = "option"
    if num_tasks is None:
        num_tasks = _from_environment(environ, "SLURM_ARRAY_TASK_COUNT")
        count_from = "SLURM_ARRAY_TASK_COUNT"
    if task_index is None:
        task_id = _from_environment(environ, "SLURM_ARRAY_TASK_ID")
        if task_id is not None:
            task_index = task_id - (_from_environment(environ, "SLURM_ARRAY_TASK_MIN") or 0)
            index_from = "SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN"
    num_tasks = 1 if num_tasks is None else num_tasks
    task_index = 0 if task_index is None else task_index
    if num_tasks < 1:
        raise ValueError(f"--num_tasks must be >= 1, got {num_tasks}"
                         + ("" if count_from == "option" else f" (from {count_from})"))
    if not 0 <= task_index < num_tasks:
        source = "" if index_from == "option" else f" (from {index_from})"
        raise ValueError(f"--task_index must be in [0, {num_tasks - 1}] for --num_tasks "
                         f"{num_tasks}, got {task_index}{source}")
    return TaskShare(num_tasks, task_index)
