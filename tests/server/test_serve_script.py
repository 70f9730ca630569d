"""`python serve.py` as a user runs it: a real process on a free loopback port, stopped after."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import serve
from utils.cli_errors import EXIT_BAD_INPUT, run_main

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_serve_script_serves_the_page_and_the_api(run_dir):
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "serve.py", "--ckpt", str(run_dir), "--port", str(port),
         "--device", "cpu"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, process.stdout.read()
            assert time.monotonic() < deadline, "serve.py did not answer /health in time"
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                    assert json.load(response)["status"] == "ok"
                break
            except OSError:
                time.sleep(0.2)
        with urllib.request.urlopen(f"{url}/", timeout=5) as response:
            page = response.read().decode()
        assert "<title>z2all chat</title>" in page
        assert "://" not in page and "src=" not in page  # self-contained: no CDN
        request = urllib.request.Request(
            f"{url}/v1/chat/completions", headers={"Content-Type": "application/json"},
            data=json.dumps({"messages": [{"role": "user", "content": "hi"}],
                             "max_tokens": 4}).encode())
        with urllib.request.urlopen(request, timeout=30) as response:
            assert json.load(response)["usage"]["completion_tokens"] >= 1
    finally:
        process.terminate()
        output = process.communicate(timeout=30)[0]
    assert f"chat page http://127.0.0.1:{port}/" in output
    assert "WARNING" not in output  # loopback: no exposure warning


@pytest.mark.parametrize("args, message", [
    (["--ckpt", "no/such/run"], "--ckpt no/such/run: no such file or directory"),
    (["--ckpt", ".", "--port", "70000"], "--port 70000: choose a port in 0..65535"),
    (["--ckpt", ".", "--api_key", "clé"], "--api_key must be printable ASCII"),
    (["--ckpt", ".", "--device", "cuda:99"], "--device cuda:99: "),
])
def test_bad_options_fail_in_one_line_before_loading(args, message):
    result = subprocess.run([sys.executable, "serve.py", *args], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and message in result.stderr


def test_a_busy_port_is_one_line_and_no_url_is_printed(run_dir, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = run_main(serve.main, ["--ckpt", str(run_dir), "--port", str(port),
                                     "--device", "cpu", "--dtype", "fp32"])
    out, err = capsys.readouterr()
    assert code == EXIT_BAD_INPUT and "http://" not in out
    assert f"error: --host 127.0.0.1 --port {port}: cannot listen there" in err
