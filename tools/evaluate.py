"""Judge a model on its own: loss / perplexity / bits per byte on a text file, lm-eval tasks, and
reward functions over a prompt set (mean reward, pass@1, pass@k).

    python -m tools.evaluate --ckpt out/demo_pretrain \\
        --data data/demo/pretrain/bilingual_zh_en.jsonl
    python -m tools.evaluate --ckpt out/demo_sft --lm_eval z2all_demo_skills,z2all_demo_choice
    python -m tools.evaluate --ckpt out/demo_grpo --prompts data/demo/grpo \\
        --reward_fn trainer.reward_functions:demo_task_correct --num_generations 8 \\
        --temperature 1.0 --max_new_tokens 12 --limit 64

`--ckpt` is anything `model.loading.load_model` takes (a run dir, a checkpoint, an HF Llama dir).

Language modelling (`--data`, files or folders of .jsonl/.json/.parquet/.txt, streamed; a
`datasets` folder or a Hub dataset `hf:org/name` gives its validation split, else its test
split, unless `@split` names one: utils/data_files.py):
Step 1. each file's texts are tokenized and packed exactly as the trainer packs pretraining
        data (documents + EOS back to back, windows of L+1 tokens every L tokens, never across
        files; dataset/stream_samples.py), L = the run's --max_seq_len. A pretokenized data
        dir instead gives the windows of its validation split (`valid_L<L>.ibin`), the very
        windows the trainer's val_loss is computed on;
Step 2. the first `--limit` windows go through the model `--batch_size` at a time, behind a
        progress bar with a total (bytes of the files, or windows of the split) and an ETA;
Step 3. the sums are turned into figures by the trainer's own `evaluate_language_model`
        (trainer/evaluation.py): loss (nats/token), perplexity = e^loss, and bits per byte =
        Σ nll / (ln 2 · UTF-8 bytes of the targets). Same data, same numbers as the trainer.

lm-evaluation-harness (`--lm_eval`, comma list of task names): the tasks shipped in
tools/lm_eval_tasks/ (z2all_demo_skills, z2all_demo_choice) or any installed lm-eval task whose
data is already local; run offline (no download is attempted) on tools/lm_eval_model.Z2allLM.

Rewards (`--prompts` with `--reward_fn`, tools/reward_eval.py): K = `--num_generations` answers
to each prompt record (GRPO's format), decoded by the serving engine (greedy for K = 1 unless
`--temperature`), scored by the reward functions GRPO trains with: the mean reward (and each
function's), pass@1 and pass@K (Chen et al. 2021's unbiased estimator; an answer passes at
`--pass_threshold`). A reward function is code, never imported from what is evaluated.

Results: a table per evaluation appended to `<run>/report.md`, and every result (with its
settings) appended to `<run>/evaluations.json`, next to it. `--report_dir` chooses another
place, and is needed for a model outside a run (an HF dir): results never go into a model's
directory. It must be a run's, new, empty or hold only this tool's earlier results, and never
be, hold or lie inside what is evaluated (`report_dir_of`).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import json
import logging
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from dataset.dataset_pretrain import PretokDatasetWithIndex
from dataset.stream_samples import Position, pretrain_samples
from model.loading import (
    add_model_arguments,
    load_for_inference,
    resolve_model_arguments,
    resolve_model_dir,
)
from tools.lm_eval_model import Z2allLM
from tools.reward_eval import (
    add_reward_arguments,
    evaluate_rewards,
    load_rewards,
    reward_option_problems,
)
from trainer.distributed_env import DistributedEnv
from trainer.evaluation import evaluate_language_model
from utils.atomic_io import atomic_write_json
from utils.cli_errors import run_main
from utils.data_files import find_data_files
from utils.dataset_splits import EVAL_SPLITS
from utils.hub import snapshot_of
from utils.log_setup import configure_logging
from utils.option_checks import raise_problems, range_problem
from utils.option_parser import OptionParser
from utils.readers import ReadStats, iter_records
from utils.run_directory import RUN_MARKER
from utils.run_ownership import (
    EVALUATIONS_MARKER,
    REPORT_FILE,
    foreign_entry,
    is_run,
    overlap_problem,
)
from utils.tokenizer_protocol import Tokenizer

TASKS_DIR = Path(__file__).resolve().parent / "lm_eval_tasks"
SHIPPED_PREFIX = "z2all_"  # names of the tasks in TASKS_DIR
RESULTS_FILE = "evaluations.json"


# ------------------------------------------------------------------ language modelling

def pretokenized_dir(data: list[str]) -> Path | None:
    """The folder if `--data` names a pretokenized data dir (the trainer's `.bin`/`.idx` files),
    else None (raw text). Such a folder is scored alone: mixing it with text files would mix
    two packings."""
    folders = [Path(path) for path in data
               if Path(path).is_dir() and find_data_files(path, extensions=(".idx",))]
    if folders and len(data) > 1:
        raise ValueError(f"--data {' '.join(data)}: a pretokenized data dir ({folders[0]}) is "
                         "scored alone; give it as the only --data")
    return folders[0] if folders else None


def packed_windows(files: list[Path], tokenizer: Tokenizer, seq_len: int, text_keys: list[str],
                   progress: tqdm | None) -> Iterator[dict[str, np.ndarray]]:
    """Step 1 on raw text: each file packed on its own; `progress` (if any) counts the bytes
    read."""
    for path in files:
        stats, start = ReadStats(), progress.n if progress is not None else 0
        records = iter_records(path, stats=stats)
        for sample, _ in pretrain_samples(records, Position(0, 0, {}), tokenizer=tokenizer,
                                          seq_len=seq_len, text_keys=text_keys,
                                          skip_bad_records=False):
            if progress is not None:
                progress.update(start + stats.bytes_read - progress.n)
            yield sample
        if progress is not None:
            progress.update(start + path.stat().st_size - progress.n)


def window_budget(limit: int | None, max_batches: int, batch_size: int) -> int | None:
    """At most how many windows --limit and --max_batches let through (None: all of them)."""
    caps = [cap for cap in (limit, max_batches * batch_size) if cap]
    return min(caps) if caps else None


def counted(windows: Iterator[dict[str, Any]], progress: tqdm) -> Iterator[dict[str, Any]]:
    """`windows`, each counted on `progress` as it is handed on."""
    for window in windows:
        progress.update(1)
        yield window


def validation_windows(data_dir: Path, tokenizer: Tokenizer, seq_len: int, budget: int | None
                       ) -> tuple[Iterator[dict[str, torch.Tensor]], tqdm]:
    """Step 1 on a pretokenized data dir: the windows of its validation split
    (`valid_L<seq_len>.ibin`, the trainer's), in order, and a bar that counts them."""
    split = PretokDatasetWithIndex(data_dir, seq_len, split="valid", vocab_size=len(tokenizer))
    count = min(len(split), budget or len(split))
    progress = tqdm(total=count, desc=f"evaluating {split.index_path.name}", unit="window")
    return counted((split[index] for index in range(count)), progress), progress


def raw_text_windows(files: list[Path], tokenizer: Tokenizer, seq_len: int, text_keys: list[str],
                     budget: int | None) -> tuple[Iterator[dict[str, np.ndarray]], tqdm]:
    """Step 1 on raw text: the windows and a bar whose total is what will be read: the
    files' bytes, or, under --limit / --max_batches, that many windows (the bar would
    otherwise end at a few percent of the files)."""
    if budget is None:
        progress = tqdm(total=sum(path.stat().st_size for path in files), desc="evaluating",
                        unit="B", unit_scale=True)
        return packed_windows(files, tokenizer, seq_len, text_keys, progress), progress
    progress = tqdm(total=budget, desc="evaluating", unit="window")
    windows = packed_windows(files, tokenizer, seq_len, text_keys, None)
    return counted(itertools.islice(windows, budget), progress), progress


def batches_of(windows: Iterator[dict[str, Any]], batch_size: int
               ) -> Iterator[dict[str, torch.Tensor]]:
    """{"input_ids": [B, L], "labels": [B, L]}, as the trainer's pretraining batches look;
    the last batch may be smaller."""
    while chunk := list(itertools.islice(windows, batch_size)):
        yield {key: torch.stack([torch.as_tensor(window[key]) for window in chunk])
               for key in ("input_ids", "labels")}


def language_model_metrics(model: torch.nn.Module, tokenizer: Tokenizer, data: list[str],
                           seq_len: int, batch_size: int, text_keys: list[str],
                           device: torch.device, max_batches: int = 0,
                           limit: int | None = None) -> dict[str, float]:
    """loss, perplexity, bits_per_byte and tokens over `data` (Steps 1-3), over at most
    `limit` windows and `max_batches` batches."""
    data_dir, budget = pretokenized_dir(data), window_budget(limit, max_batches, batch_size)
    if data_dir is not None:
        windows, progress = validation_windows(data_dir, tokenizer, seq_len, budget)
    else:
        files = find_data_files(data, splits=EVAL_SPLITS, option="--data")
        if not files:
            raise ValueError(f"--data {' '.join(data)}: no .jsonl/.json/.parquet/.txt files "
                             "there (or a pretokenized data dir)")
        windows, progress = raw_text_windows(files, tokenizer, seq_len, text_keys, budget)
    with progress:
        figures = evaluate_language_model(model, batches_of(windows, batch_size), tokenizer,
                                          DistributedEnv(0, 1, 0, 1, device))
        if progress.n < progress.total and progress.unit == "window":  # fewer than the cap
            progress.total = progress.n
            progress.refresh()
    if not figures["val_tokens"]:
        raise ValueError(f"--data {' '.join(data)}: no complete window of {seq_len + 1} tokens "
                         "(files are packed separately); give more text or a smaller --seq_len")
    return {"loss": figures["val_loss"], "perplexity": figures["val_ppl"],
            "bits_per_byte": figures["val_bpb"], "tokens": int(figures["val_tokens"])}


# ------------------------------------------------------------------ lm-evaluation-harness

def run_lm_eval(lm: Z2allLM, tasks: list[str], limit: int | None = None) -> dict[str, Any]:
    """lm-eval's result dict for `tasks` (per-item records under "samples"), offline."""
    import datasets.config
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    # No network: a task whose data is not cached fails at once instead of downloading.
    os.environ["HF_DATASETS_OFFLINE"] = os.environ["HF_HUB_OFFLINE"] = "1"
    datasets.config.HF_DATASETS_OFFLINE = datasets.config.HF_HUB_OFFLINE = True
    # Indexing lm-eval's thousands of installed tasks takes ~30 s: only when one is asked for.
    installed_wanted = any(not task.startswith(SHIPPED_PREFIX) for task in tasks)
    manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=installed_wanted)
    unknown = [task for task in tasks if task not in manager.all_tasks]
    if unknown:
        shipped = [task for task in manager.all_tasks if task.startswith(SHIPPED_PREFIX)]
        raise ValueError(f"--lm_eval: unknown task(s) {', '.join(unknown)}; shipped: "
                         f"{', '.join(sorted(shipped))}, "
                         "or any installed lm-eval task with local data")
    print(f"lm-eval: {', '.join(tasks)}" + (f", at most {limit} items each" if limit else "")
          + "; its INFO log (seeds, task list) and --metadata advice are off",
          file=sys.stderr, flush=True)
    with quiet_lm_eval():
        return simple_evaluate(model=lm, tasks=tasks, task_manager=manager, limit=limit,
                               log_samples=True, bootstrap_iters=0)


# lm-eval's advice for its own command line, logged as a warning for every task (two lines),
# which names options this tool does not have.
LM_EVAL_ADVICE = ("Custom kwargs can be passed to `--metadata`",)


def _not_advice(record: logging.LogRecord) -> bool:
    return not any(advice in record.getMessage() for advice in LM_EVAL_ADVICE)


@contextlib.contextmanager
def quiet_lm_eval() -> Iterator[None]:
    """Inside the block, lm-eval logs warnings and errors only, less its advice (restored
    after); `run_lm_eval` says in one line what runs instead."""
    root, task_logger = logging.getLogger("lm_eval"), logging.getLogger("lm_eval.api.task")
    before = root.level
    root.setLevel(logging.WARNING)
    task_logger.addFilter(_not_advice)
    try:
        yield
    finally:
        root.setLevel(before)
        task_logger.removeFilter(_not_advice)


def lm_eval_scores(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """{task: {metric: value, "items": n}} from lm-eval's results ("metric,filter" keys
    simplified, its "sample_len" named for what it is)."""
    return {task: {"items" if key == "sample_len" else key.split(",")[0]: value
                   for key, value in metrics.items()
                   if isinstance(value, (int, float)) and "_stderr" not in key}
            for task, metrics in results["results"].items()}


# ------------------------------------------------------------------ where results go

def report_dir_of(args: argparse.Namespace) -> Path:
    """Where the results go: `--report_dir`, else the run `--ckpt` is (or is a checkpoint of).
    A run's own report.md and evaluations.json are appended to; any other `--report_dir` must be
    new, empty or hold only this tool's earlier results, and never be, hold or lie inside what
    is evaluated (--ckpt, --data, --prompts, --tokenizer_dir): nothing else is written into
    (one line)."""
    if not args.report_dir:
        model_dir = resolve_model_dir(args.ckpt)
        for candidate in (Path(args.ckpt), model_dir.parent.parent):
            if candidate.is_dir() and is_run(candidate):
                return candidate
            if (candidate / RUN_MARKER).is_file() and (foreign := foreign_entry(candidate)):
                raise ValueError(f"--ckpt {args.ckpt}: its run {candidate} holds {foreign}, "
                                 "which no z2all run writes, so results are not written there; "
                                 "give --report_dir DIR (a new or empty directory)")
        raise ValueError(f"--ckpt {args.ckpt} is not a z2all run or one of its checkpoints, "
                         "and results are never written into a model's directory: give "
                         "--report_dir DIR (a new or empty directory) for them")
    report_dir, flag = Path(args.report_dir), f"--report_dir {args.report_dir}"
    if report_dir.is_dir() and is_run(report_dir):
        return report_dir
    data = [*(("--data", path) for path in args.data or []),
            *([("--prompts", args.prompts)] if args.prompts else [])]
    reads = [("--ckpt", args.ckpt), ("--tokenizer_dir", args.tokenizer_dir),
             *((option, path) for option, path in data if Path(path).exists())]
    problem = overlap_problem(flag, report_dir, reads, "give a new or empty --report_dir")
    if problem:
        raise ValueError(problem)
    if report_dir.exists() and not report_dir.is_dir():
        raise ValueError(f"{flag} is a file: give a new or empty directory")
    foreign = report_dir.is_dir() and foreign_entry(report_dir, allowed=(REPORT_FILE, RESULTS_FILE))
    if foreign:
        raise ValueError(f"{flag} holds {foreign}, which tools.evaluate does not write: give a "
                         "new or empty directory, a run's, or one of this tool's earlier results")
    return report_dir


def record_results(report_dir: Path, title: str, settings: dict[str, Any],
                   scores: dict[str, dict[str, float]]) -> None:
    """Append one evaluation to `evaluations.json` and its table to `report.md`."""
    report_dir.mkdir(parents=True, exist_ok=True)
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    json_path = report_dir / RESULTS_FILE
    history = json.loads(json_path.read_text(encoding="utf-8")) if json_path.is_file() else []
    history.append({"title": title, "time": when, "settings": settings, "scores": scores})
    atomic_write_json(json_path, history)
    metrics = sorted({metric for values in scores.values() for metric in values})
    lines = [f"\n## Evaluation: {title} ({when})\n",
             "settings: " + ", ".join(f"{key}={value}" for key, value in settings.items()) + "\n",
             "| | " + " | ".join(metrics) + " |", "|---" * (len(metrics) + 1) + "|"]
    lines += [f"| {name} | " + " | ".join(_cell(values.get(metric)) for metric in metrics) + " |"
              for name, values in scores.items()]
    report = report_dir / REPORT_FILE
    if EVALUATIONS_MARKER not in (report.read_text(encoding="utf-8") if report.is_file() else ""):
        lines.insert(0, "\n" + EVALUATIONS_MARKER)
    with open(report, "a", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")


def _cell(value: float | None) -> str:
    if value is None:
        return ""
    return str(value) if isinstance(value, int) or not math.isfinite(value) else f"{value:.4g}"


# ------------------------------------------------------------------ command line

def run_config_value(ckpt: str, key: str) -> Any:
    """A value of the trainer's `config.json` of the run `ckpt` belongs to (None if none)."""
    model_dir = resolve_model_dir(ckpt)
    for config_file in (Path(ckpt) / "config.json", model_dir.parent.parent / "config.json"):
        if config_file.is_file():
            return json.loads(config_file.read_text(encoding="utf-8")).get(key)
    return None


def main(argv: list[str] | None = None) -> None:
    parser = OptionParser(description=__doc__.split("\n")[0])
    add_model_arguments(parser)
    parser.add_argument("--data", nargs="+", default=None,
                        help="files/folders of .jsonl/.json/.parquet/.txt, DIR@split, "
                             "hf:org/name[:config][@split] (a dataset's validation split, else "
                             "test), or a pretokenized data dir (its valid split), for loss, "
                             "perplexity and bits per byte")
    parser.add_argument("--text_key", nargs="+", default=["text"],
                        help="field(s) holding the text in .jsonl/.json/.parquet records")
    parser.add_argument("--seq_len", type=int, default=None,
                        help="window length L (default: the run's --max_seq_len, else the "
                             "model's max_position_embeddings)")
    parser.add_argument("--batch_size", type=int, default=8,
                        help="windows / requests / prompts (x --num_generations) per batch")
    parser.add_argument("--max_batches", type=int, default=0,
                        help="stop --data after this many batches (0: the whole data)")
    parser.add_argument("--lm_eval", default=None,
                        help="comma list of lm-eval tasks, e.g. z2all_demo_skills,"
                             "z2all_demo_choice (shipped in tools/lm_eval_tasks/)")
    parser.add_argument("--limit", type=int, default=None,
                        help="at most this many windows of --data, items per lm-eval task, "
                             "prompts of --prompts")
    parser.add_argument("--chat", choices=["auto", "yes", "no"], default="auto",
                        help="lm-eval prompts as a chat user turn (auto: yes for sft/dpo runs; "
                             "for an HF dir, yes if its tokenizer has a chat template)")
    parser.add_argument("--report_dir", default=None,
                        help="where report.md / evaluations.json go (default: the run dir)")
    add_reward_arguments(parser)
    args = parser.parse_args(argv)
    configure_logging()
    raise_problems([range_problem("--batch_size", args.batch_size, 1),
                    range_problem("--seq_len", args.seq_len, 1),
                    range_problem("--max_batches", args.max_batches, 0),
                    range_problem("--limit", args.limit, 1), *reward_option_problems(args)])
    if not args.data and not args.lm_eval and not args.prompts:
        raise ValueError("nothing to evaluate: give --data FILE_OR_DIR, --lm_eval TASKS and/or "
                         "--prompts FILE_OR_DIR --reward_fn module:function")
    resolve_model_arguments(args)
    if snapshot_of(args.ckpt) and not args.report_dir:  # never write into the HF cache
        raise ValueError(f"--ckpt {args.ckpt} is a Hugging Face Hub snapshot: give "
                         "--report_dir DIR for the results")
    report_dir = report_dir_of(args)  # before any work
    rewards = load_rewards(args, report_dir) if args.prompts else []
    model, tokenizer = load_for_inference(args)
    positions = model.config.max_position_embeddings
    seq_len = args.seq_len or run_config_value(args.ckpt, "max_seq_len") or positions
    if seq_len > positions:  # RoPE beyond its trained length scores untrained positions
        raise ValueError(f"--seq_len {seq_len} is beyond the model's max_position_embeddings "
                         f"({positions}): give --seq_len {positions} or less")
    settings = {"ckpt": args.ckpt, "seq_len": seq_len, "batch_size": args.batch_size}
    if args.data:
        figures = language_model_metrics(model, tokenizer, args.data, seq_len, args.batch_size,
                                         args.text_key, torch.device(args.device),
                                         args.max_batches, args.limit)
        print("  ".join(f"{key} {_cell(value)}" for key, value in figures.items()))
        record_results(report_dir, "language modelling",
                       {**settings, "data": " ".join(args.data), "limit": args.limit},
                       {"data": figures})
    if args.lm_eval:
        chat = {"yes": True, "no": False}.get(args.chat)
        if chat is None:
            task_type = run_config_value(args.ckpt, "task_type")
            chat = (task_type in ("sft", "dpo") if task_type
                    else bool(getattr(tokenizer, "chat_template", None)))
        lm = Z2allLM(model, tokenizer, chat=chat, max_length=seq_len,
                     batch_size=args.batch_size, device=args.device)
        tasks = [task.strip() for task in args.lm_eval.split(",") if task.strip()]
        scores = lm_eval_scores(run_lm_eval(lm, tasks, args.limit))
        for task, values in scores.items():
            print(f"{task}: " + "  ".join(f"{k} {_cell(v)}" for k, v in values.items()))
        record_results(report_dir, "lm-evaluation-harness",
                       {**settings, "chat": chat, "limit": args.limit}, scores)
    if args.prompts:
        reward_settings, figures = evaluate_rewards(args, model, tokenizer, rewards)
        print("  ".join(f"{key} {_cell(value)}" for key, value in figures.items()))
        record_results(report_dir, "rewards", {"ckpt": args.ckpt, **reward_settings,
                                               "batch_size": args.batch_size},
                       {"prompts": figures})
    print(f"results appended to {report_dir / REPORT_FILE} and {report_dir / RESULTS_FILE}")


if __name__ == "__main__":
    sys.exit(run_main(main))
