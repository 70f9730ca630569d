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
    job = sbatch(job_env(PYTHON=str(recorder(tmp_path)), **settings), "--data_dir", "D",
                 "--out_dir", "O")
    assert job.returncode == 0, job.stderr
    assert f"ARGS: {expected}" in job.stdout


def recorder(folder: Path) -> Path:
    """A stand-in `python` that prints its arguments and the array task it runs as."""
    path = folder / "python"
    path.write_text('#!/bin/bash\necho "ARGS: $* (task ${SLURM_ARRAY_TASK_ID:-none})"\n')
    path.chmod(0o755)
    return path


FAKE_SBATCH = """#!/bin/bash
# sbatch on one machine: runs the job (every task of an --array in turn) and prints its id;
# a --dependency=afterok: on any job but the one submitted last fails.
set -e
array= after=
while [[ $1 == --* ]]; do
    case $1 in
        --array=*) array=${1#--array=} ;;
        --dependency=afterok:*) after=${1#--dependency=afterok:} ;;
    esac
    shift
done
last=$(cat "$JOBS" 2>/dev/null || echo 0)
if [[ -n $after && $after != "$last" ]]; then
    echo "afterok:$after, not the last job $last" >&2
    exit 1
fi
if [[ -n $array ]]; then
    for ((task = ${array%-*}; task <= ${array#*-}; task++)); do
        SLURM_ARRAY_TASK_ID=$task SLURM_ARRAY_TASK_MIN=${array%-*} \\
            SLURM_ARRAY_TASK_COUNT=$((${array#*-} - ${array%-*} + 1)) bash "$@" >> "$LOG"
    done
else
    bash "$@" >> "$LOG"
fi
echo $((last + 1)) | tee "$JOBS"
"""


def documented_chain() -> str:
    """The staged clean_pretrain_data commands of the script's comment, as one shell text."""
    lines = Path(REPO / SCRIPT).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if "every stage an array" in line)
    first = next(i for i in range(start, len(lines)) if lines[i].startswith("#     "))
    commands = []
    for line in lines[first:]:
        if not line.startswith("#     "):
            break
        commands.append(line.removeprefix("#     "))
    return "\n".join(commands).replace("\\\n", " ")


def test_the_documented_stages_run_in_order_each_after_the_last(tmp_path):
    """The comment's five sbatch lines, pasted with a fake sbatch: analyse, buckets and write
    as arrays, clusters and merge once, each job depending on the one before."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "sbatch").write_text(FAKE_SBATCH)
    (tmp_path / "bin" / "sbatch").chmod(0o755)
    env = job_env(PYTHON=str(recorder(tmp_path)), NUM_WORKERS="1", LOG=str(tmp_path / "log"),
                  JOBS=str(tmp_path / "jobs"), PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    chain = documented_chain().replace("0-15", "0-2").replace("ARGS", "--data_dir D")
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", chain], cwd=REPO, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    runs = [line.split("--stage=")[1] for line in (tmp_path / "log").read_text().splitlines()
            if line.startswith("ARGS:")]
    array = [("analyse", range(3)), ("buckets", range(3)), ("clusters", ["none"]),
             ("write", range(3)), ("merge", ["none"])]
    assert runs == [f"{stage} --data_dir D (task {task})" for stage, tasks in array
                    for task in tasks]


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
