"""`<run>/monitor.log`: what the supervisor saw and did, one event per line.

    2026-11-22T01:09:11.002Z EXIT attempt=1 cause="signal SIGKILL" step=1234

Timestamps are UTC with milliseconds, so lines from several hosts sort together; every line is
echoed to stderr with a `[monitor]` prefix.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path


class EventLog:
    """`<run>/monitor.log`: one event per line, UTC timestamp first, echoed to stderr."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def event(self, name: str, details: str) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        line = f"{now} {name} {details}"
        with open(self.path, "a") as handle:
            handle.write(line + "\n")
        print(f"[monitor] {line}", file=sys.stderr, flush=True)
