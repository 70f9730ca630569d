"""slurm/clean_array.sbatch: as a job array each task runs the data tool on its share (the
tool reads SLURM_ARRAY_*), outside an array it is the merge; run here with faked variables."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.data_preprocess.cleaning.test_clean_array_tasks import (
    corpus_with_copies_across_files,
    visible_files,
)

REPO = Path(__file__).resolve().parents[2]
SCRIPT = "slurm/clean_array.sbatch"


def job_env(**settings: str) -> dict[str, str]:
    """The environment of a batch job: no SLURM variables but those given."""
    return {**{name: value for name, value in os.environ.items()
               if not name.startswith("SLURM_")}, **settings}


def sbatch(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", SCRIPT, *args], cwd=REPO, env=env, capture_output=True,
                          text=True)


def test_the_script_parses():
    assert subprocess.run(["bash", "-n", SCRIPT], cwd=REPO).returncode == 0


@pytest.mark.parametrize("settings, expected", [
    ({"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_CPUS_PER_TASK": "8"},
     "-m data_preprocess.clean_pretrain_data --num_workers 8 --data_dir D --out_dir O"),
    ({"DATA_TOOL": "pretokenize_pretrain_data", "NUM_WORKERS": "2"},
     "-m data_preprocess.pretokenize_pretrain_data --num_workers 2 --data_dir D --out_dir O"),
])
def test_the_command_it_builds(tmp_path, settings, expected):
    recorder = tmp_path / "python"
    recorder.write_text('#!/bin/bash\necho "ARGS: $*"\n')
    recorder.chmod(0o755)
    job = sbatch(job_env(PYTHON=str(recorder), **settings), "--data_dir", "D", "--out_dir", "O")
    assert job.returncode == 0, job.stderr
    assert f"ARGS: {expected}" in job.stdout


def test_an_unknown_tool_is_one_line_exit_2():
    job = sbatch(job_env(DATA_TOOL="rm"), "--data_dir", "D")
    assert job.returncode == 2 and len(job.stderr.splitlines()) == 1
    assert "DATA_TOOL=rm is not a data tool" in job.stderr


def test_an_array_of_three_then_the_merge_equals_one_run(tmp_path):
    raw = tmp_path / "raw"
    corpus_with_copies_across_files(raw)
    options = ["--data_dir", str(raw), "--batch_size", "4"]
    for task_id in ("1", "2", "3"):  # --array=1-3
        job = sbatch(job_env(PYTHON=sys.executable, NUM_WORKERS="0", SLURM_ARRAY_TASK_ID=task_id,
                             SLURM_ARRAY_TASK_MIN="1", SLURM_ARRAY_TASK_COUNT="3"),
                     *options, "--out_dir", str(tmp_path / "array"))
        assert job.returncode == 0, job.stdout + job.stderr
        assert f"array task {task_id} of 3" in job.stdout
    for out in ("array", "one"):  # the merge (no array variables), and one plain run
        job = sbatch(job_env(PYTHON=sys.executable, NUM_WORKERS="0"), *options, "--out_dir",
                     str(tmp_path / out))
        assert job.returncode == 0, job.stdout + job.stderr
        if out == "array":
            assert "the merge" in job.stdout and "(4 already done)" in job.stdout
    assert visible_files(tmp_path / "array") == visible_files(tmp_path / "one")
    assert "clean_report.json" in visible_files(tmp_path / "one")
