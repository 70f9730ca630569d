"""An ordered pool of worker processes (tokenizing, cleaning) that die with the program.

A task function sent to a worker receives only its batch; what every batch needs is set up once
per process by the pool's initializer (the pretokenizers': tokenizer_workers.py, which loads a
tokenizer; the clean stage's: cleaning/analyse.py). This module imports no tokenizer, so a
worker that needs none never loads transformers. With `num_workers=0` the same functions run
in this process.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import signal
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from itertools import islice
from typing import Any

from utils.parent_death import die_with_parent


def batched(items: Iterable[Any], batch_size: int) -> Iterator[list[Any]]:
    iterator = iter(items)
    while batch := list(islice(iterator, batch_size)):
        yield batch


FORKSERVER_GUARD = "data_preprocess.forkserver_guard"  # by name: importing it here would act


def worker_context(preload: Sequence[str] = ()) -> multiprocessing.context.BaseContext:
    """`forkserver`: workers fork from a clean server process that already imported this module
    and the modules named in `preload` (the first pool of a program decides: the server starts
    once per program).

    Safe even when the caller runs torch/CUDA threads (plain `fork` is not), and cheap: the
    server pays the imports once, so each new worker starts in milliseconds instead of
    re-importing them (transformers, for a tokenizer's pool) the way `spawn` would. The server
    also preloads forkserver_guard.py, which makes it die with this program.
    """
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__, FORKSERVER_GUARD, *preload])
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


def start_pool(num_workers: int, initializer: Callable[..., None], initargs: tuple[Any, ...],
               preload: Sequence[str] = ()) -> ProcessPoolExecutor:
    """`num_workers` forkserver processes that each run `initializer(*initargs)` once, and that
    are all killed by the kernel when this program dies, even by SIGKILL (no orphans).
    `preload`: modules the forkserver imports once for all workers (`worker_context`)."""
    return ProcessPoolExecutor(max_workers=num_workers, initializer=_start_worker,
                               initargs=(initializer, *initargs),
                               mp_context=worker_context(preload))


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
