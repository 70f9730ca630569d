"""Shared pieces of the trainer tests: tiny data built once per session, tiny run settings,
and ways to run `train_my_ddp.main` in this process or on 2 gloo ranks.

The data come from the real pipeline (demo corpus builder -> our tokenizer -> pretokenizer;
SFT/DPO from raw records through `build_datasets`' cache), at a size that builds in seconds.
Both trainer test modules call `tiny_training_data`; the first builds, the others reuse the
directory (a DONE marker says it is complete).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

import train_my_ddp
from parallel.local_ranks import run_on_ranks
from utils.atomic_io import atomic_write_text

# A model of ~20k parameters on 32-token windows: a step takes milliseconds.
TINY_ARGS = ["--max_seq_len=32", "--batch_size=2", "--hidden_size=32", "--num_hidden_layers=1",
             "--num_attention_heads=2", "--num_key_value_heads=1", "--intermediate_size=64",
             "--warmup_iters=2", "--eval_iters=1", "--log_interval=1", "--max_new_tokens=3",
             "--num_threads=1", "--dtype=fp32", "--lr=3e-3", "--min_lr=3e-4", "--tracker=none",
             '--eval_prompts=["What is 2 + 3?"]']


def tiny_training_data(base: Path, tokenizer_dir: Path) -> dict[str, Path]:
    """{"pretrain": pretokenized dir, "pretrain_raw": its raw shards, "sft": raw dir,
    "dpo": raw dir, "tokenizer": dir}."""
    root = base / "tiny_training_data"
    paths = {"pretrain": root / "pretok", "pretrain_raw": root / "pretrain_small",
             "sft": root / "demo" / "sft",
             "dpo": root / "demo" / "dpo", "tokenizer": tokenizer_dir}
    if (root / "DONE").exists():
        return paths
    from data.build_demo_corpus import build, pretrain_scenes, write_jsonl
    from data_preprocess.pretokenize_pretrain_data import pretokenize_pretrain_data

    shutil.rmtree(root, ignore_errors=True)
    build(root / "demo", seed=0, scale=0.02)
    small = paths["pretrain_raw"]  # two files are plenty: ~80k tokens
    small.mkdir()
    comedies = "shakespeare_comedies.jsonl"  # the scenes as the demo trains on them, cleaned
    write_jsonl(small / comedies, ({"text": scene} for scene in pretrain_scenes(0.02)[comedies]))
    shutil.copy(root / "demo" / "pretrain" / "bilingual_zh_en.jsonl", small)
    pretokenize_pretrain_data(small, tokenizer_dir, out_dir=paths["pretrain"], num_workers=1)
    atomic_write_text(root / "DONE", "ok\n")
    return paths


def data_args(data: dict[str, Path], task: str) -> list[str]:
    return [f"--task_type={task}", f"--data_dir={data[task]}",
            f"--tokenizer_dir={data['tokenizer']}"]


def run_main(argv: list[str]) -> int:
    """One invocation of the trainer in this process (a world of one)."""
    return train_my_ddp.main(argv)


def _runs_on_rank(rank: int, world_size: int, runs: list[list[str]]) -> list[int]:
    torch.set_num_threads(1)
    return [train_my_ddp.main(argv) for argv in runs]


def run_on_two_ranks(*runs: list[str]) -> list[int]:
    """Several invocations, one after another, on the same 2 spawned gloo ranks (one spawn)."""
    per_rank = run_on_ranks(_runs_on_rank, list(runs), world_size=2, timeout=300)
    assert per_rank[0] == per_rank[1]
    return per_rank[0]


def records(run_dir: Path, kind: str) -> list[dict]:
    with open(run_dir / "metrics.jsonl", encoding="utf-8") as handle:
        return [r for r in map(json.loads, handle) if r["kind"] == kind]


def train_losses(run_dir: Path) -> dict[int, float]:
    """step -> loss; a resumed run's later lines replace what a killed run logged before."""
    return {r["step"]: r["loss"] for r in records(run_dir, "train")}


def final_weights(run_dir: Path, step: int) -> bytes:
    return (run_dir / "ckpt" / f"step_{step:06d}" / "model.safetensors").read_bytes()
