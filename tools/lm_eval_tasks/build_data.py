"""Write the items of the z2all_demo_* lm-eval tasks from the demo's skill definitions.

    python -m tools.lm_eval_tasks.build_data [--per_task 20] [--seed 2023]

skills.jsonl: {"task", "prompt", "answer"}, as the demo's eval file.
choice.jsonl: {"task", "prompt", "choices", "label"}: the answer and up to 3 distinct near misses
(data.demo_tasks.Task.wrong_answer), in a seeded order; `label` is the answer's index.
The seed differs from the demo corpus builder's, so these items are fresh draws.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from data.demo_tasks import TASKS
from utils.cli_errors import run_main
from utils.option_checks import raise_problems, range_problem
from utils.option_parser import OptionParser

HERE = Path(__file__).resolve().parent
WRONG_CHOICES = 3
DRAWS_PER_WRONG_CHOICE = 10  # near misses repeat; give up on more after this many tries


def choice_item(task_name: str, prompt: str, answer: str, rng: random.Random) -> dict:
    wrong: list[str] = []
    for _ in range(WRONG_CHOICES * DRAWS_PER_WRONG_CHOICE):
        candidate = TASKS[task_name].wrong_answer(rng, prompt)
        if candidate not in wrong and candidate != answer:
            wrong.append(candidate)
        if len(wrong) == WRONG_CHOICES:
            break
    choices = [answer, *wrong]
    rng.shuffle(choices)
    return {"task": task_name, "prompt": prompt, "choices": choices,
            "label": choices.index(answer)}


def build(out_dir: Path, per_task: int, seed: int) -> None:
    rng = random.Random(seed)
    skills, choice = [], []
    for task_name, task in TASKS.items():
        for _ in range(per_task):
            prompt, answer = task.sample(rng)
            skills.append({"task": task_name, "prompt": prompt, "answer": answer})
            choice.append(choice_item(task_name, prompt, answer, rng))
    for name, rows in (("skills.jsonl", skills), ("choice.jsonl", choice)):
        with open(out_dir / name, "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(row) + "\n" for row in rows)


def main(argv: list[str] | None = None) -> None:
    parser = OptionParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per_task", type=int, default=20, help="items per demo skill")
    parser.add_argument("--seed", type=int, default=2023)
    parser.add_argument("--out_dir", type=Path, default=HERE)
    args = parser.parse_args(argv)
    raise_problems([range_problem("--per_task", args.per_task, 1)])
    build(args.out_dir, args.per_task, args.seed)


if __name__ == "__main__":
    sys.exit(run_main(main))
