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


def test_a_request_the_engine_cannot_run_is_refused_at_submit():
    engine = Engine(small_model("gqa").eval(), real_vocab_size=200)  # not started
    bad = [GenerationRequest([], 4, [1], SamplingParams(), Collector()),
           GenerationRequest([1, 200], 4, [1], SamplingParams(), Collector()),  # padding id
           GenerationRequest([1], 0, [1], SamplingParams(), Collector()),
           GenerationRequest([1], 4, -1, SamplingParams(), Collector()),  # bench_serve's old bug
           GenerationRequest([1], 4, [1], SamplingParams(temperature=float("nan")), Collector())]
    for request_ in bad:
        with pytest.raises(ValueError):
            engine.submit(request_)
    assert engine.waiting.empty()


def test_one_rows_sampling_failure_is_its_own(monkeypatch):
    """A request whose sampling raises ends with an error; the rows decoded beside it finish
    exactly as `model.generate` would decode them alone."""
    from server import engine as engine_module

    real_sample = engine_module.sample_next_token

    def fails_for_top_k_7(logits, temperature, top_k, *args):
        if top_k == 7:
            raise RuntimeError("probability tensor contains nan")
        return real_sample(logits, temperature, top_k, *args)

    monkeypatch.setattr(engine_module, "sample_next_token", fails_for_top_k_7)
    prompts = [[3, 4, 5], [9, 8, 7, 6], [1, 2]]
    collectors = []
    engine = Engine(small_model("gqa").eval(), max_batch_size=4)  # started once all 3 wait,
    for index, prompt in enumerate(prompts):
        collector = Collector()
        params = SamplingParams(top_k=7) if index == 1 else SamplingParams()
        engine.submit(GenerationRequest(prompt, 6, [-1], params, collector))
        collectors.append(collector)
    engine.start()  # so that they share one batch
    try:
        results = [collector.wait() for collector in collectors]
    finally:
        engine.stop()
    assert results[1][1].reason == "error" and "nan" in results[1][1].message
    for index in (0, 2):
        alone = engine.model.generate(torch.tensor([prompts[index]]), 6)[0, -6:].tolist()
        assert (results[index][0], results[index][1].reason) == (alone, "length")


def test_padding_ids_of_the_vocabulary_are_never_sampled():
    model = small_model("gqa", vocab_size=200).eval()  # padded to 256
    with torch.no_grad():
        model.lm_head.weight[200:] *= 50  # the padding rows would win every step
    engine = Engine(model, max_batch_size=2, real_vocab_size=200)
    collectors = [Collector(), Collector()]
    engine.submit(GenerationRequest([5, 6, 7], 8, [-1], SamplingParams(), collectors[0]))
    engine.submit(GenerationRequest([5, 6], 20, [-1], SamplingParams(temperature=1.0, seed=1),
                                    collectors[1]))
    engine.start()
    try:
        (greedy, _), (sampled, _) = collectors[0].wait(), collectors[1].wait()
    finally:
        engine.stop()
    assert greedy == model.generate(torch.tensor([[5, 6, 7]]), 8,
                                    real_vocab_size=200)[0, 3:].tolist()
    assert max(sampled) < 200 and len(sampled) == 20


def test_run_to_completion_decodes_in_waves_like_model_generate():
    """GRPO's rollouts: more requests than rows, so they are admitted in waves as rows retire,
    never more rows than `max_batch_size`; each ends as `model.generate` decodes it alone
    (greedy), and a stop id ends its row."""
    model = small_model("gqa").eval()
    engine = Engine(model, max_batch_size=2)  # never started: the caller's thread
    prompts = [[3, 4, 5], [9, 8, 7, 6], [1, 2], [5, 6, 7, 8, 9], [2]]
    budgets = [6, 3, 5, 4, 6]
    alone = [model.generate(torch.tensor([prompt]), budget)[0, len(prompt):].tolist()
             for prompt, budget in zip(prompts, budgets)]
    stop_id = alone[2][1]  # the third row stops at its second token (or sooner)
    expected = [(tokens[:tokens.index(stop_id) + 1], "stop") if stop_id in tokens
                else (tokens, "length") for tokens in alone]
    rows_after_admit = []
    real_admit = engine._admit

    def admit(newcomers):
        real_admit(newcomers)
        rows_after_admit.append(len(engine.rows))

    engine._admit = admit
    collectors = [Collector() for _ in prompts]
    engine.run_to_completion([
        GenerationRequest(prompt, budget, [stop_id], SamplingParams(), collector)
        for prompt, budget, collector in zip(prompts, budgets, collectors)])
    results = [(tokens, end.reason) for tokens, end in map(Collector.wait, collectors)]
    assert results == expected
    assert len(rows_after_admit) >= 3 and max(rows_after_admit) <= 2
