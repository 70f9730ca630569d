"""The HTTP layer against what OpenAI clients and browsers send, and against failures.

References: the same request without OpenAI's no-op fields (the answer must be identical),
OpenAI's error shape, and the engine's own counters (`/health`)."""

from __future__ import annotations

import json
import socket
import time

import openai
import pytest

from server.engine import Engine
from server.text_stream import TextStream
from tests.server.conftest import CONTEXT, start_server
from tests.server.test_bad_input import (
    GOOD_MESSAGES,
    assert_good_request_is_served,
    chat,
    health,
    post,
    wait_until_idle,
)

NO_OP_FIELDS = dict(frequency_penalty=0, presence_penalty=0, logprobs=False, logit_bias={},
                    parallel_tool_calls=True, metadata={"team": "z2all"}, store=False,
                    user="someone", tools=[], tool_choice="none", n=1,
                    response_format={"type": "text"}, service_tier="auto")


@pytest.fixture(scope="module")
def client(live_server):
    return openai.OpenAI(base_url=f"{live_server.url}/v1", api_key="unused", max_retries=0,
                         timeout=60)


def test_openai_client_with_every_no_op_field_gets_the_plain_answer(client):
    plain = client.chat.completions.create(
        model="run", temperature=0, max_tokens=8,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])
    extended = client.chat.completions.create(
        model="run", temperature=0, max_tokens=8, **NO_OP_FIELDS,
        messages=[{"role": "developer", "content": [{"type": "text", "text": "Be "},
                                                    {"type": "text", "text": "brief."}]},
                  {"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert extended.choices[0].message.content == plain.choices[0].message.content
    assert extended.usage == plain.usage


@pytest.mark.parametrize("field, value", [("frequency_penalty", 0.5), ("logprobs", True),
                                          ("logit_bias", {"5": 10}), ("tools", [{"type": "x"}]),
                                          ("presence_penalty", -1)])
def test_a_non_default_unimplemented_field_is_refused_naming_it(client, field, value):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="run", messages=GOOD_MESSAGES, max_tokens=2,
                                       **{field: value})
    error = refused.value.body
    assert error["param"] == field and error["code"] == "unsupported_parameter"
    assert field in error["message"]


@pytest.mark.parametrize("body", [
    b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": ' + b"9" * 5000 + b"}",
    b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
], ids=["5000-digit integer", "nested 100000 deep"])
def test_pathological_json_is_a_400_in_openai_shape(live_server, body):
    status, answer = post(live_server, "/v1/chat/completions", body)
    assert status == 400 and answer["error"]["type"] == "invalid_request_error"
    assert_good_request_is_served(live_server)


def test_over_context_completion_names_prompt(live_server):
    status, answer = post(live_server, "/v1/completions", {"prompt": "the model " * CONTEXT})
    assert status == 400 and answer["error"]["param"] == "prompt"


def test_no_schema_page_bypasses_the_api_key(live_server):
    status, answer = post(live_server, "/openapi.json", b"", method="GET")
    assert status == 404 and answer["error"]["message"]


@pytest.mark.parametrize("headers", [{"Host": "evil.example:8000"},
                                     {"Origin": "http://evil.example"},
                                     {"Origin": "null"}],
                         ids=["dns rebinding", "cross-site page", "sandboxed page"])
def test_foreign_host_or_origin_is_refused_on_loopback(live_server, headers):
    before = health(live_server)["finished"]
    status, answer = post(live_server, "/v1/chat/completions", chat(max_tokens=2),
                          headers=headers)
    assert status == 403 and answer["error"]["code"] == "forbidden_origin"
    assert health(live_server)["finished"] == before  # nothing was generated
    same_origin = {"Origin": f"http://127.0.0.1:{live_server.port}"}  # the chat page itself
    assert post(live_server, "/v1/chat/completions", chat(max_tokens=2),
                headers=same_origin)[0] == 200


def test_non_streaming_client_that_leaves_frees_its_row(live_server, monkeypatch):
    real_step = Engine._step

    def slow_step(engine):  # 76 steps take >= 1.5 s: the client surely leaves before the end
        time.sleep(0.02)
        real_step(engine)

    monkeypatch.setattr(Engine, "_step", slow_step)
    request = chat(max_tokens=CONTEXT - 20, temperature=0)
    before = health(live_server)["finished"]
    body = json.dumps(request).encode()
    with socket.create_connection(("127.0.0.1", live_server.port), timeout=30) as client:
        client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       b"Content-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        deadline = time.monotonic() + 30
        while not health(live_server)["running"]:  # hang up once its row is decoding
            assert time.monotonic() < deadline
            time.sleep(0.01)
    wait_until_idle(live_server)
    after = health(live_server)["finished"]
    assert after["cancelled"] == before["cancelled"] + 1
    assert after["length"] == before["length"]
    assert_good_request_is_served(live_server)


class Crash(BaseException):
    """Something no step recovers from (the engine thread itself ends)."""


def test_a_dead_engine_thread_fails_every_request_and_health(run_dir, monkeypatch):
    server = start_server(run_dir, "--max_batch_size=1")
    try:
        assert_good_request_is_served(server)
        real_step = Engine._step

        def step_then_die(engine):
            real_step(engine)
            if engine.rows:
                raise Crash("the engine thread is gone")

        monkeypatch.setattr(Engine, "_step", step_then_die)
        status, answer = post(server, "/v1/chat/completions", chat(max_tokens=20))
        assert status == 500 and answer["error"]["type"] == "server_error"
        assert "Crash: the engine thread is gone" in answer["error"]["message"]
        assert post(server, "/v1/chat/completions", chat(max_tokens=2))[0] == 500  # new ones
        state = health(server)
        assert state["status"] == "unhealthy" and not state["healthy"]
        assert "the engine thread is gone" in state["error"]
    finally:
        monkeypatch.undo()
        server.stop()


def test_an_unknown_model_name_is_refused(client):
    with pytest.raises(openai.NotFoundError) as refused:
        client.chat.completions.create(model="gpt-4o", messages=GOOD_MESSAGES, max_tokens=2)
    assert refused.value.body["param"] == "model"
    assert refused.value.body["code"] == "model_not_found"
    reply = client.chat.completions.create(model="run", messages=GOOD_MESSAGES, max_tokens=2)
    assert reply.model == "run"


def test_a_failure_mid_stream_is_an_error_event_then_done(live_server, monkeypatch):
    def broken_push(self, token_id):
        raise RuntimeError("cannot decode")

    monkeypatch.setattr(TextStream, "push", broken_push)
    body = json.dumps(chat(stream=True, max_tokens=4)).encode()
    with socket.create_connection(("127.0.0.1", live_server.port), timeout=30) as client:
        client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        received = b""
        while chunk := client.recv(4096):
            received += chunk
    events = [line[6:] for line in received.decode().split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["type"] == "server_error" and "cannot decode" in error["message"]
    monkeypatch.undo()
    wait_until_idle(live_server)
    assert_good_request_is_served(live_server)
