"""Demo task accuracy: per-task and overall fractions of replies graded correct by the grader."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

import tools.demo_eval as demo_eval
from data.demo_tasks import TASKS


def test_task_accuracy_counts_correct_replies_per_task(tmp_path, monkeypatch):
    rng = random.Random()
    items, expected = [], {}
    for task_name, task in TASKS.items():
        for _ in range(rng.randint(2, 6)):
            prompt, answer = task.sample(rng)
            items.append({"task": task_name, "prompt": prompt, "answer": answer})
    replies = {}
    for item in items:
        right = rng.random() < 0.5
        replies[item["prompt"]] = item["answer"] + "\n" if right else item["answer"] + "?"
        ok, total = expected.get(item["task"], (0, 0))
        expected[item["task"]] = (ok + right, total + 1)
    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text("".join(json.dumps(item) + "\n" for item in items))

    class FakeModel:
        config = None

        def eval(self):
            return self

        def to(self, dtype):
            return self

    monkeypatch.setattr(demo_eval, "load_model", lambda ckpt: (FakeModel(), Path(ckpt)))
    monkeypatch.setattr(demo_eval, "model_tokenizer", lambda ckpt, config, model_dir, tok: None)
    monkeypatch.setattr(demo_eval, "generate_samples", lambda model, tok, prompts, **kw: [
        {"prompt": p, "completion": replies[p]} for p in prompts])
    result = demo_eval.task_accuracy("ckpt", "tok", tasks_file)
    assert result["per_task"] == pytest.approx({t: ok / n for t, (ok, n) in expected.items()})
    assert result["accuracy"] == pytest.approx(
        sum(ok for ok, _ in expected.values()) / len(items))
