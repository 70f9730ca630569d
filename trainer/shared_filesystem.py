"""Start-up check of a run on several ranks: does every rank see the files rank 0 sees?

A multi-node run writes one run directory together: rank 0 its lock, config and heartbeat,
every rank its own checkpoint shard (`ranks/rank_00001.pt`, `optim/zero1_rank...`), which
rank 0 seals into a checkpoint once all are there. With node-local disks (each node its own
`out/run1`, the same path on another disk) nothing fails until the first checkpoint, when
rank 0 finds the shards of the other node missing: minutes or hours of training lost. And a
node that reads another copy of the data or tokenizer trains on other tokens without a word.
So before the first step, on every start (fresh or resumed), every rank checks:

1. the run directory: rank 0 writes a random token into `<run>/shared_filesystem_check`
   (atomically) as it claims the run dir, and its verdict carries the token to every rank
   (trainer/run_claim.py: one broadcast); every rank reads the file at its own `--out_dir` and
   compares the *content*. Comparing paths would not do: `out/run1` on node 1's own disk is
   the same path as on node 0, and it may even hold an older token of an earlier run;
2. the inputs (`--data_dir`, `--tokenizer_dir`, `--init_from`): one rank per node (local rank
   0) lists the files it would read, names and sizes (hidden entries, such as caches, aside),
   and rank 0 compares a digest of each list with its own. Two disks holding identical copies
   pass; a missing or different copy is named.

Any rank that does not see what rank 0 sees -> one line from rank 0 naming the first such
rank, its host and the path, and the shared-filesystem requirement; every rank exits 2 before
the data is prepared or any step runs (docs/design.md, "Multi-node runs").
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import socket
from pathlib import Path

import torch.distributed as dist

from trainer.distributed_env import DistributedEnv
from utils.atomic_io import atomic_write_text
from utils.cli_errors import EXIT_BAD_INPUT, ReportedElsewhere
from utils.data_files import is_data_spec, locate_data
from utils.run_directory import SHARED_CHECK_FILE

REQUIREMENT = ("every node of a multi-node run must see --out_dir, --data_dir and "
               "--tokenizer_dir at the same path on one shared filesystem (NFS, Lustre, ...; "
               "docs/design.md, 'Multi-node runs')")

Inventory = list[tuple[str, int]]  # (path relative to the input, size in bytes), sorted


def file_inventory(path: str | Path) -> Inventory | None:
    """What a rank would read at `path`: every non-hidden file below it with its size (a file:
    itself), or None if it does not exist here. Hidden entries are skipped: caches and
    temporaries (`.z2all_cache/`, `.x.tmp`) are written while ranks look."""
    root = Path(path)
    if root.is_file():
        return [(root.name, root.stat().st_size)]
    if not root.is_dir():
        return None
    found = []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = [name for name in subfolders if not name.startswith(".")]
        for name in files:
            if not name.startswith("."):
                file = Path(folder, name)
                found.append((file.relative_to(root).as_posix(), file.stat().st_size))
    return sorted(found)


def data_inventory(spec: str) -> Inventory | None:
    """`file_inventory` of a data option; a named split or Hub dataset (`DIR@split`,
    `hf:org/name`): the files it names, relative to their folder."""
    if Path(spec).exists() or not is_data_spec(spec):
        return file_inventory(spec)
    try:
        located = locate_data(spec)
    except (ValueError, OSError):
        return None
    return sorted((name, file.stat().st_size)
                  for name, file in zip(located.relative_names(), located.files, strict=True))


def inventory_digest(inventory: Inventory | None) -> str | None:
    """A short stand-in for an inventory (None: nothing there): what the ranks exchange, so
    that a data dir of 100k files costs each rank a few bytes to send, not megabytes."""
    if inventory is None:
        return None
    return hashlib.sha256(json.dumps(inventory).encode()).hexdigest()


def seen_by_this_rank(run_dir: Path, token: str, inputs: dict[str, str],
                      lists_inputs: bool) -> dict:
    """This rank's view: its host, whether its run dir holds rank 0's token, and (if
    `lists_inputs`: one rank per node, since the ranks of a node share its filesystem) the
    digest of each input's inventory."""
    try:
        sees_run_dir = (run_dir / SHARED_CHECK_FILE).read_text() == token
    except OSError:
        sees_run_dir = False
    digests = {flag: inventory_digest(data_inventory(value) if flag == "--data_dir"
                                      else file_inventory(value))
               for flag, value in inputs.items()} if lists_inputs else None
    return {"host": socket.gethostname(), "sees_run_dir": sees_run_dir, "inputs": digests}


def first_difference(views: list[dict], run_dir: Path, inputs: dict[str, str]) -> str | None:
    """The one-line problem for the first rank whose view differs from rank 0's, or None."""
    main = views[0]
    for rank, view in enumerate(views[1:], start=1):
        where = f"rank {rank} (host {view['host']})"
        if not view["sees_run_dir"]:
            return (f"--out_dir={run_dir}: {where} does not see the run directory rank 0 "
                    f"(host {main['host']}) created (its {SHARED_CHECK_FILE} is missing or "
                    f"another run's): {REQUIREMENT}")
        for flag, value in inputs.items() if view["inputs"] is not None else ():
            if view["inputs"][flag] != main["inputs"][flag]:
                seen = "nothing" if view["inputs"][flag] is None else "other files"
                return (f"{flag}={value}: {where} sees {seen} there, not what rank 0 "
                        f"(host {main['host']}) sees: {REQUIREMENT}")
    return None


def write_check_token(run_dir: Path) -> str:
    """Rank 0, as it claims `run_dir` on several ranks: a fresh random token in its
    SHARED_CHECK_FILE, for every rank to read back (`check_shared_filesystem`)."""
    token = f"{secrets.token_hex(16)} written by rank 0 on {socket.gethostname()}\n"
    atomic_write_text(run_dir / SHARED_CHECK_FILE, token)
    return token


def check_shared_filesystem(run_dir: Path, token: str | None, inputs: dict[str, str | None],
                            env: DistributedEnv) -> None:
    """Collective, after rank 0 claimed `run_dir` and wrote `token` there (`write_check_token`;
    every rank holds it: `RunDirClaim.check_token`): when some rank does not see what rank 0
    sees (module docstring), rank 0 raises ValueError (one line, exit 2) and the others exit
    2 without a word (`ReportedElsewhere`). Nothing to check in a world of one."""
    if not env.is_distributed:
        return
    inputs = {flag: value for flag, value in inputs.items() if value is not None}
    views: list[dict | None] = [None] * env.world_size
    dist.all_gather_object(views, seen_by_this_rank(run_dir, token, inputs,
                                                    lists_inputs=env.local_rank == 0))
    problem = first_difference(views, run_dir, inputs)
    if problem and env.is_main:
        raise ValueError(problem)
    if problem:
        raise ReportedElsewhere(EXIT_BAD_INPUT)
