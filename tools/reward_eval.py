"""Score a model's own answers with reward functions (`python -m tools.evaluate --prompts
FILE_OR_DIR --reward_fn module:function[,...]`) by the very code GRPO trains with
(trainer/rollouts.py, trainer/rewards.py), so a reward here means what it means in a GRPO run's
metrics.

Step 1. the prompt records of --prompts are read as GRPO reads them (`load_prompts`: `prompt` a
        string or a messages list, the other columns handed to the reward functions; of a
        `datasets` folder or a Hub dataset, its validation split, else test, as for --data);
        --limit N keeps the first N;
Step 2. K = --num_generations answers per prompt, at most --max_new_tokens tokens each, decoded
        by the serving engine (`sample_answers`), --batch_size prompts (x K answers) at a time
        behind a progress bar over the prompts. K = 1 is greedy unless --temperature is given;
        K > 1 samples, so it needs --temperature > 0. Answer j of the prompt at position i
        draws from its own random stream, `answer_seed(--seed, i, j)`: which batch it was
        decoded in does not choose its tokens;
Step 3. every --reward_fn scores the answers (`score`: TRL's f(prompts, completions, **columns)),
        summed with --reward_weights (`weighted_rewards`); an answer *passes* when its weighted
        reward is at least --pass_threshold (default 1: "fully right" for 0/1 rewards).

Figures:
    reward           the weighted reward's mean over all answers; an answer no function scored
                     (every one returned None) counts 0, as in the trainer's `val_reward`, which
                     this equals for K = 1, greedy, on the same prompts and --max_new_tokens
    rewards/<name>   each function's mean over all answers, None counting 0 likewise
    pass@1, pass@K   the chance that at least one of k answers passes, by the unbiased estimator
                     of Chen et al. 2021 (Evaluating Large Language Models Trained on Code,
                     eq. 1), per prompt with n = K answers of which c passed:
                         pass@k = 1 - C(n - c, k) / C(n, k)
                     averaged over the prompts. Worked example, K = 4, one prompt with c = 1:
                     pass@1 = 1 - C(3,1)/C(4,1) = 1 - 3/4 = 0.25 (the share passing), and
                     pass@4 = 1 - C(3,4)/C(4,4) = 1 - 0/1 = 1 (one of the four passed)
    prompts, answers how many were scored

A reward function is code: it is imported like the user's own module (trainer/rewards.py), and
refused when it lies in what is evaluated (the checkpoint, its run, the prompts, the tokenizer)
or where the results go: nothing in a data or model folder is ever executed.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from model.loading import resolve_model_dir
from trainer.rewards import NamedReward, load_reward_functions
from trainer.rollouts import (
    PromptRecord,
    answer_seed,
    load_prompts,
    sample_answers,
    score_answers,
    weighted_rewards,
)
from utils.data_files import find_data_files
from utils.dataset_splits import EVAL_SPLITS
from utils.option_checks import range_problem
from utils.run_ownership import is_run
from utils.tokenizer_protocol import Tokenizer

DEFAULT_SEED = 1337  # the trainer's --seed default


@dataclass(frozen=True)
class AnswerSampling:
    """How the answers of Step 2 are decoded."""

    num_generations: int
    temperature: float   # 0: greedy
    top_p: float
    max_new_tokens: int
    seed: int


def add_reward_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a reward evaluation (the module docstring says what each does)."""
    parser.add_argument("--prompts", default=None,
                        help="prompt records (jsonl/json/parquet files or a folder, a `datasets` "
                             "folder), GRPO's format: `prompt` (a string or a messages list) and "
                             "any other columns, for --reward_fn")
    parser.add_argument("--reward_fn", default="",
                        help="with --prompts: comma list of module:function in TRL's signature "
                             "f(prompts, completions, **columns) (trainer/rewards.py; built-ins: "
                             "trainer.reward_functions:demo_task_correct, exact_answer, "
                             "answer_format)")
    parser.add_argument("--reward_weights", default="",
                        help="comma list of one weight per --reward_fn (default 1 each)")
    parser.add_argument("--num_generations", type=int, default=1,
                        help="answers per prompt, K: pass@1 and pass@K (K > 1 samples: give "
                             "--temperature > 0)")
    parser.add_argument("--temperature", type=float, default=None,
                        help="sampling temperature of the answers (default: 0, greedy, for one "
                             "answer per prompt)")
    parser.add_argument("--top_p", type=float, default=1.0, help="nucleus sampling (1 = off)")
    parser.add_argument("--max_new_tokens", type=int, default=32, help="tokens per answer at most")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED,
                        help="seed of the answers' random streams (one per prompt and answer)")
    parser.add_argument("--pass_threshold", type=float, default=1.0,
                        help="an answer passes (pass@k) when its weighted reward is at least this")


