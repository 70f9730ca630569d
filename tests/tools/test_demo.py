"""`make demo` (tools/demo.py): its commands hard-code no CPU assumption, the summary's DDP
traffic line reports what the trainer logged, and the clean stage removes the corpus's dirty
share and nothing else, so the demo trains on the very tokens its accuracies were measured on."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tools.demo as demo
from data.build_demo_corpus import pretrain_scenes, write_jsonl
from data.dirty_corpus import BOILERPLATE
from utils.data_files import find_data_files
from utils.readers import iter_texts

REPO = Path(__file__).resolve().parents[2]
# sha256 over (name, bytes) of every data/demo/pretrain/*.jsonl as `make demo` wrote it before
# the clean stage existed (seed 0): the corpus docs/demo.md's accuracy figures were measured on.
MEASURED_CORPUS = "0795ce77911a15298c8d0db521eb8f32212ad58afbf0e939129689006bd73c3c"

TRAIN_STAGES = {name: argv for name, argv in demo.stages() if "train_my_ddp.py" in argv}


def test_training_stages_let_the_machine_decide_precision_and_threads():
    assert set(TRAIN_STAGES) == {"pretrain", "sft", "dpo", "grpo"}
    for name, argv in demo.stages():
        assert not any(arg.startswith("--dtype=") and arg != "--dtype=auto" for arg in argv), name
        assert not any(arg.startswith("--num_threads") for arg in argv), name
    for argv in TRAIN_STAGES.values():
        assert "--dtype=auto" in argv
        assert "--overwrite" in argv  # a second `make demo` moves the first one's runs aside


def test_dtype_and_seed_reach_every_training_and_accuracy_stage():
    default, chosen = dict(demo.stages()), dict(demo.stages(dtype="bf16", seed=2))
    assert default.keys() == chosen.keys()
    for name in ("pretrain", "sft", "dpo", "grpo"):
        assert "--dtype=bf16" in chosen[name] and "--seed=2" in chosen[name], name
        assert "--seed=1337" in default[name], name
    for name in ("accuracy_sft", "accuracy_dpo", "accuracy_grpo"):
        assert "--dtype=bf16" in chosen[name], name
    changed = {name for name in default if default[name] != chosen[name]}
    assert changed == {"pretrain", "sft", "dpo", "grpo", "accuracy_sft", "accuracy_dpo",
                       "accuracy_grpo"}  # the same corpus


def test_pretraining_runs_two_ranks_of_our_ddp_with_zero1():
    argv = TRAIN_STAGES["pretrain"]
    launcher = argv[:argv.index("train_my_ddp.py")]
    assert launcher[:2] == ["-m", "torch.distributed.run"]
    assert f"--nproc_per_node={demo.RANKS}" in launcher and demo.RANKS == 2
    assert "--use_distributed_optimizer" in argv


def test_summary_reports_bytes_per_rank_from_the_metrics(tmp_path, monkeypatch):
    run = tmp_path / "demo_pretrain"
    run.mkdir()
    records = [{"kind": "run", "step": 0, "world_size": 2, "num_params": 1_000_000},
               {"kind": "train", "step": 10, "comm_bytes_per_step": 3_000_000.0},
               {"kind": "train", "step": 20, "comm_bytes_per_step": 2_000_000.0}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    monkeypatch.setattr(demo, "OUT", str(tmp_path))
    lines = demo.ddp_traffic_lines()
    assert "2 ranks" in lines[0] and "2.00 MB per step" in lines[0]  # the last step's figure
    assert "(2.00 bytes per parameter)" in lines[0]
    (run / "metrics.jsonl").write_text(json.dumps({**records[0], "world_size": 1}) + "\n")
    assert demo.ddp_traffic_lines() == []  # one process: nothing was sent


def corpus_fingerprint(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.jsonl")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def run_demo_stages(root: Path, monkeypatch, *names: str) -> None:
    """The demo's own commands for `names`, with its data and tokenizer under `root`."""
    monkeypatch.setattr(demo, "DEMO", str(root / "demo"))
    monkeypatch.setattr(demo, "TOKENIZER", str(root / "tokenizer"))
    commands = dict(demo.stages())
    for name in names:
        subprocess.run([sys.executable, *commands[name]], cwd=REPO, check=True,
                       capture_output=True, timeout=300)


