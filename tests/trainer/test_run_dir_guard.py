"""A run directory never loses a run: a fresh run refuses one that holds another run (or moves
it aside with --overwrite), a resume cannot change the model's shape, and a stop signal to
the whole process group (workers included) still ends with a checkpoint."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import train_my_ddp
from tests.train_helpers import TINY_ARGS, data_args, run_main, tiny_training_data
from tools import evaluate, resplot
from trainer import training_checkpoint
from trainer.metrics import read_metrics
from utils.checkpoint import list_checkpoints
from utils.cli_errors import EXIT_BAD_INPUT
from utils.cli_errors import run_main as cli_run_main
from utils.run_directory import RunLock
from utils.run_ownership import foreign_entry

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def data(tmp_path_factory, tiny_hf_tokenizer_dir) -> dict[str, Path]:
    return tiny_training_data(tmp_path_factory.getbasetemp(), tiny_hf_tokenizer_dir)


def _args(data, *extra: str) -> list[str]:
    return [*TINY_ARGS, *data_args(data, "pretrain"), "--eval_interval=1000",
            '--eval_prompts=[]', *extra]


def _steps(run_dir: Path) -> list[int]:
    return [step for step, _ in list_checkpoints(run_dir / "ckpt")]


def test_a_fresh_run_refuses_a_used_run_dir_and_overwrite_moves_it_aside(data, tmp_path,
                                                                          capsys):
    run_dir = tmp_path / "pre"
    assert run_main(_args(data, f"--out_dir={run_dir}", "--max_iters=6",
                          "--save_interval=3")) == 0
    before = {path: path.stat().st_mtime_ns for path in run_dir.rglob("*") if path.is_file()}
    again = _args(data, f"--out_dir={run_dir}", "--max_iters=4", "--save_interval=2",
                  "--keep_last=2")
    assert cli_run_main(train_my_ddp.main, again) == EXIT_BAD_INPUT
    message = capsys.readouterr().err
    assert "holds another run (checkpoints up to step 6)" in message
    assert "--resume" in message and "--overwrite" in message
    assert {path: path.stat().st_mtime_ns for path in run_dir.rglob("*")
            if path.is_file()} == before  # nothing written, nothing lost

    assert run_main([*again, "--overwrite"]) == 0
    (moved,) = tmp_path.glob("pre.old-*")
    assert _steps(moved) == [3, 6]  # the earlier run, whole
    assert _steps(run_dir) == [2, 4]
    assert {record["step"] for record in read_metrics(run_dir)
            if record["kind"] == "train"} == {1, 2, 3, 4}  # the new run's metrics only


def test_pruning_never_removes_the_checkpoint_just_written(tmp_path):
    from utils.checkpoint import begin_checkpoint, finish_checkpoint

    for step in (300, 320, 2, 4):  # a later run's steps written beside an earlier run's
        tmp_dir = begin_checkpoint(tmp_path, step)
        (tmp_dir / "weights.bin").write_bytes(os.urandom(16))
        finish_checkpoint(tmp_dir, step, keep_last=2)
    assert [step for step, _ in list_checkpoints(tmp_path)] == [2, 4, 300, 320]


def test_resume_refuses_a_change_of_the_model_shape_before_writing(data, tmp_path):
    run_dir = tmp_path / "run"
    assert run_main(_args(data, f"--out_dir={run_dir}", "--max_iters=2")) == 0
    config = (run_dir / "config.json").read_text()
    for change, saved in (("--hidden_size=64", "32"), ("--max_seq_len=64", "32")):
        with pytest.raises(ValueError, match=f"--resume cannot change {change}.*has {saved}"):
            run_main(_args(data, f"--out_dir={run_dir}", "--resume", "--max_iters=4", change))
    assert (run_dir / "config.json").read_text() == config
    assert json.loads(config)["hidden_size"] == 32


def test_sigterm_to_the_process_group_with_workers_still_checkpoints(data, tmp_path):
    """What a supervisor, SLURM or Kubernetes does: SIGTERM to every process of the job, the
    DataLoader workers included. The workers leave the stop to the trainer."""
    run_dir = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "train_my_ddp.py", *_args(data, f"--out_dir={run_dir}",
                                                   "--max_iters=100000",
                                                   "--save_interval=100000",
                                                   "--num_workers=2")],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 180
    while process.poll() is None and not _heartbeat_step(run_dir):
        assert time.monotonic() < deadline, "the run made no step"
        time.sleep(0.1)
    os.killpg(process.pid, signal.SIGTERM)
    returncode = process.wait(timeout=120)
    assert returncode == 128 + signal.SIGTERM, process.stderr.read().decode()
    assert _steps(run_dir), "no checkpoint was written"


def _heartbeat_step(run_dir: Path) -> int:
    try:
        return json.loads((run_dir / "heartbeat").read_text())["step"]
    except (OSError, ValueError):
        return 0


# ---- a run directory only ever holds its run (issue 29, items 1-3 and 14) ----------------------

def _files(root: Path) -> dict[str, bytes | None]:
    """Every path under `root` with its bytes (None for a directory): to compare before/after."""
    return {str(path.relative_to(root)): None if path.is_dir() else path.read_bytes()
            for path in sorted(root.rglob("*"))}


def _refused(argv: list[str], capsys) -> str:
    """The trainer's one-line error for `argv` (it must exit 2, before any work)."""
    assert cli_run_main(train_my_ddp.main, argv) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


