"""What a run directory says about a training run's progress, read from files only.

`monitor_process.py` decides "crashed", "hung" and "resumed from where" from these, without
importing anything of the trainer (docs/design.md §2.7 fixes the files):

    out/<run>/heartbeat                      {"step": 1234, "time": 1795309463.3} rewritten
                                             atomically by rank 0 after every step
    out/<run>/ckpt/step_001200/manifest.json {"step": 1200, ...} written last: a checkpoint
                                             dir without it is unfinished
    out/<run>/metrics.jsonl                  {"kind": "resume", "step": 1200, "checkpoint": ...}
                                             appended by the trainer when it resumes
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path


def read_json_or_none(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def newest_checkpoint_step(run_dir: Path) -> int | None:
    """The highest `"step"` among `ckpt/step_*/manifest.json`; a dir without one is unfinished.

    The trainer also verifies sizes and sha256 before loading; this is the supervisor's cheap
    view for the log, so it only needs the manifest (written last) to exist and parse.
    """
    steps = []
    for manifest_path in run_dir.glob("ckpt/step_*/manifest.json"):
        manifest = read_json_or_none(manifest_path)
        if manifest is not None and isinstance(manifest.get("step"), int):
            steps.append(manifest["step"])
    return max(steps, default=None)


def heartbeat_step(run_dir: Path) -> int | None:
    beat = read_json_or_none(run_dir / "heartbeat")
    return beat.get("step") if beat is not None else None


class HeartbeatWatch:
    """Decides "hung" from how long the heartbeat file has not changed, timed on *our* clock.

    Comparing file contents, not the trainer's `time` field, makes clock skew between hosts
    irrelevant. The file left by an earlier attempt does not count as a beat of this one.
    """

    def __init__(self, path: Path, startup_timeout: float, heartbeat_timeout: float):
        self.path = path
        self.startup_timeout = startup_timeout
        self.heartbeat_timeout = heartbeat_timeout
        self.last_content = self._read()
        self.last_change = time.monotonic()
        self.seen_beat = False

    def _read(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except OSError:
            return None

    def overdue_seconds(self) -> float | None:
        """Seconds of silence if past the limit (startup or heartbeat), else None."""
        if self.heartbeat_timeout <= 0:
            return None
        content = self._read()
        if content is not None and content != self.last_content:
            self.last_content, self.last_change, self.seen_beat = content, time.monotonic(), True
        silence = time.monotonic() - self.last_change
        limit = self.heartbeat_timeout if self.seen_beat else self.startup_timeout
        return silence if silence > limit else None


class ResumeLines:
    """Yields the trainer's `{"kind": "resume"}` lines appended to metrics.jsonl since creation."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0

    def new(self) -> list[dict]:
        try:
            with open(self.path, "rb") as handle:
                if os.fstat(handle.fileno()).st_size < self.offset:
                    self.offset = 0  # the file was replaced: read it from the start
                handle.seek(self.offset)
                chunk = handle.read()
        except OSError:
            return []
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits
        self.offset += len(complete)
        found = []
        for line in complete.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("kind") == "resume":
                found.append(record)
        return found
