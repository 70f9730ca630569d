"""tools.resplot on synthetic metrics.jsonl files: which PNGs, valid PNGs, torn lines, resumes."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import matplotlib.image
import pytest
from matplotlib.figure import Figure

from tools import resplot

REPO = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PRETRAIN_PLOTS = {"loss.png", "loss_vs_tokens.png", "lr.png", "tokens_per_sec.png",
                  "grad_norm.png"}


def train_record(rng: random.Random, step: int, dpo: bool) -> dict:
    record = {"kind": "train", "step": step, "loss": rng.uniform(2, 8), "lr": rng.uniform(0, 1e-3),
              "grad_norm": rng.lognormvariate(0, 1), "tokens": step * 1024,
              "tokens_per_sec": rng.uniform(1e3, 1e4), "time": time.time()}
    if dpo:
        record.update({f"rewards/{name}": rng.gauss(0, 1) for name in resplot.DPO_REWARDS})
    return record


def write_metrics(run_dir: Path, rng: random.Random, steps: int, dpo: bool = False,
                  torn_tail: bool = True) -> None:
    lines = []
    for step in range(1, steps + 1):
        lines.append(json.dumps(train_record(rng, step, dpo)))
        if step % 5 == 0:
            evaluation = {"kind": "eval", "step": step, "val_loss": rng.uniform(2, 8)}
            if dpo:
                evaluation.update({f"val_rewards/{name}": rng.gauss(0, 1)
                                   for name in resplot.DPO_REWARDS})
            lines.append(json.dumps(evaluation))
    text = "\n".join(lines) + "\n"
    if torn_tail:  # a crash mid-write leaves half a line
        text += json.dumps(train_record(rng, steps + 1, dpo))[: rng.randint(1, 40)]
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text(text)


def check_png(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE), path
    height, width = matplotlib.image.imread(path).shape[:2]
    assert height > 100 and width > 100


def test_pretraining_run_gets_its_plots_and_no_dpo_plot(tmp_path, capsys):
    rng = random.Random()
    run_dir = tmp_path / "run"
    write_metrics(run_dir, rng, steps=rng.randint(20, 60))
    assert resplot.main([str(run_dir)]) == 0
    written = {path.name for path in (run_dir / "plots").iterdir()}
    assert written == PRETRAIN_PLOTS
    for name in written:
        check_png(run_dir / "plots" / name)
    printed = capsys.readouterr().out
    assert {Path(line).name for line in printed.splitlines() if line.endswith(".png")} == written
    assert "skipped 1 unreadable line" in printed  # the torn tail, counted, not fatal


def test_dpo_metrics_add_the_rewards_plot_and_runs_are_overlaid(tmp_path):
    rng = random.Random()
    write_metrics(tmp_path / "pretrain", rng, steps=15)
    write_metrics(tmp_path / "dpo", rng, steps=12, dpo=True, torn_tail=False)
    out = tmp_path / "compare"
    assert resplot.main([str(tmp_path / "pretrain"), str(tmp_path / "dpo"), "--out", str(out)]) == 0
    assert {path.name for path in out.iterdir()} == PRETRAIN_PLOTS | {"dpo_rewards.png"}
    check_png(out / "dpo_rewards.png")
    # Both runs, labelled by name, on the same loss axes.
    runs = [resplot.read_run(tmp_path / name, name) for name in ("pretrain", "dpo")]
    axes = Figure().subplots()
    assert resplot.draw_panel(axes, resplot.FIGURES["loss.png"][0], runs)
    labels = {text.get_text() for text in axes.get_legend().get_texts()}
    assert labels == {"pretrain train", "pretrain valid", "dpo train", "dpo valid"}
    # DPO panels: train and validation rewards of the DPO run only.
    for panel in resplot.FIGURES["dpo_rewards.png"]:
        axes = Figure().subplots()
        assert resplot.draw_panel(axes, panel, runs)
        assert {text.get_text() for text in axes.get_legend().get_texts()} \
            == {"dpo train", "dpo valid"}


def test_several_runs_need_an_output_dir(tmp_path):
    rng = random.Random()
    write_metrics(tmp_path / "a", rng, steps=5)
    write_metrics(tmp_path / "b", rng, steps=5)
    with pytest.raises(SystemExit):
        resplot.main([str(tmp_path / "a"), str(tmp_path / "b")])


def test_a_resumed_run_keeps_the_later_values_and_marks_the_resume(tmp_path):
    """Steps 1..crash, then a resume from `resume_step` that redoes resume_step+1..end."""
    rng = random.Random()
    crash_step, resume_step, end = rng.randint(12, 20), rng.randint(5, 10), 30
    first = [train_record(rng, step, dpo=False) for step in range(1, crash_step + 1)]
    second = [train_record(rng, step, dpo=False) for step in range(resume_step + 1, end + 1)]
    resume = {"kind": "resume", "step": resume_step, "checkpoint": "ckpt/step"}
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(
        "".join(json.dumps(record) + "\n" for record in [*first, resume, *second]))
    run = resplot.read_run(run_dir, "run")
    steps, losses = resplot.step_series(run.records["train"], "loss")
    # Reference: what training finally consumed is the first attempt up to the checkpoint,
    # then the resumed attempt.
    expected = [r["loss"] for r in first[:resume_step]] + [r["loss"] for r in second]
    assert steps.tolist() == list(range(1, end + 1))
    assert losses.tolist() == expected
    axes = Figure().subplots()
    resplot.draw_panel(axes, resplot.FIGURES["loss.png"][0], [run])
    vertical = [line for line in axes.get_lines() if line.get_linestyle() == ":"]
    assert [list(line.get_xdata()) for line in vertical] == [[resume_step, resume_step]]


def test_torn_lines_are_counted_and_records_without_step_skipped(tmp_path):
    rng = random.Random()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    good = [train_record(rng, step, dpo=False) for step in range(1, 9)]
    lines = [json.dumps(record) for record in good]
    lines.insert(3, '{"kind": "train", "st')                     # torn, then appended to
    lines.insert(6, json.dumps({"kind": "train", "loss": 1.0}))  # no step: unusable
    (run_dir / "metrics.jsonl").write_bytes(("\n".join(lines) + "\n").encode() + b"\xff\xfe")
    run = resplot.read_run(run_dir, "run")
    assert run.skipped_lines == [4, 7, 11]
    assert [record["step"] for record in run.records["train"]] == list(range(1, 9))


def test_no_metrics_means_nothing_written(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert resplot.main([str(tmp_path / "empty")]) == 1
    assert "nothing to plot" in capsys.readouterr().out
    assert not (tmp_path / "empty" / "plots").exists()


def test_watch_replots_when_metrics_grow_and_stops_on_ctrl_c(tmp_path):
    rng = random.Random()
    run_dir = tmp_path / "run"
    write_metrics(run_dir, rng, steps=6, torn_tail=False)
    watcher = subprocess.Popen([sys.executable, "-m", "tools.resplot", str(run_dir),
                                "--watch", "0.2"], cwd=REPO, stdout=subprocess.PIPE, text=True)
    loss_png = run_dir / "plots" / "loss.png"
    try:
        deadline = time.monotonic() + 60
        while not loss_png.exists():
            assert time.monotonic() < deadline and watcher.poll() is None
            time.sleep(0.1)
        first = loss_png.read_bytes()
        with open(run_dir / "metrics.jsonl", "a") as handle:
            for step in range(7, 20):
                handle.write(json.dumps(train_record(rng, step, dpo=False)) + "\n")
        while loss_png.read_bytes() == first:
            assert time.monotonic() < deadline and watcher.poll() is None
            time.sleep(0.1)
        check_png(loss_png)
    finally:
        watcher.send_signal(signal.SIGINT)
        output = watcher.communicate(timeout=30)[0]
    assert watcher.returncode == 0
    assert "stopped watching" in output
