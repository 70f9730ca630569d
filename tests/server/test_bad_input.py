"""Bad input never takes the server down: each one gets a 4xx in OpenAI's error shape (or a
clean end of the stream), and the good request sent right after it is answered."""

from __future__ import annotations

import http.client
import json
import socket
import time

import openai
import pytest

import serve
from tests.server.conftest import CONTEXT, start_server

GOOD_MESSAGES = [{"role": "user", "content": "hi"}]


def post(server, path: str, body: bytes | dict, method: str = "POST",
         headers: dict[str, str] | None = None) -> tuple[int, dict]:
    """(status, JSON body) of one raw HTTP request: bytes are sent exactly as given."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.request(method, path, body=raw,
                           headers={"Content-Type": "application/json", **(headers or {})})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def health(server) -> dict:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.request("GET", "/health")
        return json.loads(connection.getresponse().read())
    finally:
        connection.close()


def wait_until_idle(server, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while (stats := health(server))["running"] or stats["waiting"]:
        assert time.monotonic() < deadline, f"the engine is still busy: {stats}"
        time.sleep(0.05)


def assert_good_request_is_served(server) -> None:
    status, body = post(server, "/v1/chat/completions",
                        {"messages": GOOD_MESSAGES, "max_tokens": 3, "temperature": 0})
    assert status == 200, body
    assert body["usage"]["completion_tokens"] >= 1


def chat(**fields) -> dict:
    return {"messages": GOOD_MESSAGES, **fields}


BAD_REQUESTS = {
    "malformed JSON": (b'{"messages": [', 400),
    "not an object": (b"[1, 2]", 400),
    "empty body": (b"", 400),
    "non-UTF-8 bytes": (b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', 400),
    "unpaired surrogate": (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', 400),
    "messages missing": ({}, 400),
    "messages empty": ({"messages": []}, 400),
    "messages not a list": ({"messages": "hi"}, 400),
    "wrong role": ({"messages": [{"role": "wizard", "content": "hi"}]}, 400),
    "content not text": ({"messages": [{"role": "user", "content": 5}]}, 400),
    "system not first": ({"messages": [*GOOD_MESSAGES, {"role": "system", "content": "x"}]},
                         400),
    "prompt longer than the context": (
        {"messages": [{"role": "user", "content": "the model " * CONTEXT}]}, 400),
    "max_tokens negative": (chat(max_tokens=-1), 400),
    "max_tokens zero": (chat(max_tokens=0), 400),
    "max_tokens huge": (chat(max_tokens=10**12), 400),
    "max_tokens past the context": (chat(max_tokens=CONTEXT), 400),
    "unknown field": (chat(temprature=0.5), 400),
    "unknown message field": ({"messages": [{"role": "user", "content": "hi", "x": 1}]}, 400),
    "temperature NaN": (b'{"messages": [{"role": "user", "content": "hi"}], '
                        b'"temperature": NaN}', 400),
    "temperature too high": (chat(temperature=5), 400),
    "top_p zero": (chat(top_p=0), 400),
    "top_k zero": (chat(top_k=0), 400),
    "n = 2": (chat(n=2), 400),
    "five stop strings": (chat(stop=["a", "b", "c", "d", "e"]), 400),
    "empty stop string": (chat(stop=""), 400),
    "stream not a boolean": (chat(stream="yes"), 400),
    "negative seed": (chat(seed=-1), 400),
    "body too large": (b'{"messages": "' + b"x" * (2 << 20) + b'"}', 413),
}


@pytest.mark.parametrize("name", BAD_REQUESTS)
def test_bad_chat_request_is_refused_and_the_next_is_served(live_server, name):
    body, expected_status = BAD_REQUESTS[name]
    status, answer = post(live_server, "/v1/chat/completions", body)
    assert status == expected_status, answer
    error = answer["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert error["type"] == "invalid_request_error" and set(error) == {"message", "type",
                                                                       "param", "code"}
    assert_good_request_is_served(live_server)


def test_error_names_the_field_and_the_context(live_server):
    _, wrong_role = post(live_server, "/v1/chat/completions",
                         {"messages": [{"role": "wizard", "content": "hi"}]})
    assert wrong_role["error"]["param"] == "messages.0.role"
    _, too_long = post(live_server, "/v1/chat/completions",
                       {"messages": [{"role": "user", "content": "the model " * CONTEXT}]})
    assert too_long["error"]["code"] == "context_length_exceeded"
    assert f"context is {CONTEXT}" in too_long["error"]["message"]


@pytest.mark.parametrize("field, value", [("temperature", b"NaN"), ("temperature", b"Infinity"),
                                          ("top_p", b"NaN"), ("top_p", b"-Infinity")])
def test_a_sampling_number_that_is_not_finite_is_said_to_be_so(live_server, field, value):
    """Before: NaN was "should be less than or equal to 2", as if it were merely too big."""
    body = b'{"messages": [{"role": "user", "content": "hi"}], "' + field.encode() + b'": '
    status, answer = post(live_server, "/v1/chat/completions", body + value + b"}")
    assert status == 400 and answer["error"]["param"] == field, answer
    assert answer["error"]["message"] == f"{field}: Input should be a finite number", answer


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": ["a", "b"]}),
    ("/v1/completions", {"prompt": "hi", "messages": GOOD_MESSAGES}),
    ("/v1/completions", {"prompt": "\ud800"}),
])
def test_bad_completion_request_is_refused(live_server, path, body):
    status, answer = post(live_server, path, json.dumps(body).encode())
    assert status == 400 and answer["error"]["message"]
    assert_good_request_is_served(live_server)


@pytest.mark.parametrize("method, path, expected", [
    ("GET", "/v1/chat/completions", 405), ("POST", "/v1/nothing", 404)])
def test_unknown_routes_answer_in_the_error_shape(live_server, method, path, expected):
    status, answer = post(live_server, path, b"{}", method=method)
    assert status == expected and answer["error"]["message"]
    assert_good_request_is_served(live_server)


def test_client_disconnecting_mid_stream_frees_its_row(live_server):
    request = chat(max_tokens=CONTEXT - 20, temperature=0)
    _, whole = post(live_server, "/v1/chat/completions", request)
    assert whole["choices"][0]["finish_reason"] == "length"  # so it can only end by a cancel
    before = health(live_server)["finished"]["cancelled"]
    body = json.dumps({**request, "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", live_server.port), timeout=30) as client:
        client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       b"Content-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        received = b""
        while b"data: " not in received:  # read until the stream has started, then hang up
            chunk = client.recv(4096)
            assert chunk, "the server closed the stream before sending any event"
            received += chunk
    wait_until_idle(live_server)
    assert health(live_server)["finished"]["cancelled"] == before + 1  # not run to the end
    assert_good_request_is_served(live_server)


def test_api_key_is_checked(run_dir):
    server = start_server(run_dir, "--api_key", "s3cret")
    try:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            status, answer = post(server, "/v1/chat/completions", chat(max_tokens=2),
                                  headers=headers)
            assert status == 401 and answer["error"]["code"] == "invalid_api_key"
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="s3cret", max_retries=0)
        reply = client.chat.completions.create(model="run", messages=GOOD_MESSAGES, max_tokens=2)
        assert reply.usage.completion_tokens >= 1
        assert health(server)["status"] == "ok"  # liveness needs no key
    finally:
        server.stop()


def test_full_queue_answers_503_not_a_crash(run_dir):
    server = start_server(run_dir, "--max_batch_size=1", "--max_waiting=1")
    try:
        statuses = []
        sockets = []
        body = json.dumps(chat(stream=True, max_tokens=CONTEXT - 20)).encode()
        for _ in range(12):  # one runs, one waits, the rest are refused at once
            client = socket.create_connection(("127.0.0.1", server.port), timeout=30)
            client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                           b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            sockets.append(client)
        for client in sockets:
            statuses.append(int(client.recv(64).split()[1]))
            client.close()
        assert 200 in statuses and 503 in statuses
        wait_until_idle(server)  # the hung-up requests are cancelled, freeing the queue
        assert_good_request_is_served(server)
    finally:
        server.stop()


@pytest.mark.parametrize("host, warned", [("127.0.0.1", False), ("localhost", False),
                                          ("::1", False), ("0.0.0.0", True),
                                          ("192.168.1.5", True), ("example.org", True)])
def test_exposed_host_without_key_is_warned_about(host, warned):
    assert (serve.exposure_warning(host, None) is not None) == warned
    assert serve.exposure_warning(host, "key") is None
