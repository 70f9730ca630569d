"""The engine without HTTP: a failed step is reported to its requests and the engine goes on;
a full queue refuses at once; stop tokens and budgets end rows like `model.generate`."""

from __future__ import annotations

import threading

import pytest
import torch

from server.batch import DecodeBatch
from server.engine import Engine, EngineBusy, Finished, GenerationRequest, SamplingParams
from tests.model.model_helpers import small_model


class Collector:
    def __init__(self) -> None:
        self.events: list = []
        self.done = threading.Event()

    def __call__(self, event) -> None:
        self.events.append(event)
        if isinstance(event, Finished):
            self.done.set()

    def wait(self) -> tuple[list[int], Finished]:
        assert self.done.wait(timeout=60), "the engine never finished the request"
        return self.events[:-1], self.events[-1]


def request(prompt, max_new_tokens=6, stop_id=-1) -> tuple[GenerationRequest, Collector]:
    collector = Collector()
    return GenerationRequest(prompt, max_new_tokens, [stop_id], SamplingParams(), collector), \
        collector


@pytest.fixture
def engine():
    engine = Engine(small_model("gqa").eval(), max_batch_size=4, max_waiting=8)
    engine.start()
    yield engine
    engine.stop()


def test_a_failed_step_reports_an_error_and_the_engine_goes_on(engine, monkeypatch):
    real_prefill = DecodeBatch.prefill
    calls = []

    def fails_once(model, prompts):
        calls.append(prompts)
        if len(calls) == 1:
            raise RuntimeError("simulated out of memory")
        return real_prefill(model, prompts)

    monkeypatch.setattr(DecodeBatch, "prefill", staticmethod(fails_once))
    failing, failed_events = request([1, 2, 3])
    engine.submit(failing)
    tokens, end = failed_events.wait()
    assert (tokens, end.reason) == ([], "error") and "simulated out of memory" in end.message
    healthy, events = request([1, 2, 3])
    engine.submit(healthy)
    tokens, end = events.wait()
    expected = engine.model.generate(torch.tensor([[1, 2, 3]]), 6)[0, 3:].tolist()
    assert (tokens, end.reason) == (expected, "length")
    assert engine.stats()["finished"]["error"] == 1


def test_stop_token_ends_the_row_like_model_generate(engine):
    prompt = [5, 6, 7, 8]
    greedy = engine.model.generate(torch.tensor([prompt]), 6)[0, 4:].tolist()
    stop_id = greedy[2]
    first = greedy.index(stop_id)
    stopping, events = request(prompt, stop_id=stop_id)
    engine.submit(stopping)
    tokens, end = events.wait()
    assert (tokens, end.reason) == (greedy[:first + 1], "stop")


def test_full_queue_refuses_at_once():
    engine = Engine(small_model("gqa").eval(), max_batch_size=1, max_waiting=2)  # not started
    engine.submit(request([1])[0])
    engine.submit(request([2])[0])
    with pytest.raises(EngineBusy, match="2 requests are already waiting"):
        engine.submit(request([3])[0])
