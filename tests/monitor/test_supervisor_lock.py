"""Two supervisors started at the same instant on one run dir: exactly one runs the command.

Reference: the command appends one line to a file each time it runs, so the file counts the
launches; without the supervisor lock the loser relaunched the command itself.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import monitor_process
from monitor.supervisor_lock import only_supervisor
from utils.cli_errors import EXIT_BAD_INPUT, run_main
from utils.run_directory import supervisor_files

REPO = Path(__file__).resolve().parents[2]


def monitor_command(run_dir: Path, launches: Path) -> list[str]:
    job = f"open({str(launches)!r}, 'a').write('run\\n'); import time; time.sleep(1.5)"
    return [sys.executable, "monitor_process.py", "--out_dir", str(run_dir), "--max_restarts",
            "2", "--restart_delay", "0", "--heartbeat_timeout", "0", "--", sys.executable,
            "-c", job]


def test_two_monitors_at_once_launch_the_command_once(tmp_path):
    run_dir, launches = tmp_path / "run", tmp_path / "launches.txt"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    monitors = [subprocess.Popen(monitor_command(run_dir, launches), cwd=REPO, env=env,
                                 stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = sorted((monitor.wait(timeout=60), monitor.stderr.read()) for monitor in monitors)
    assert [code for code, _ in results] == [0, EXIT_BAD_INPUT]
    assert "another monitor_process.py supervises this run" in results[1][1]
    assert launches.read_text() == "run\n"


def test_a_supervised_run_dir_is_refused_in_one_line_and_free_afterwards(tmp_path, capsys):
    run_dir, launches = tmp_path / "run", tmp_path / "launches.txt"
    argv = monitor_command(run_dir, launches)[2:]
    with only_supervisor(run_dir):
        assert run_main(monitor_process.main, argv) == EXIT_BAD_INPUT
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error: another monitor_process.py supervises this run: run dir")
    assert not launches.exists()
    assert run_main(monitor_process.main, argv) == 0  # released: the next supervisor runs it
    assert launches.read_text() == "run\n"


def _make(root: Path, layout: dict[str, str | None]) -> None:
    for name, text in layout.items():
        path = root / name
        if text is None:
            path.mkdir(parents=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)


MARKER_TEXT = '{"format": "z2all run directory", "version": 1}\n'


@pytest.mark.parametrize("layout, foreign", [
    ({"monitor.log": "the user's own log\n", "notes.txt": "mine\n"}, "notes.txt"),
    ({"z2all_run.json": MARKER_TEXT, "ckpt/": None, "thesis.tex": "\\begin{document}\n"},
     "thesis.tex"),
    ({"metrics.jsonl": '{"kind": "train"}\n', "config.json": '{"model_type": "llama"}\n'},
     "config.json"),
], ids=["users-log", "copied-marker", "other-tools-metrics"])
def test_a_foreign_run_dir_gets_no_lock_no_log_and_no_launch(tmp_path, capsys, layout, foreign):
    """Was: the supervisor wrote .monitor.lock and appended to the user's monitor.log."""
    run_dir, launches = tmp_path / "run", tmp_path / "launches.txt"
    _make(run_dir, layout)
    before = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
    assert run_main(monitor_process.main, monitor_command(run_dir, launches)[2:]) == EXIT_BAD_INPUT
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and f"holds {foreign}, which no z2all run writes" in error, error
    assert {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()} == before
    assert not launches.exists()


@pytest.mark.parametrize("layout", [None, {}, {"z2all_run.json": MARKER_TEXT, "ckpt/": None,
                                               "monitor.log": "", ".monitor.lock": ""}],
                         ids=["new", "empty", "its-own-run"])
def test_a_new_empty_or_own_run_dir_is_supervised(tmp_path, layout):
    run_dir, launches = tmp_path / "run", tmp_path / "launches.txt"
    if layout is not None:
        run_dir.mkdir()
        _make(run_dir, layout)
    assert run_main(monitor_process.main, monitor_command(run_dir, launches)[2:]) == 0
    assert launches.read_text() == "run\n" and (run_dir / "monitor.log").is_file()


@pytest.mark.parametrize("held_by, node_name, expected", [
    ("node0", "node1", 0),                 # each node of a multi-node run: its own supervisor
    ("node0", "node0", EXIT_BAD_INPUT),    # a second supervisor on the same node: refused
    (None, "node0", 0),                    # the run's single supervisor is another role
])
def test_supervisors_of_a_multi_node_run_lock_one_node_each(tmp_path, held_by, node_name,
                                                           expected):
    run_dir, launches = tmp_path / "run", tmp_path / "launches.txt"
    argv = ["--node_name", node_name, *monitor_command(run_dir, launches)[2:]]
    lock_file = supervisor_files(held_by)[0]
    with only_supervisor(run_dir, lock_file):
        assert run_main(monitor_process.main, argv) == expected
    assert (run_dir / "nodes" / f"{node_name}.monitor.log").exists() == (expected == 0)


@pytest.mark.parametrize("torchrun_args, node_name", [
    (["--nnodes=2", "--node_rank=1"], socket.gethostname()),   # the seed's static form
    (["--nnodes", "1:4", "--rdzv_backend=c10d"], socket.gethostname()),  # elastic range
    (["--nnodes=1", "--nproc_per_node=8"], None),                # one node: the run's lock
    (["--standalone"], None),
])
def test_a_multi_node_command_makes_the_supervisor_a_nodes(tmp_path, torchrun_args, node_name):
    config, _ = monitor_process.parse_args(["--out_dir", str(tmp_path), "--", "torchrun",
                                            *torchrun_args, "train_my_ddp.py"])
    assert config.node_name == node_name
