"""utils.cli_errors: which errors end in one line with which exit code, and --debug."""

from __future__ import annotations

import errno

import pytest

from utils.cli_errors import (
    EXIT_BAD_INPUT,
    EXIT_RUNTIME_FAILURE,
    DiskFullError,
    ReportedElsewhere,
    disk_full_explained,
    run_main,
    split_debug_flag,
)
from utils.option_checks import range_problem


def failing(error: BaseException):
    def main(argv: list[str]) -> int:
        raise error
    return main


@pytest.mark.parametrize("error, code, line", [
    (ValueError("a.jsonl:3: malformed_json: x"), EXIT_BAD_INPUT, "a.jsonl:3: malformed_json: x"),
    (FileNotFoundError(errno.ENOENT, "No such file or directory", "d/x"), EXIT_BAD_INPUT,
     "d/x: no such file or directory"),
    (OSError(errno.ENOSPC, "No space left on device", "out/a.bin"), EXIT_RUNTIME_FAILURE,
     "no space left on device while writing out/a.bin"),
    (OSError(errno.EIO, "Input/output error", "out/a.bin"), EXIT_RUNTIME_FAILURE,
     "out/a.bin: input/output error"),
    (MemoryError("rank 0 ran out of memory"), EXIT_RUNTIME_FAILURE, "rank 0 ran out of memory"),
])
def test_expected_errors_are_one_line(error, code, line, capsys, monkeypatch):
    monkeypatch.delenv("Z2ALL_DEBUG", raising=False)
    assert run_main(failing(error), []) == code
    assert capsys.readouterr().err == f"error: {line}\n"


def test_bugs_and_debug_keep_the_traceback(monkeypatch):
    monkeypatch.delenv("Z2ALL_DEBUG", raising=False)
    with pytest.raises(KeyError):
        run_main(failing(KeyError("a bug")), [])
    with pytest.raises(ValueError):
        run_main(failing(ValueError("bad option")), ["--debug"])
    monkeypatch.setenv("Z2ALL_DEBUG", "1")
    with pytest.raises(ValueError):
        run_main(failing(ValueError("bad option")), [])


@pytest.mark.parametrize("code", [EXIT_BAD_INPUT, EXIT_RUNTIME_FAILURE])
def test_an_error_another_rank_prints_exits_with_its_code_silently(code, capsys, monkeypatch):
    monkeypatch.delenv("Z2ALL_DEBUG", raising=False)
    assert run_main(failing(ReportedElsewhere(code)), []) == code
    assert capsys.readouterr().err == ""


def test_debug_flag_is_removed_only_before_the_separator():
    assert split_debug_flag(["--a=1", "--debug"]) == (["--a=1"], True)
    assert split_debug_flag(["--x", "--", "cmd", "--debug"]) == (["--x", "--", "cmd", "--debug"],
                                                                 False)


def test_disk_full_explained_names_the_path_and_note():
    with pytest.raises(DiskFullError) as error, disk_full_explained("ckpt/.tmp", "old is intact"):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert str(error.value) == "no space left on device while writing ckpt/.tmp; old is intact"
    with pytest.raises(PermissionError), disk_full_explained("x"):
        raise PermissionError(errno.EACCES, "denied")


@pytest.mark.parametrize("value, fine", [(0.5, True), (1.0, True), (0.0, False), (1.5, False),
                                         (float("nan"), False), (float("inf"), False)])
def test_range_problem_matches_the_interval(value, fine):
    problem = range_problem("--top_p", value, 0, 1, low_open=True)
    assert (problem is None) == fine == (0 < value <= 1)
    if problem:
        assert problem.startswith("--top_p must be ") and "(0, 1]" in problem