@pytest.mark.slow  # a minute of one-core work: it runs in the lane beside the others (Makefile)
def test_clean_stage_leaves_exactly_the_tokens_the_demo_was_measured_on(tmp_path, monkeypatch):
    """The real corpus end to end (under a minute on 2 busy cores): the raw scenes with their
    dirty share -> the clean stage -> the tokenizer, pretokenize and sample index stages,
    against the same stages run on the scenes as the builder wrote them before (pinned by
    MEASURED_CORPUS). A dirty document let through, a good one dropped, or a field other than
    "text" read, fails it."""
    cleaned = tmp_path / "cleaned"
    run_demo_stages(cleaned, monkeypatch, "corpus", "clean")
    measured = tmp_path / "measured" / "demo" / "pretrain"
    measured.mkdir(parents=True)
    for name, scenes in pretrain_scenes().items():
        write_jsonl(measured / name, ({"text": scene} for scene in scenes))
    shutil.copy(cleaned / "demo/pretrain/bilingual_zh_en.jsonl", measured)
    assert corpus_fingerprint(measured) == MEASURED_CORPUS

    report = json.loads((cleaned / "demo/pretrain/clean_report.json").read_text())
    assert report["dropped"] == {**{rule: 6 for rule in BOILERPLATE}, "exact_duplicate": 12,
                                 "near_duplicate": 6, "eval_contamination": 1}
    files = [path.name for path in find_data_files(measured)]
    assert [path.name for path in find_data_files(cleaned / "demo/pretrain")] == files
    for name in files:
        assert list(iter_texts(cleaned / "demo/pretrain" / name)) == list(
            iter_texts(measured / name)), name

    tokens = ("tokenizer_bpe", "pretokenize", "sample_index")
    run_demo_stages(cleaned, monkeypatch, *tokens)
    run_demo_stages(tmp_path / "measured", monkeypatch, *tokens)
    pretok = [f"demo/pretrain_pretok/{Path(name).stem}{ext}" for name in files
              for ext in (".bin", ".idx")]
    samples = [f"demo/pretrain_pretok/{split}_L256.ibin" for split in ("train", "valid")]
    for produced in ["tokenizer/tokenizer.json", *pretok, *samples]:
        assert (cleaned / produced).read_bytes() == (tmp_path / "measured" / produced
                                                     ).read_bytes(), produced


def test_summary_starts_with_the_clean_stage_line(tmp_path, monkeypatch):
    pretrain = tmp_path / "pretrain"
    pretrain.mkdir()
    (pretrain / "clean_report.json").write_text(json.dumps(
        {"documents_in": 10, "documents_out": 7, "bytes_in": 1000, "bytes_out": 700,
         "dropped": {"exact_duplicate": 2, "too_few_words": 1}}))
    monkeypatch.setattr(demo, "DEMO", str(tmp_path))
    monkeypatch.setattr(demo, "OUT", str(tmp_path / "out"))
    assert demo.summary() == ["corpus cleaned 10 documents -> 7 kept (70.0%), 1,000 -> 700 "
                              "bytes; dropped: exact_duplicate 2, too_few_words 1"]


def test_the_grpo_line_averages_the_first_and_last_logged_steps():
    train = [{"step": 10 * (i + 1), "reward": reward, "frac_reward_zero_std": 0.5, "kl": 0.01}
             for i, reward in enumerate([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0])]
    evals = [{"step": 0, "val_reward": 0.25}, {"step": 100, "val_reward": 0.75}]
    (line,) = demo.grpo_lines(train, evals)
    assert "right 30% (steps 10-50) -> 80% (steps 60-100)" in line
    assert "held-out greedy answers right 25% -> 75%" in line
    assert demo.grpo_lines([], evals) == []
