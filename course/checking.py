"""Run an exercise's reference tests (the project's own test functions) against a workspace.

`run_check` swaps the workspace's function in (course/swap.py), runs the exercise's test node
ids with pytest in this process, stops at the first failure, and puts the project's function
back. Several checks can run one after another in one process (the course's own test does:
importing torch and collecting the tests once saves seconds per check).
"""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from course.exercises import Exercise
from course.swap import (
    REPO,
    children_swap_through,
    load_workspace,
    restore,
    swap_everywhere,
    write_spec,
)


@dataclass
class CheckResult:
    passed: bool
    failed_test: str | None = None   # node id of the first failing test
    message: str = ""                # its assertion (or exception) line(s)
    output: str = ""                 # pytest's own report, for --verbose


def _short(message: str) -> str:
    """The first line of a failure and, for a failure on another rank (whose traceback
    travels in the message), its last lines: where the assertion is."""
    lines = [line for line in message.splitlines() if line.strip()]
    return "\n".join(lines if len(lines) <= 4 else [lines[0], "  ...", *lines[-3:]])


class _FirstFailure:
    """A pytest plugin that remembers the first failing test and its short message."""

    def __init__(self) -> None:
        self.node: str | None = None
        self.message = ""

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.failed and self.node is None:
            self.node = report.nodeid
            crash = getattr(report.longrepr, "reprcrash", None)
            self.message = _short(crash.message if crash is not None else str(report.longrepr))

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed and self.node is None:
            self.node, self.message = report.nodeid, _short(str(report.longrepr))


_SPEC_FILE: Path | None = None


def _spec_file() -> Path:
    """One spec file per process; children (fork servers too) are pointed at it once."""
    global _SPEC_FILE
    if _SPEC_FILE is None:
        folder = tempfile.mkdtemp(prefix="z2all-course-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        _SPEC_FILE = Path(folder) / "swap.json"
        write_spec(_SPEC_FILE, None, None)
        children_swap_through(_SPEC_FILE)
    return _SPEC_FILE


def run_check(exercise: Exercise, workspace: Path) -> CheckResult:
    """The exercise's tests with `workspace`'s function as the target; passed only if all pass."""
    spec_file = _spec_file()
    try:
        replacement = load_workspace(exercise.target, workspace)
    except Exception as error:  # noqa: BLE001 - a student's file may fail in any way
        return CheckResult(False, str(workspace), f"{type(error).__name__}: {error}")
    write_spec(spec_file, exercise.target, workspace)
    swap = swap_everywhere(exercise.target, replacement)
    recorder = _FirstFailure()
    out = io.StringIO()
    previous_dir = Path.cwd()
    try:
        os.chdir(REPO)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = pytest.main(["-x", "-q", "-p", "no:cacheprovider", "--no-header",
                                "-W", "ignore::pytest.PytestAssertRewriteWarning",
                                *exercise.tests], plugins=[recorder])
    finally:
        os.chdir(previous_dir)
        restore(swap)
        write_spec(spec_file, None, None)
    passed = code == pytest.ExitCode.OK and recorder.node is None
    if not passed and recorder.node is None:
        recorder.message = f"pytest exited with {code!r}"
    return CheckResult(passed, recorder.node, recorder.message, out.getvalue())
