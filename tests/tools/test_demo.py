"""`make demo` (tools/demo.py): its commands hard-code no CPU assumption, and the summary's
DDP traffic line reports what the trainer logged."""

from __future__ import annotations

import json

import tools.demo as demo

TRAIN_STAGES = {name: argv for name, argv in demo.stages() if "train_my_ddp.py" in argv}


def test_training_stages_let_the_machine_decide_precision_and_threads():
    assert set(TRAIN_STAGES) == {"pretrain", "sft", "dpo"}
    for name, argv in demo.stages():
        assert not any(arg.startswith("--dtype=") and arg != "--dtype=auto" for arg in argv), name
        assert not any(arg.startswith("--num_threads") for arg in argv), name
    for argv in TRAIN_STAGES.values():
        assert "--dtype=auto" in argv
        assert "--overwrite" in argv  # a second `make demo` moves the first one's runs aside


def test_dtype_and_seed_reach_every_training_and_accuracy_stage():
    default, chosen = dict(demo.stages()), dict(demo.stages(dtype="bf16", seed=2))
    assert default.keys() == chosen.keys()
    for name in ("pretrain", "sft", "dpo"):
        assert "--dtype=bf16" in chosen[name] and "--seed=2" in chosen[name], name
        assert "--seed=1337" in default[name], name
    for name in ("accuracy_sft", "accuracy_dpo"):
        assert "--dtype=bf16" in chosen[name], name
    changed = {name for name in default if default[name] != chosen[name]}
    assert changed == {"pretrain", "sft", "dpo", "accuracy_sft", "accuracy_dpo"}  # same corpus


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