def reward_option_problems(args: argparse.Namespace) -> list[str | None]:
    """What is wrong with the reward options (None for each that is fine), before any work."""
    if not args.prompts:
        return [None if not args.reward_fn else
                f"--reward_fn {args.reward_fn} scores answers to prompts: give --prompts "
                "FILE_OR_DIR too"]
    problems = [None if args.reward_fn.strip(", ") else
                "--prompts needs --reward_fn module:function[,...] to score the answers (e.g. "
                "trainer.reward_functions:exact_answer; see trainer/rewards.py)",
                range_problem("--num_generations", args.num_generations, 1),
                range_problem("--temperature", args.temperature, 0),
                range_problem("--top_p", args.top_p, 0, 1, low_open=True),
                range_problem("--max_new_tokens", args.max_new_tokens, 1),
                range_problem("--pass_threshold", args.pass_threshold)]
    if args.num_generations > 1 and not args.temperature:
        problems.append(f"--num_generations {args.num_generations} samples different answers "
                        "to each prompt: give --temperature above 0 (e.g. 1.0); greedy decoding "
                        "would answer the same K times")
    return problems


def load_rewards(args: argparse.Namespace, report_dir: Path) -> list[NamedReward]:
    """The --reward_fn functions, refused (one line) when one lies inside what is evaluated
    (the checkpoint and its run, the prompts, the tokenizer) or where results go; before it,
    a --prompts that names no data files is refused: both before the model loads."""
    find_data_files(args.prompts, splits=EVAL_SPLITS, option="--prompts")
    model_dir = resolve_model_dir(args.ckpt)
    run_dir = model_dir.parent.parent  # a checkpoint's run (ckpt/step_N -> the run)
    return load_reward_functions(args.reward_fn, args.reward_weights, [
        args.ckpt, str(model_dir), str(run_dir) if is_run(run_dir) else None, args.prompts,
        args.tokenizer_dir, str(report_dir)])


def pass_at_k(answers: int, passed: int, k: int) -> float:
    """Chen et al. 2021's unbiased estimate of the chance that at least one of k answers, drawn
    without replacement from `answers` of which `passed` passed, passes (module docstring)."""
    if answers - passed < k:  # every draw of k holds a passing answer
        return 1.0
    return 1.0 - math.comb(answers - passed, k) / math.comb(answers, k)


def reward_figures(model: torch.nn.Module, tokenizer: Tokenizer, records: list[PromptRecord],
                   rewards: list[NamedReward], sampling: AnswerSampling, batch_size: int,
                   pass_threshold: float) -> dict[str, float]:
    """The figures of the module docstring over `records` (Steps 2 and 3)."""
    group = sampling.num_generations
    tables = []
    with tqdm(total=len(records), desc="answering prompts", unit="prompt") as progress:
        for start in range(0, len(records), batch_size):
            chunk = records[start:start + batch_size]
            repeated = [record for record in chunk for _ in range(group)]
            seeds = [answer_seed(sampling.seed, start + index, answer)
                     for index in range(len(chunk)) for answer in range(group)]
            answers = sample_answers(model, tokenizer, [record.ids for record in repeated],
                                     seeds, sampling.max_new_tokens, sampling.temperature,
                                     sampling.top_p)
            tables.append(score_answers(tokenizer, repeated, answers, rewards)[1])
            progress.update(len(chunk))
    table = torch.cat(tables, dim=1)  # [functions, answers], NaN where a function said None
    total = weighted_rewards(table, rewards)
    passed = (total >= pass_threshold).view(-1, group).sum(dim=1).tolist()  # NaN never passes
    count = table.shape[1]
    figures = {"reward": float(total.nansum()) / count,
               **{f"rewards/{reward.name}": float(row.nansum()) / count
                  for reward, row in zip(rewards, table)}}
    for k in dict.fromkeys((1, group)):
        figures[f"pass@{k}"] = sum(pass_at_k(group, c, k) for c in passed) / len(passed)
    return figures | {"prompts": len(records), "answers": count}


def evaluate_rewards(args: argparse.Namespace, model: torch.nn.Module, tokenizer: Tokenizer,
                     rewards: list[NamedReward]) -> tuple[dict[str, Any], dict[str, float]]:
    """(the settings, the figures) of the reward evaluation the options ask for (Steps 1-3)."""
    positions = model.config.max_position_embeddings
    if args.max_new_tokens >= positions:
        raise ValueError(f"--max_new_tokens {args.max_new_tokens} leaves no room for a prompt "
                         f"in the model's {positions} positions: give fewer")
    records = load_prompts(args.prompts, tokenizer, positions - args.max_new_tokens,
                           option="--prompts", splits=EVAL_SPLITS,
                           room=f"the model's {positions} positions minus --max_new_tokens: "
                                "lower --max_new_tokens")[:args.limit]
    sampling = AnswerSampling(args.num_generations, args.temperature or 0.0, args.top_p,
                              args.max_new_tokens, args.seed)
    figures = reward_figures(model, tokenizer, records, rewards, sampling, args.batch_size,
                             args.pass_threshold)
    settings = {"prompts": args.prompts, "reward_fn": args.reward_fn,
                "reward_weights": args.reward_weights or "1 each",
                "num_generations": sampling.num_generations,
                "temperature": sampling.temperature, "top_p": sampling.top_p,
                "max_new_tokens": sampling.max_new_tokens, "seed": sampling.seed,
                "pass_threshold": args.pass_threshold, "limit": args.limit}
    return settings, figures
