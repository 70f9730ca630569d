"""Serve a model over an OpenAI-compatible HTTP API, with a chat page in the browser.

    python serve.py --ckpt out/demo_dpo                  # then open http://127.0.0.1:8000/
    python serve.py --ckpt out/<run> --host 0.0.0.0 --api_key "$(openssl rand -hex 16)"

`--ckpt` is what generate.py takes (run dir, checkpoint dir, save_pretrained dir or HF Llama
dir), and so is the tokenizer default. Concurrent requests are decoded together over one KV
cache (continuous batching, server/engine.py); the files to read are listed in server/__init__.py.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys
from pathlib import Path

from model.loading import (
    add_model_arguments,
    check_device,
    load_for_inference,
    resolve_model_arguments,
)
from server.app import ServedModel, create_app
from server.engine import Engine
from server.slow_clients import SlowClientTimeout
from utils.cli_errors import run_main
from utils.log_setup import configure_logging
from utils.option_parser import OptionParser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = OptionParser(description=__doc__.split("\n\n")[0])
    add_model_arguments(parser)
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on; 0.0.0.0 exposes the server to the network")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api_key", default=os.environ.get("Z2ALL_API_KEY"),
                        help="require 'Authorization: Bearer KEY' on /v1/* "
                             "(default: $Z2ALL_API_KEY; none = no authentication)")
    parser.add_argument("--max_batch_size", type=int, default=16,
                        help="requests decoded together at most; the others wait")
    parser.add_argument("--max_waiting", type=int, default=64,
                        help="requests that may wait; more are refused with HTTP 503")
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port {args.port}: choose a port in 0..65535")
    if args.max_batch_size < 1 or args.max_waiting < 1:
        parser.error("--max_batch_size and --max_waiting must be at least 1")
    resolve_model_arguments(args)
    if not Path(args.ckpt).exists():
        parser.error(f"--ckpt {args.ckpt}: no such file or directory")
    if args.api_key is not None and not (args.api_key.isascii() and args.api_key.isprintable()
                                         and args.api_key.strip()):
        parser.error("--api_key must be printable ASCII (HTTP headers carry no other text), "
                     "e.g. $(openssl rand -hex 16)")
    check_device(args.device)
    return args


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name
        return host == "localhost"


LOOPBACK_NAMES = {"127.0.0.1", "localhost", "[::1]"}
"""The Host headers a loopback server answers (anything else is DNS rebinding)."""


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """A warning when other machines can reach the server and nothing checks who they are."""
    if api_key or is_loopback(host):
        return None
    return (f"WARNING: serving on {host} without authentication: anyone who can reach this "
            "port can use the model. Pass --api_key KEY (clients send 'Authorization: Bearer "
            "KEY') or bind to 127.0.0.1.")


def build_app(args: argparse.Namespace):
    model, tokenizer = load_for_inference(args)
    served = ServedModel(name=Path(args.ckpt).resolve().name, tokenizer=tokenizer,
                         context_length=model.config.max_position_embeddings)
    engine = Engine(model, args.max_batch_size, args.max_waiting, real_vocab_size=len(tokenizer))
    allowed_hosts = LOOPBACK_NAMES | {args.host} if is_loopback(args.host) else None
    return create_app(engine, served, args.api_key, allowed_hosts)


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything is announced (a busy port is one line)."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    try:
        return socket.create_server((host, port), family=family)
    except OSError as error:
        raise ValueError(f"--host {host} --port {port}: cannot listen there ({error.strerror}); "
                         "choose another --port") from None


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    configure_logging()  # the model's kernel line, once, at the first request
    import uvicorn  # keeps `--help` fast

    warning = exposure_warning(args.host, args.api_key)
    if warning:
        print(warning, file=sys.stderr)
    app = build_app(args)
    listener = bind(args.host, args.port)
    print(f"serving {args.ckpt}: chat page http://{args.host}:{args.port}/ , "
          f"OpenAI API base URL http://{args.host}:{args.port}/v1", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="info", http=SlowClientTimeout)
                   ).run(sockets=[listener])


if __name__ == "__main__":
    sys.exit(run_main(main))
