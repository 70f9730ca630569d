"""The generation engine: one thread that owns the model and decodes all requests together.

Continuous batching (Yu et al. 2022, "Orca"): instead of finishing a batch before starting
the next, the engine re-forms the batch at every decoding step. One loop iteration:

    Step 1 (admit):   take waiting requests while fewer than `max_batch_size` rows run;
                      prefill them together and sample each one's first token
                      (`DecodeBatch.prefill`); they join the running batch.
    Step 2 (decode):  one forward of every running row's newest token (`DecodeBatch.decode`)
                      and one sampled token per row, each with its own sampling settings.
    Step 3 (retire):  rows that produced their stop token, reached their token budget or whose
                      client left are dropped from the batch (`DecodeBatch.keep`).

Failures stay as small as they can: a request the engine cannot run is refused by `submit`
(`check_request`); a row whose sampling fails ends alone with Finished("error"); a failed
step ends the rows of that step; and if the thread itself dies, every pending request ends
with Finished("error"), `submit` refuses new ones (`EngineFailed`) and `stats()["healthy"]`
turns False (the app answers 500 and `/health` 503).

A short request therefore leaves as soon as it is done and a new one starts at the next step,
without waiting for the longest request of its batch. Requests wait in a bounded queue
(`max_waiting`); when it is full, `submit` raises `EngineBusy` at once (HTTP 503).

The engine knows token ids only: each request gets its sampled ids, then one `Finished`
event, through its `deliver` callback, called on the engine thread (the HTTP layer hands them
over to its event loop).
"""

from __future__ import annotations

import collections
import logging
import queue
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from model.generation import sample_next_token
from model.modeling_z2all import Z2allForCausalLM
from server.batch import DecodeBatch

logger = logging.getLogger(__name__)


class EngineBusy(Exception):
    """The waiting queue is full; the client should retry later."""


class EngineFailed(Exception):
    """The engine thread has died; the server cannot generate any more."""


@dataclass(frozen=True)
class Finished:
    """The last event of a request: reason "stop" (stop token), "length" (token budget),
    "cancelled" (the client left) or "error" (`message` says what failed)."""
    reason: str
    message: str = ""


@dataclass
class SamplingParams:
    temperature: float = 0.0
    """0 = greedy."""
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    """None = a fresh random seed; the same seed gives the same tokens as `generate.py`."""


Event = int | Finished


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    max_new_tokens: int
    stop_ids: list[int]
    """The ids that end the response (delivered, then Finished("stop"))."""
    sampling: SamplingParams
    deliver: Callable[[Event], None]
    """Called on the engine thread with each new token id, then once with a `Finished`."""
    cancelled: threading.Event = field(default_factory=threading.Event)
    # engine-side state
    num_generated: int = 0
    newest_token: int = -1
    generator: torch.Generator | None = None
    error: str = ""
    """Set when this request alone failed (its row leaves at the next retire)."""

    def cancel(self) -> None:
        """Ask the engine to drop this request at its next step (safe from any thread)."""
        self.cancelled.set()


