"""Task accuracy of a chat model on the demo's held-out prompts (by generation, greedy).

    python -m tools.demo_eval --ckpt out/demo_sft --tokenizer_dir tokenizer/demo_hf \\
        --tasks data/demo/eval/tasks.jsonl

Each line of the tasks file is `{"task", "prompt", "answer"}`; the prompt goes in as a user
turn, and `data.demo_tasks.is_correct` grades the reply (it recomputes the answer from the
prompt). Prints accuracy per task and overall, and writes them, with a few examples, to
`<run dir>/task_accuracy.json` for the demo's summary.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from data.demo_tasks import is_correct
from model.loading import load_model
from model.run_tokenizer import model_tokenizer
from trainer.evaluation import generate_samples
from utils.atomic_io import atomic_write_json
from utils.cli_errors import run_main
from utils.log_setup import configure_logging
from utils.option_checks import raise_problems, range_problem
from utils.option_parser import OptionParser
from utils.precision import DTYPES, resolve_dtype
from utils.run_ownership import is_run


def task_accuracy(ckpt: str | Path, tokenizer_dir: str | Path | None, tasks_file: str | Path,
                  max_new_tokens: int = 12, dtype: str = "auto") -> dict[str, Any]:
    precision = resolve_dtype(dtype, torch.device("cpu"))
    print(precision.reason, flush=True)
    model, model_dir = load_model(ckpt)
    tokenizer = model_tokenizer(ckpt, model.config, model_dir, tokenizer_dir)
    model = model.to(DTYPES[precision.dtype]).eval()
    with open(tasks_file, encoding="utf-8") as handle:
        items = [json.loads(line) for line in handle if line.strip()]
    samples = generate_samples(model, tokenizer, [item["prompt"] for item in items], chat=True,
                               max_new_tokens=max_new_tokens, device=torch.device("cpu"))
    correct, total = Counter(), Counter()
    for item, sample in zip(items, samples):
        total[item["task"]] += 1
        correct[item["task"]] += is_correct(item["task"], item["prompt"], sample["completion"])
    return {"checkpoint": str(ckpt),
            "precision": dataclasses.asdict(precision),
            "accuracy": sum(correct.values()) / max(sum(total.values()), 1),
            "per_task": {task: correct[task] / total[task] for task in sorted(total)},
            "examples": samples[:8]}


def main(argv: list[str] | None = None) -> None:
    parser = OptionParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ckpt", required=True, help="run dir or checkpoint dir")
    parser.add_argument("--tokenizer_dir", default=None,
                        help="default: the model's own (model/run_tokenizer.py)")
    parser.add_argument("--tasks", default="data/demo/eval/tasks.jsonl")
    parser.add_argument("--max_new_tokens", type=int, default=12)
    parser.add_argument("--dtype", choices=["auto", *DTYPES], default="auto",
                        help="auto: as the trainer decides (utils/precision.py)")
    args = parser.parse_args(argv)
    configure_logging()
    raise_problems([range_problem("--max_new_tokens", args.max_new_tokens, 1)])
    result = task_accuracy(args.ckpt, args.tokenizer_dir, args.tasks, args.max_new_tokens,
                           args.dtype)
    print(f"task accuracy of {result['checkpoint']}: {result['accuracy']:.1%}")
    for task, accuracy in result["per_task"].items():
        print(f"  {task:<8s} {accuracy:6.1%}")
    for example in result["examples"][:4]:
        print(f"  {example['prompt']!r} -> {example['completion']!r}")
    run_dir = Path(args.ckpt)
    if run_dir.is_dir() and is_run(run_dir):  # only a run's own (utils/run_ownership.py)
        atomic_write_json(run_dir / "task_accuracy.json", result)


if __name__ == "__main__":
    sys.exit(run_main(main))
