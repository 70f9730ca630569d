"""Data and grading of the z2all_demo_* lm-eval tasks (loaded by lm-eval through `!function`).

The items are files shipped next to this one (`skills.jsonl`, `choice.jsonl`, written by
`python -m tools.lm_eval_tasks.build_data`), so the tasks run offline.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from data.demo_tasks import is_correct

HERE = Path(__file__).resolve().parent


def _dataset(name: str) -> dict[str, Any]:
    import datasets

    with open(HERE / name, encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    return {"test": datasets.Dataset.from_list(rows)}


def skills_dataset(**_metadata: Any) -> dict[str, Any]:
    return _dataset("skills.jsonl")


def choice_dataset(**_metadata: Any) -> dict[str, Any]:
    return _dataset("choice.jsonl")


def grade_reply(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    """The demo's grader: the answer recomputed from the prompt, whitespace around it ignored."""
    return {"exact_match": float(is_correct(doc["task"], doc["prompt"], results[0]))}
