"""An ordered pool of worker processes (tokenizing, cleaning) that die with the program.

A task function sent to a worker receives only its batch; what every batch needs (the
tokenizer, the settings) is loaded once per process by `init_worker` and read back with
`worker_state()`. That state is a module global because a process pool's initializer can hand
its result to later tasks in no other way, and loading a tokenizer per batch would cost more
than tokenizing it. With `num_workers=0` the same functions run in this process.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import signal
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from itertools import islice
from pathlib import Path
from typing import Any

from tokenizer import load_tokenizer
from utils.parent_death import die_with_parent


def batched(items: Iterable[Any], batch_size: int) -> Iterator[list[Any]]:
    iterator = iter(items)
    while batch := list(islice(iterator, batch_size)):
        yield batch


_WORKER: dict[str, Any] = {}  # this process's tokenizer and settings, set once by init_worker


def init_worker(tokenizer_dir: str, settings: dict[str, Any]) -> None:
    """Runs once in each worker: load the tokenizer there (one per process, never per batch)."""
    # One thread per worker: the worker count is the parallelism knob, not Rust's thread pool.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER.update(settings, tokenizer=load_tokenizer(tokenizer_dir))


def worker_state() -> dict[str, Any]:
    """The tokenizer (`"tokenizer"`) and settings a task function runs with in this process."""
    if not _WORKER:
        raise RuntimeError("worker_state() before init_worker: use make_worker_pool")
    return _WORKER


FORKSERVER_GUARD = "data_preprocess.forkserver_guard"  # by name: importing it here would act


def worker_context() -> multiprocessing.context.BaseContext:
    """`forkserver`: workers fork from a clean server process that already imported this module.

    Safe even when the caller runs torch/CUDA threads (plain `fork` is not), and cheap: the
    server starts once per program and pays the imports once, so each new worker starts in
    milliseconds instead of re-importing transformers the way `spawn` would. The server also
    preloads forkserver_guard.py, which makes it die with this program.
    """
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__, FORKSERVER_GUARD])
    return context


def _start_worker(initializer: Callable[..., None], *initargs: Any) -> None:
    """First thing in every worker: die with the forkserver (which dies with the program,
    forkserver_guard.py), then the caller's once-per-process setup.

    The program may have died (and taken the forkserver) between our fork and this call; the
    kernel then has no parent left to watch for us, so the program itself is checked after the
    request (multiprocessing's parent of a forkserver worker is the program that asked for it).
    """
    die_with_parent(signal.SIGKILL)
    program = multiprocessing.parent_process()
    if program is not None and not program.is_alive():
        os._exit(1)  # orphaned before the request took effect: no one is left to work for
    initializer(*initargs)


def start_pool(num_workers: int, initializer: Callable[..., None],
               initargs: tuple[Any, ...]) -> ProcessPoolExecutor:
    """`num_workers` forkserver processes that each run `initializer(*initargs)` once, and that
    are all killed by the kernel when this program dies, even by SIGKILL (no orphans)."""
    return ProcessPoolExecutor(max_workers=num_workers, initializer=_start_worker,
                               initargs=(initializer, *initargs), mp_context=worker_context())


def make_worker_pool(num_workers: int, tokenizer_dir: str | Path,
                     settings: dict[str, Any]) -> ProcessPoolExecutor | None:
    """A pool whose workers each load the tokenizer once, before their first batch.

    A worker that raises fails its future; a worker that dies (OOM killer, SIGKILL) breaks the
    pool and every pending future raises BrokenProcessPool: either way the run fails loudly.
    `num_workers=0` (or a daemonic caller, which may not have children) tokenizes in this
    process instead: returns None, and `ordered_map` then calls the function directly.
    """
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    if num_workers > 0 and multiprocessing.current_process().daemon:
        print("note: daemonic process cannot start workers; tokenizing in-process", flush=True)
        num_workers = 0
    if num_workers == 0:
        init_worker(str(tokenizer_dir), settings)
        return None
    return start_pool(num_workers, init_worker, (str(tokenizer_dir), settings))


def ordered_map(pool: ProcessPoolExecutor | None, function: Callable, batches: Iterable[Any],
                max_in_flight: int) -> Iterator[Any]:
    """`function(batch)` for each batch on the pool (here if None), yielded in input order.

    At most `max_in_flight` batches are queued or running, so memory stays bounded however
    large the file; results are taken oldest-first, which is what keeps the output order equal
    to the source order for any number of workers.
    """
    if pool is None:
        yield from map(function, batches)
        return
    pending: collections.deque[Future] = collections.deque()
    try:
        for batch in batches:
            pending.append(pool.submit(function, batch))
            if len(pending) >= max_in_flight:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:
            future.cancel()
