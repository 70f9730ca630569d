"""Worker processes that each hold a tokenizer: the pretokenizers' pool (worker_pool.py).

A task function sent to a worker receives only its batch; what every batch needs (the
tokenizer, the settings) is loaded once per process by `init_worker` and read back with
`worker_state()`. That state is a module global because a process pool's initializer can hand
its result to later tasks in no other way, and loading a tokenizer per batch would cost more
than tokenizing it. With `num_workers=0` the same functions run in this process.
(Apart from worker_pool.py so that a pool which needs no tokenizer, the clean stage's, never
imports transformers.)
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from data_preprocess.worker_pool import start_pool
from tokenizer import load_tokenizer

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
    return start_pool(num_workers, init_worker, (str(tokenizer_dir), settings),
                      preload=[__name__])  # transformers imported once, in the forkserver
