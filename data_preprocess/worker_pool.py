"""An ordered pool of tokenizing worker processes.

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
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from itertools import islice
from pathlib import Path
from typing import Any

from tokenizer import load_tokenizer


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


def worker_context() -> multiprocessing.context.BaseContext:
    """`forkserver`: workers fork from a clean server process that already imported this module.

    Safe even when the caller runs torch/CUDA threads (plain `fork` is not), and cheap: the
    server starts once per program and pays the imports once, so each new worker starts in
    milliseconds instead of re-importing transformers the way `spawn` would.
    """
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return context


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
    return ProcessPoolExecutor(max_workers=num_workers, initializer=init_worker,
                               initargs=(str(tokenizer_dir), settings),
                               mp_context=worker_context())


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