def test_out_dir_dot_never_deletes_the_tokenizer_code_beside_it(data, tmp_path, monkeypatch,
                                                                capsys):
    """The red-team command: --out_dir=. from a checkout removed tokenizer/ (code and all)."""
    checkout = tmp_path / "checkout"
    shutil.copytree(data["tokenizer"], checkout / "tokenizer" / "demo_hf")
    (checkout / "tokenizer" / "__init__.py").write_text("# code\n")
    before = _files(checkout)
    monkeypatch.chdir(checkout)
    args = [a for a in _args(data) if not a.startswith("--tokenizer_dir")]
    for extra in ([], ["--overwrite"], ["--resume"]):
        err = _refused([*args, "--tokenizer_dir=tokenizer/demo_hf", "--out_dir=.", *extra],
                       capsys)
        assert "--out_dir=." in err or extra == ["--resume"]  # (no config.json to resume)
        assert _files(checkout) == before


@pytest.mark.parametrize("kind", ["hf_model", "tokenizer", "file"])
def test_a_fresh_run_refuses_a_directory_that_is_not_a_run(data, tmp_path, capsys, kind):
    if kind == "file":  # item 14: was "[Errno 17] File exists", exit 1
        target = tmp_path / "notes.txt"
        target.write_text("mine\n")
    else:
        target = tmp_path / kind
        target.mkdir()
        (target / "config.json").write_text('{"model_type": "llama"}')
        if kind == "tokenizer":
            shutil.copytree(data["tokenizer"], target, dirs_exist_ok=True)
    before = _files(tmp_path)
    for extra in ([], ["--overwrite"]):
        err = _refused(_args(data, f"--out_dir={target}", *extra), capsys)
        assert f"--out_dir={target}" in err and "new or empty directory" in err
        assert _files(tmp_path) == before


def test_overwrite_never_moves_a_directory_the_run_reads_or_a_home(data, tmp_path, capsys,
                                                                   monkeypatch):
    """Directories that look like an old run (a metrics.jsonl) but hold what the run reads."""
    project = tmp_path / "project"
    shutil.copytree(data["pretrain"], project / "data")
    home = tmp_path / "home"
    for directory in (project, home):
        directory.mkdir(exist_ok=True)
        (directory / "metrics.jsonl").write_text('{"kind": "train"}\n')
    monkeypatch.setenv("HOME", str(home))
    before = _files(tmp_path)
    args = [a for a in _args(data) if not a.startswith("--data_dir")]
    for out_dir, data_dir in ((project, project / "data"), (project / "data", project / "data"),
                              (home, data["pretrain"])):
        err = _refused([*args, f"--data_dir={data_dir}", f"--out_dir={out_dir}", "--overwrite"],
                       capsys)
        assert f"--out_dir={out_dir}" in err
        assert _files(tmp_path) == before