class Engine:
    def __init__(self, model: Z2allForCausalLM, max_batch_size: int = 16,
                 max_waiting: int = 64, real_vocab_size: int | None = None) -> None:
        """`real_vocab_size`: the tokenizer's length; the model's padding ids above it are
        never sampled (model/generation.py)."""
        self.model = model.eval()
        self.real_vocab_size = real_vocab_size or model.config.vocab_size
        self.device = model.lm_head.weight.device
        self.max_batch_size = max_batch_size
        self.waiting: queue.Queue[GenerationRequest] = queue.Queue(maxsize=max_waiting)
        self.rows: list[GenerationRequest] = []  # row i of `batch` is rows[i]
        self.admitting: list[GenerationRequest] = []  # taken from `waiting`, not yet in rows
        self.batch: DecodeBatch | None = None
        self.finished = {"stop": 0, "length": 0, "cancelled": 0, "error": 0}
        self.failure = ""  # why the engine thread died; "" while it is healthy
        self._closed = False  # no more requests are taken (stopped or failed)
        self._closing = threading.Lock()  # makes "check closed, then enqueue" atomic
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="z2all-engine", daemon=True)

    # ---- called from other threads -----------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()

    def submit(self, request: GenerationRequest) -> None:
        """Queue `request`; ValueError if it cannot be run, EngineBusy / EngineFailed if the
        engine cannot take it now / any more."""
        self.check_request(request)
        with self._closing:
            if self._closed:
                raise EngineFailed(self.failure or "the engine has stopped")
            try:
                self.waiting.put_nowait(request)
            except queue.Full:
                raise EngineBusy(f"{self.waiting.maxsize} requests are already waiting; "
                                 "retry later") from None

    def check_request(self, request: GenerationRequest) -> None:
        """Refuse what would fail inside the batch (and so hurt the other rows)."""
        ids, params = request.prompt_ids, request.sampling
        problems = [
            f"prompt_ids must be a non-empty list of ids in [0, {self.real_vocab_size})"
            if not ids or not all(
                isinstance(i, int) and 0 <= i < self.real_vocab_size for i in ids) else "",
            "max_new_tokens must be an int >= 1" if not isinstance(request.max_new_tokens, int)
            or request.max_new_tokens < 1 else "",
            "stop_ids must be a list of ints" if not isinstance(request.stop_ids, list | tuple)
            or not all(isinstance(i, int) for i in request.stop_ids) else "",
            "temperature must be a finite number >= 0" if not 0 <= params.temperature < 1e30
            else "",
            "top_k must be >= 1" if params.top_k is not None and params.top_k < 1 else "",
            "top_p must be in (0, 1]" if params.top_p is not None and not 0 < params.top_p <= 1
            else ""]
        if any(problems):
            raise ValueError("; ".join(p for p in problems if p))

    def stats(self) -> dict[str, object]:
        return {"healthy": not self.failure, "running": len(self.rows) + len(self.admitting),
                "waiting": self.waiting.qsize(), "max_batch_size": self.max_batch_size,
                "finished": dict(self.finished), **({"error": self.failure} if self.failure
                                                    else {})}

    # ---- on the caller's thread, without `start` ------------------------------------------------
    def run_to_completion(self, requests: list[GenerationRequest]) -> None:
        """Decode every request to its end on the calling thread, with the steps the server's
        loop runs (admit up to `max_batch_size` rows, decode, retire), then return: GRPO's
        rollouts (trainer/rollouts.py) are generated by the same code that serves."""
        for request in requests:
            self.check_request(request)
        waiting = collections.deque(requests)
        with torch.no_grad():  # not inference_mode: the trainer's tensors stay trainable
            while waiting or self.rows:
                room = self.max_batch_size - len(self.rows)
                newcomers = [waiting.popleft() for _ in range(min(room, len(waiting)))]
                if newcomers:
                    self._admit(newcomers)
                if self.rows:
                    self._decode_and_retire()

    # ---- the engine thread --------------------------------------------------------------------
    def _run(self) -> None:
        try:
            with torch.inference_mode():  # grad mode is per thread: set it on this one
                while not self._stopping.is_set():
                    try:
                        self._step()
                    except Exception as error:  # a failed step must not kill the server
                        logger.exception("generation step failed")
                        for request in self.rows + self.admitting:
                            self._finish(request, "error", f"{type(error).__name__}: {error}")
                        self.rows, self.admitting, self.batch = [], [], None
        except BaseException as error:
            logger.exception("the engine thread failed")
            self.failure = f"the generation engine failed ({type(error).__name__}: {error})"
        finally:
            self._close()

    def _close(self) -> None:
        """Take no more requests; end every pending one (cancelled, or error if we failed)."""
        with self._closing:
            self._closed = True
        pending = self.rows + self.admitting
        while not self.waiting.empty():
            pending.append(self.waiting.get_nowait())
        self.rows, self.admitting, self.batch = [], [], None
        for request in pending:
            self._finish(request, "error" if self.failure else "cancelled", self.failure)

    def _step(self) -> None:
        # Step 1: admit waiting requests (block briefly when idle, so the loop does not spin).
        self._take_waiting(block=not self.rows)
        if self.admitting:
            self._admit(self.admitting)
            self.admitting = []
        if self.rows:
            self._decode_and_retire()

    def _decode_and_retire(self) -> None:
        # Step 2: one decoding step for every running row.
        newest = torch.tensor([r.newest_token for r in self.rows], device=self.device)
        self._sample(self.rows, self.batch.decode(self.model, newest))
        # Step 3: drop the rows that are done.
        self._retire()

    def _admit(self, newcomers: list[GenerationRequest]) -> None:
        """Prefill the newcomers together, sample their first tokens, join the batch."""
        group, logits = DecodeBatch.prefill(self.model, [r.prompt_ids for r in newcomers])
        for request in newcomers:
            seed = request.sampling.seed
            request.generator = torch.Generator(device=self.device).manual_seed(
                random.getrandbits(63) if seed is None else seed)
        self._sample(newcomers, logits)
        if self.batch is None:
            self.rows, self.batch = newcomers, group
        else:
            self.rows += newcomers
            self.batch.join(group)
        self._retire()

    def _take_waiting(self, block: bool) -> None:
        """Move waiting requests to `admitting` while the batch has room."""
        while len(self.rows) + len(self.admitting) < self.max_batch_size:
            try:
                request = self.waiting.get(timeout=0.05) if block and not self.admitting \
                    else self.waiting.get_nowait()
            except queue.Empty:
                break
            if request.cancelled.is_set():
                self._finish(request, "cancelled")
            else:
                self.admitting.append(request)

    def _sample(self, requests: list[GenerationRequest], logits: torch.Tensor) -> None:
        """One token per request from its row of `logits`, with its own settings and RNG."""
        for row, request in enumerate(requests):
            params = request.sampling
            try:
                token = int(sample_next_token(logits[row:row + 1], params.temperature,
                                              params.top_k, params.top_p, request.generator,
                                              self.real_vocab_size)[0])
            except Exception as error:  # this request's failure is its own
                request.error = f"sampling failed: {type(error).__name__}: {error}"
                continue
            request.newest_token = token
            request.num_generated += 1
            request.deliver(token)

    def _retire(self) -> None:
        kept = []
        for request in self.rows:
            if request.error:
                self._finish(request, "error", request.error)
            elif request.newest_token in request.stop_ids:
                self._finish(request, "stop")
            elif request.num_generated >= request.max_new_tokens:
                self._finish(request, "length")
            elif request.cancelled.is_set():
                self._finish(request, "cancelled")
            else:
                kept.append(request)
        if len(kept) < len(self.rows):
            row_of = {id(request): row for row, request in enumerate(self.rows)}
            if kept:
                self.batch.keep([row_of[id(request)] for request in kept])
            self.rows, self.batch = kept, (self.batch if kept else None)

    def _finish(self, request: GenerationRequest, reason: str, message: str = "") -> None:
        self.finished[reason] += 1
        request.deliver(Finished(reason, message))
