"""All processes of a supervised run: its process group plus every descendant ever seen.

Why a process group is not enough: torchrun starts each rank in a session of its own, so
`killpg` on torchrun's group misses the ranks; and a rank that outlives torchrun is
re-parented to init, so it has to be remembered while the parent link still exists.
Linux only for the descendants (/proc); elsewhere only the process group is reached.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path


def proc_stat(pid: int | str) -> list[str] | None:
    """Fields 3.. of /proc/<pid>/stat (state, ppid, ..., starttime at [19]); None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()  # the command name, in parentheses, may hold spaces


class RunProcesses:
    """The processes of one attempt, to signal them all.

    `refresh()` (call it every poll) records descendants as (pid, start time) from /proc; the
    start time guards against a recycled pid, and zombies count as gone.
    """

    def __init__(self, leader: subprocess.Popen):
        self.leader = leader
        self.known: dict[int, str] = {}  # pid -> start time

    def refresh(self) -> None:
        stats = {int(name): fields for name in os.listdir("/proc") if name.isdigit()
                 and (fields := proc_stat(name)) is not None} if Path("/proc").is_dir() else {}
        self.known = {pid: start for pid, start in self.known.items()
                      if pid in stats and stats[pid][19] == start and stats[pid][0] != "Z"}
        parents = set(self.known)
        if self.leader.returncode is None:  # once reaped, its pid may belong to someone else
            parents.add(self.leader.pid)
        while True:
            children = {pid for pid, fields in stats.items() if int(fields[1]) in parents
                        and pid not in parents and fields[0] != "Z"}
            if not children:
                break
            parents |= children
            self.known.update({pid: stats[pid][19] for pid in children})

    def alive(self) -> bool:
        self.refresh()
        return self.leader.poll() is None or bool(self.known)

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.leader.pid, signum)
        for pid, start in self.known.items():
            fields = proc_stat(pid)
            if fields is not None and fields[19] == start:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signum)
