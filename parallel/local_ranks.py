"""Run a function on N local ranks over gloo, the way multi-process tests and benches need it.

Every multi-process test (and `bench.bench_ddp`, `bench.bench_optim`) calls
`run_on_ranks(fn, world_size=2, ...)`:
- ranks are forked from a clean server process that imported torch once and ran no torch op
  (`forkserver`: plain `fork` of a parent that already ran torch ops can deadlock inside
  OpenMP; `spawn` would re-import torch in every rank, seconds each, for every test). A rank
  takes the caller's environment, working directory and sys.path as they are *now* (the
  server's are those of when it started), and one intra-op thread so two ranks fit two cores;
- the process group is gloo over localhost on a free port;
- whatever `fn` returns comes back to the test (pickled by value), one value per rank, in
  rank order;
- an exception on any rank is re-raised in the test with that rank's traceback, and a rank that
  hangs or dies is reported after `timeout` seconds instead of hanging the suite.
`fn` must be defined at module level (the forkserver's children unpickle it by name).
"""

from __future__ import annotations

import os
import pickle
import queue
import socket
import sys
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.multiprocessing as mp


def find_free_port() -> int:
    """Ask the OS for a free TCP port on localhost (tiny race window, fine for tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


PRELOADED = ["torch", "torch.distributed"]  # what the server imports once, for every rank


def _rank_main(rank: int, world_size: int, port: int, fn: Callable, args: tuple,
               results: Any, collective_timeout_s: float, caller: dict[str, Any]) -> None:
    os.environ.clear()
    os.environ.update(caller["environ"])
    os.chdir(caller["cwd"])
    sys.path[:] = caller["sys_path"]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=collective_timeout_s))
        value = fn(rank, world_size, *args)
        # Pickled here, by value: the queue's torch reductions would instead share a tensor's
        # storage by a file descriptor that this rank, exiting, may close before it is read.
        results.put((rank, True, pickle.dumps(value)))
    except BaseException:  # noqa: BLE001 - the traceback travels to the test process
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_on_ranks(fn: Callable, *args: Any, world_size: int = 2, timeout: float = 120.0,
                 collective_timeout_s: float = 60.0) -> list[Any]:
    """Run `fn(rank, world_size, *args)` on `world_size` gloo ranks; return per-rank results."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOADED)  # only read when the server starts
    results = ctx.Queue()
    port = find_free_port()
    caller = {"environ": dict(os.environ), "cwd": os.getcwd(), "sys_path": list(sys.path)}
    procs = [ctx.Process(target=_rank_main,
                         args=(rank, world_size, port, fn, args, results, collective_timeout_s,
                               caller),
                         daemon=True)
             for rank in range(world_size)]
    for proc in procs:
        proc.start()
    outcomes: dict[int, tuple[bool, Any]] = {}
    try:
        while len(outcomes) < world_size:
            try:
                rank, ok, value = results.get(timeout=timeout)
                value = pickle.loads(value) if ok else value
            except queue.Empty:
                missing = sorted(set(range(world_size)) - set(outcomes))
                raise TimeoutError(
                    f"ranks {missing} produced no result within {timeout}s") from None
            outcomes[rank] = (ok, value)
            if not ok:
                raise RuntimeError(f"rank {rank} failed:\n{value}")
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
    return [outcomes[rank][1] for rank in range(world_size)]