def test_a_run_is_marked_and_an_older_unmarked_run_still_resumes(data, tmp_path):
    run_dir = tmp_path / "run"
    assert run_main(_args(data, f"--out_dir={run_dir}", "--max_iters=2")) == 0
    marker = json.loads((run_dir / "z2all_run.json").read_text())
    assert marker["format"] == "z2all run directory" and marker["version"] == 1
    (run_dir / "z2all_run.json").unlink()  # a run made before the marker existed
    assert run_main(_args(data, f"--out_dir={run_dir}", "--resume", "--max_iters=3")) == 0
    assert (run_dir / "z2all_run.json").is_file()  # adopted
    assert _steps(run_dir) == [2, 3]


def test_overwrite_refuses_a_live_run_naming_its_holder(data, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert run_main(_args(data, f"--out_dir={run_dir}", "--max_iters=2")) == 0
    live = RunLock(run_dir)  # the run, still training (another open file: flock conflicts)
    live.acquire()
    try:
        before = _files(tmp_path)
        err = _refused(_args(data, f"--out_dir={run_dir}", "--max_iters=2", "--overwrite"),
                       capsys)
        assert f"in use by PID {os.getpid()} (host {socket.gethostname()})" in err
        assert _files(tmp_path) == before  # not moved aside
    finally:
        live.release()


def test_a_trainer_whose_run_dir_is_moved_stops_before_writing_into_the_new_one(
        data, tmp_path, capsys, monkeypatch):
    """Someone renames the live run's directory and a new run's takes the name, between two
    steps (made deterministic here by doing it from the step itself)."""
    run_dir, moved = tmp_path / "run", tmp_path / "moved"
    real_step, steps = train_my_ddp.train_step, []

    def step_then_move_at_the_third(*step_args):
        steps.append(len(steps) + 1)
        if len(steps) == 3:
            os.rename(run_dir, moved)
            run_dir.mkdir()  # another run's directory now has the name
        return real_step(*step_args)

    monkeypatch.setattr(train_my_ddp, "train_step", step_then_move_at_the_third)
    code = cli_run_main(train_my_ddp.main, _args(data, f"--out_dir={run_dir}", "--max_iters=6"))
    err = capsys.readouterr().err.strip()
    assert code == 1 and "was moved or replaced during step 3" in err and "\n" not in err, err
    assert list(run_dir.iterdir()) == []  # nothing written into the new directory
    assert _heartbeat_step(moved) == 2  # the run stopped where it was moved


# ---- a run is a run only by its marker and only its own names (issue 38, items 2 and 5) -------

TRAINER_CONFIG = '{"task_type": "pretrain", "max_iters": 2}\n'  # shaped like a run's config.json
USER_FILES = {"config.json": '{"model_type": "llama"}\n', "report.md": "# My notes\n",
              "tokenizer/my_tok.py": "print('mine')\n"}


@pytest.mark.parametrize("layout, first_foreign", [
    ({"ckpt/": None, **USER_FILES}, "config.json"),                  # an empty ckpt/
    ({"metrics.jsonl": "", **USER_FILES}, "config.json"),             # an empty metrics.jsonl
    ({"z2all_run.json": '{"format": "z2all run directory", "version": 1}\n', "ckpt/": None,
      "config.json": TRAINER_CONFIG, "report.md": "# Run report: mine\n",
      "tokenizer/my_tok.py": "print('mine')\n"}, "tokenizer/my_tok.py"),  # a copied marker
    ({"z2all_run.json": '{"format": "z2all run directory", "version": 1}\n',
      "report.md": "# My notes\n"}, "report.md"),                    # report.md: not a run's
    ({"metrics.jsonl": '{"kind": "train", "step": 1}\n', "thesis.tex": "\\begin{document}\n"},
     "thesis.tex"),                                                   # another tool's metrics
], ids=["empty-ckpt", "empty-metrics", "copied-marker", "users-report", "thesis"])
def test_a_directory_holding_what_no_run_writes_is_refused_naming_it(
        data, tmp_path, capsys, layout, first_foreign):
    """Was: a fresh run exited 0, overwrote config.json and report.md and deleted tokenizer/;
    --overwrite moved the thesis folder aside."""
    target = tmp_path / "mine"
    for name, text in layout.items():
        path = target / name
        if text is None:
            path.mkdir(parents=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    before = _files(tmp_path)
    for extra in ([], ["--overwrite"], ["--resume"]):
        err = _refused(_args(data, f"--out_dir={target}", "--max_iters=2", *extra), capsys)
        assert f"holds {first_foreign}, which no z2all run writes" in err, (extra, err)
        assert _files(tmp_path) == before, extra  # nothing written, moved or deleted


def _die_at_step_two(monkeypatch) -> None:
    """The run fails at its second step, before its first checkpoint (exit 1)."""
    real_step, steps = train_my_ddp.train_step, []

    def step(*step_args):
        steps.append(1)
        if len(steps) == 2:
            raise OSError("the device went away (simulated)")
        return real_step(*step_args)

    monkeypatch.setattr(train_my_ddp, "train_step", step)


@pytest.mark.parametrize("extra", [[], ["--overwrite"]], ids=["fresh", "overwrite"])
def test_a_run_that_died_before_its_first_checkpoint_starts_again_in_its_own_folder(
        data, tmp_path, capsys, monkeypatch, extra):
    """Was: the dead run's folder blocked a rerun (a fresh run refused its metrics.jsonl, and
    --resume found no checkpoint)."""
    run_dir = tmp_path / "run"
    args = _args(data, f"--out_dir={run_dir}", "--max_iters=3", "--eval_at_start")
    with monkeypatch.context() as patch:
        _die_at_step_two(patch)
        assert cli_run_main(train_my_ddp.main, args) == 1
    assert (run_dir / "z2all_run.json").is_file() and not _steps(run_dir)
    dead_records = (run_dir / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert "stopped before its first checkpoint: nothing to resume; start it again there " \
        "without --resume" in _refused([*args, "--resume"], capsys)
    assert cli_run_main(train_my_ddp.main, [*args, *extra]) == 0
    assert "holds a run that stopped before its first checkpoint: starting it again" in (
        capsys.readouterr().out)
    assert _steps(run_dir) == [3] and not list(tmp_path.glob("run.old-*"))  # nothing moved
    assert (run_dir / "metrics.jsonl").read_text().startswith(dead_records)  # kept


@pytest.mark.parametrize("out_dir, drop_tokenizer, reason", [
    ("tokenizer/demo_hf/run1", True, "is inside the default --tokenizer_dir tokenizer/demo_hf"),
    ("tok/run1", False, "is inside --tokenizer_dir tok"),
    ("data/run1", False, "is inside --data_dir data"),
], ids=["default-tokenizer", "named-tokenizer", "data"])
def test_an_out_dir_inside_what_the_run_reads_is_refused(data, tmp_path, capsys, monkeypatch,
                                                         out_dir, drop_tokenizer, reason):
    """Was: `--out_dir=tokenizer/demo_hf/run1` (the default tokenizer) was accepted."""
    checkout = tmp_path / "checkout"
    shutil.copytree(data["tokenizer"], checkout / "tokenizer" / "demo_hf")
    shutil.copytree(data["tokenizer"], checkout / "tok")
    shutil.copytree(data["pretrain"], checkout / "data")
    monkeypatch.chdir(checkout)
    args = [a for a in _args(data) if not a.startswith(("--data_dir", "--tokenizer_dir"))]
    args += ["--data_dir=data"] + ([] if drop_tokenizer else ["--tokenizer_dir=tok"])
    before = _files(checkout)
    err = _refused([*args, f"--out_dir={out_dir}"], capsys)
    assert f"--out_dir={out_dir} {reason}" in err
    assert _files(checkout) == before


def test_every_name_a_run_and_its_tools_write_is_listed_as_the_runs_own(data, tmp_path):
    """utils/run_ownership.py's list is complete: after a run with TensorBoard, its plots and an
    evaluation, nothing in the folder is foreign, so the run resumes and --overwrite moves it."""
    run_dir = tmp_path / "run"
    assert run_main(_args(data, f"--out_dir={run_dir}", "--max_iters=2",
                          "--tracker=tensorboard")) == 0
    assert resplot.main([str(run_dir)]) == 0
    evaluate.main(["--ckpt", str(run_dir), "--data", str(data["pretrain_raw"]), "--limit", "2",
                   "--dtype", "fp32", "--device", "cpu"])
    assert {path.name for path in run_dir.iterdir()} >= {"plots", "tensorboard", "tokenizer",
                                                          "evaluations.json", "report.md"}
    assert foreign_entry(run_dir) is None
    assert run_main(_args(data, f"--out_dir={run_dir}", "--max_iters=3", "--resume")) == 0
    assert run_main(_args(data, f"--out_dir={run_dir}", "--max_iters=2", "--overwrite")) == 0
    assert len(list(tmp_path.glob("run.old-*"))) == 1


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_run_dir_that_goes_away_during_a_save_is_said_as_moved(data, tmp_path, capsys,
                                                                  monkeypatch, how):
    """The run dir is deleted (or moved and another made in its place) while the step-2
    checkpoint is being written: the run-dir-moved line and exit 1 (before: exit 2, "bad
    input", naming the checkpoint's temp dir)."""
    run_dir = tmp_path / "run"
    real_finish = training_checkpoint.finish_checkpoint

    def lose_the_run_dir_then_finish(*args, **kwargs):
        if how == "deleted":
            shutil.rmtree(run_dir)
        else:
            os.rename(run_dir, tmp_path / "moved")
            run_dir.mkdir()
        return real_finish(*args, **kwargs)

    monkeypatch.setattr(training_checkpoint, "finish_checkpoint", lose_the_run_dir_then_finish)
    code = cli_run_main(train_my_ddp.main, _args(data, f"--out_dir={run_dir}", "--max_iters=4",
                                                 "--save_interval=2"))
    err = capsys.readouterr().err.strip()
    assert code == 1 and "\n" not in err, err
    assert err == (f"error: run dir {run_dir} was moved or replaced during step 2: stopped "
                   "without writing into what now has its name; continue the run with --resume "
                   "where it was moved")
    assert not run_dir.exists() or list(run_dir.iterdir()) == []


def test_rank_0_failing_to_write_the_check_token_is_every_ranks_verdict(tmp_path, monkeypatch):
    """On several ranks rank 0 writes the shared-filesystem token as it claims the run dir: a
    write that fails rides the claim's one broadcast as its problem (so no rank waits for a
    token that never comes), and the directory the claim created is removed."""
    from trainer import run_claim
    from trainer.distributed_env import DistributedEnv
    from trainer.options import RunOptions

    def full_disk(run_dir):
        raise OSError(28, "No space left on device", str(run_dir))

    broadcasts = []
    monkeypatch.setattr(run_claim, "write_check_token", full_disk)
    monkeypatch.setattr(run_claim, "broadcast_from_main",
                        lambda value, env: broadcasts.append(value) or value)
    rank_0_of_two = DistributedEnv(0, 2, 0, 2, torch.device("cpu"))
    run_dir = tmp_path / "run"
    with (pytest.raises(ValueError, match="No space left on device"),
          run_claim.exclusive_run_dir(RunOptions(out_dir=str(run_dir)), rank_0_of_two)):
        pass
    assert len(broadcasts) == 1 and "No space left" in broadcasts[0][0]
    assert not run_dir.exists()
