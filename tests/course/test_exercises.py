"""The course's exercises can fail, and the project passes them: for every exercise, the fresh
stub fails, the project's own function passes, and every listed common mistake fails with a
report that names it. Plus the `python -m course` commands themselves.

All checks run in two processes side by side (tests/course/run_all_checks.py): importing torch
and collecting the reference tests once per process, not once per check.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from course.exercises import EXERCISES, WORK_ENV
from course.swap import REPO

# every exercise's stub, solution and mistakes: a few minutes of checks, in the slow lane
pytestmark = pytest.mark.slow

PROCESSES = 2
CASES = [(e.name, case) for e in EXERCISES
         for case in ("stub", "reference", *e.mistakes)]


def _run_shard(shard: int) -> str:
    done = subprocess.run([sys.executable, "-m", "tests.course.run_all_checks", str(shard),
                           str(PROCESSES)], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def outcomes() -> dict[tuple[str, str], dict]:
    with ThreadPoolExecutor(PROCESSES) as pool:
        outputs = list(pool.map(_run_shard, range(PROCESSES)))
    rows = [json.loads(line) for output in outputs for line in output.splitlines()
            if line.startswith("{")]
    return {(row["exercise"], row["case"]): row for row in rows}


@pytest.mark.parametrize("exercise, case", CASES)
def test_stub_fails_reference_passes_mistake_fails_by_name(outcomes, exercise, case):
    row = outcomes[exercise, case]
    if case == "reference":
        assert row["code"] == 0, row["report"]
    elif case == "stub":
        assert row["code"] == 1 and "NotImplementedError" in row["report"], row["report"]
    else:
        title = next(m.title for m in next(e for e in EXERCISES if e.name == exercise)
                     .mistake_files() if m.path.stem == case)
        assert row["code"] == 1, f"the mistake {case!r} passes the reference tests"
        assert f"- {title}:" in row["report"], row["report"]


def test_the_course_spans_chapters_and_packages():
    assert len(EXERCISES) >= 12
    assert len({e.chapter for e in EXERCISES}) >= 10
    assert len({e.target.split(".")[0] for e in EXERCISES}) >= 7
    assert all(e.mistakes for e in EXERCISES)


def _course(*argv: str, work) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "course", *argv], cwd=REPO, text=True,
                          capture_output=True, env={**os.environ, WORK_ENV: str(work)})


def test_list_json_names_every_exercise_and_its_files(tmp_path):
    done = _course("list", "--json", work=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [set(row) for row in rows] == [{"name", "chapter", "target", "workspace",
                                           "mistakes"}] * len(EXERCISES)
    for row in rows:
        assert row["workspace"] == str(tmp_path / f"{row['name']}.py")
        assert row["mistakes"] and all((REPO / path).is_file() for path in row["mistakes"])


def test_start_writes_a_stub_and_never_overwrites_without_force(tmp_path):
    workspace = tmp_path / "rms_norm.py"
    assert _course("start", "rms_norm", work=tmp_path).returncode == 0
    stub = workspace.read_text()
    assert "def rms_norm(x: torch.Tensor" in stub and "raise NotImplementedError" in stub
    workspace.write_text("# my work\n")
    again = _course("start", "rms_norm", work=tmp_path)
    assert again.returncode == 2 and "--force" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
    assert workspace.read_text() == "# my work\n"
    assert _course("start", "rms_norm", "--force", work=tmp_path).returncode == 0
    assert workspace.read_text() == stub


@pytest.mark.parametrize("argv, message", [
    (("check", "rms_norm"), "python -m course start rms_norm"),
    (("start", "no_such"), "python -m course list"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, argv, message):
    done = _course(*argv, work=tmp_path)
    assert done.returncode == 2 and message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_check_passes_the_solution_and_solution_prints_the_project_function(tmp_path):
    solution = _course("solution", "sft_packing", work=tmp_path)
    assert solution.stdout.startswith("def first_fit_decreasing(")
    (tmp_path / "sft_packing.py").write_text(
        "from __future__ import annotations\n\n\n" + solution.stdout)
    done = _course("check", "sft_packing", work=tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("passed"), done.stdout + done.stderr


def test_a_workspace_that_does_not_load_fails_the_check_with_its_error(tmp_path):
    (tmp_path / "rms_norm.py").write_text("def rms_norm(x:\n")
    done = _course("check", "rms_norm", work=tmp_path)
    assert done.returncode == 1 and "SyntaxError" in done.stdout, done.stdout + done.stderr
