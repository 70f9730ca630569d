"""The run's stderr, copied to the supervisor's, less torchrun's answer to a stop signal.

When the supervisor forwards Ctrl-C / SIGTERM, torchrun (the elastic agent) stops its ranks
and then ends by re-raising a `SignalException`: some 30 lines of traceback through its own
code, after a stop that went exactly as planned. Any way of stopping torchrun produces it (a
signal to the ranks alone makes it report them as failed instead), so the supervisor reads
the run's stderr through a pipe and, once it has forwarded a stop, replaces that one
traceback by one event line (TORCHRUN_STOPPED). Everything else passes unchanged: before a
stop, bytes as they come (progress bars redraw with `\\r`); after it, line by line, and a
traceback that ends in any other exception is shown whole.

It also remembers what a refused command said (`refused_line`): the run's last `error: ...`
line (utils/cli_errors.py), and the exit code torchrun reports for the rank that failed
first (its "Root Cause" section), since torchrun itself exits 1 whatever its ranks did.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
from collections.abc import Callable
from typing import BinaryIO

from monitor.event_log import EventLog

TRACEBACK_START = b"Traceback (most recent call last):"
SIGNAL_EXCEPTION = re.compile(rb"^\S*SignalException: Process \d+ got signal: (\d+)")
ERROR_LINE = b"error: "  # how a z2all command states an expected error (utils/cli_errors.py)
TORCHRUN_ROOT_CAUSE = b"Root Cause (first observed failure):"
TORCHRUN_EXIT_CODE = re.compile(rb"^\s*exitcode\s*:\s*(-?\d+)")
SCAN_LIMIT = 1 << 16  # bytes of an unfinished line kept for scanning (bars redraw with \r)


class StderrRelay:
    """Copies `pipe` to our stderr in a thread; `stopping()` says whether a stop was sent."""

    def __init__(self, pipe: BinaryIO, stopping: Callable[[], bool], log: EventLog):
        self.pipe, self.stopping, self.log = pipe, stopping, log
        self.out = sys.stderr.buffer
        self.held: list[bytes] = []  # a traceback being read, until its last line tells whose
        self.unscanned = b""  # the unfinished last line, for `_scan`
        self.error_line: str | None = None  # the run's last `error: ...` line
        self.in_root_cause = False
        self.root_cause_exit: int | None = None  # torchrun's exit code of the first failure
        self.thread = threading.Thread(target=self._copy, name="stderr-relay", daemon=True)
        self.thread.start()

    def join(self, timeout: float) -> None:
        """Wait for the run's end of the pipe to close (every process of the run gone)."""
        self.thread.join(timeout)

    def _copy(self) -> None:
        partial = b""
        while chunk := os.read(self.pipe.fileno(), 1 << 16):
            self._scan(chunk)
            if not self.stopping():
                self._write(chunk)
                continue
            *lines, partial = (partial + chunk).split(b"\n")
            for line in lines:
                self._line(line + b"\n")
        self._write(b"".join(self.held) + partial)
        self.pipe.close()

    def refused_line(self, exit_code: int, bad_input_code: int) -> str | None:
        """Once the pipe is closed: the run's error line if it ended as bad input (exit code
        `bad_input_code` of the command, or of torchrun's first failed rank), else None."""
        if bad_input_code not in (exit_code, self.root_cause_exit):
            return None
        return self.error_line or f"exit code {bad_input_code} (bad input)"

    def _scan(self, chunk: bytes) -> None:
        *lines, self.unscanned = (self.unscanned + chunk).split(b"\n")
        self.unscanned = self.unscanned[-SCAN_LIMIT:]
        for line in lines:
            if line.startswith(ERROR_LINE):
                self.error_line = line.decode(errors="replace").strip()
            elif line.startswith(TORCHRUN_ROOT_CAUSE):
                self.in_root_cause = True
            elif self.in_root_cause and (match := TORCHRUN_EXIT_CODE.match(line)):
                self.root_cause_exit, self.in_root_cause = int(match[1]), False

    def _line(self, line: bytes) -> None:
        if not self.held and line.startswith(TRACEBACK_START):
            self.held = [line]
        elif not self.held:
            self._write(line)
        elif line[:1].isspace():  # a frame of the traceback
            self.held.append(line)
        else:  # its last line: the exception
            held, self.held = self.held, []
            if match := SIGNAL_EXCEPTION.match(line):
                self.log.event("TORCHRUN_STOPPED", f"signal={signal.Signals(int(match[1])).name}"
                                                   " (its SignalException traceback left out)")
            else:
                self._write(b"".join(held) + line)

    def _write(self, data: bytes) -> None:
        if data:
            self.out.write(data)
            self.out.flush()
