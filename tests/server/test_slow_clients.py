"""A client that never finishes its request headers is disconnected after the timeout, while
a normal client on the same server is answered."""

from __future__ import annotations

import socket
import time

import uvicorn

from server.slow_clients import SlowClientTimeout
from tests.server.conftest import LiveServer, start_server
from tests.server.test_bad_input import assert_good_request_is_served


class QuickTimeout(SlowClientTimeout):
    header_timeout_s = 0.5


def test_slow_headers_are_cut_off_and_others_are_served(run_dir, monkeypatch):
    real_config = uvicorn.Config
    monkeypatch.setattr(uvicorn, "Config",
                        lambda app, **kw: real_config(app, http=QuickTimeout, **kw))
    server = start_server(run_dir)  # LiveServer builds its uvicorn.Config: now with the timeout
    assert isinstance(server, LiveServer)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as slow:
            slow.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            started = time.monotonic()
            assert slow.recv(100) == b""  # closed by the server, no answer
            assert 0.4 < time.monotonic() - started < 5
        assert_good_request_is_served(server)  # keep-alive requests still work
    finally:
        server.stop()
