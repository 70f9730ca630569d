"""Fixtures of the server tests: a tiny run dir and a live server on a free loopback port.

Everything is local: the model is a small random one (deterministic greedy output, no
near-ties), the tokenizer is trained by the session fixture in tests/conftest.py, and the
server listens on 127.0.0.1 only, in this process, and is stopped after the module.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest
import torch
import uvicorn

import serve
from model.loading import load_model
from model.modeling_z2all import Z2allForCausalLM
from tests.model.model_helpers import small_model
from tokenizer import load_tokenizer
from utils.checkpoint import save_checkpoint

torch.set_num_threads(1)  # the test machine is small and shared
CONTEXT = 96


def make_run_dir(root: Path, tokenizer_dir: Path, context: int = CONTEXT) -> Path:
    """A run dir as the trainer leaves it: config.json naming the tokenizer + a checkpoint."""
    tokenizer = load_tokenizer(tokenizer_dir)
    model = small_model("gqa", vocab_size=len(tokenizer), max_position_embeddings=context)
    run = root / "run"
    save_checkpoint(run / "ckpt", 3, model.save_pretrained)
    (run / "config.json").write_text(json.dumps({"tokenizer_dir": str(tokenizer_dir)}))
    return run


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory, tiny_hf_tokenizer_dir) -> Path:
    return make_run_dir(tmp_path_factory.mktemp("serve"), tiny_hf_tokenizer_dir)


@pytest.fixture(scope="session")
def reference_model(run_dir) -> Z2allForCausalLM:
    """The served weights, loaded separately: what the server's answers are checked against."""
    return load_model(run_dir)[0].eval()


class LiveServer:
    """uvicorn serving `app` on 127.0.0.1:<free port> in a thread of this process."""

    def __init__(self, app, timeout_s: float = 30.0) -> None:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))  # the OS picks a free port; uvicorn serves this socket
        self.port = listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [listener]},
                                       daemon=True)
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "server did not start"
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "server did not stop"


def start_server(run: Path, *extra_args: str) -> LiveServer:
    args = serve.parse_args(["--ckpt", str(run), "--device", "cpu", "--dtype", "fp32",
                             *extra_args])
    return LiveServer(serve.build_app(args))


@pytest.fixture(scope="module")
def live_server(run_dir):
    server = start_server(run_dir)
    yield server
    server.stop()
