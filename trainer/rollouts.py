"""GRPO's training data: the policy's own answers, sampled while it trains, and their rewards.

One *round* makes the micro-batches of --grpo_iterations optimizer steps:

    1. prompts   each rank takes its share of the round's prompts from the seeded prompt order
                 (dataset/sampler.py): batch_size x accumulation / G prompts per rank
    2. sample    G answers per prompt by the serving engine's batched KV-cache decoding
                 (server/engine.py `run_to_completion`), each answer with its own random stream
                 seeded by (--seed, the prompt's position in the order, the answer's number):
                 any layout, and a resumed run, samples the same answers
    3. score     every --reward_fn on (prompts, completions, **the records' other columns)
                 (trainer/rewards.py), summed with --reward_weights
    4. advantage within each group (trainer/grpo_loss.py `group_advantages`); a group never
                 spans ranks (--batch_size x accumulation is a multiple of G), and
                 --scale_rewards batch takes the std of the whole global batch (all-reduced)
    5. batches   prompt + answer rows, labels on the answer's tokens (its stop token included:
                 stopping is learned too), with the sampling policy's token log-probs when
                 the batch is reused (--grpo_iterations > 1) and the reference's when β > 0

The round's micro-batches are handed out --grpo_iterations times, then the next round is
made. A checkpoint holds the round in progress (each rank's own), so a resumed run continues
it with the same answers, bitwise. The reward statistics of the round (global: every rank's
answers) are logged with each training step (`step_metrics`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch

from dataset.sampler import StatefulDistributedSampler
from server.engine import Engine, Finished, GenerationRequest, SamplingParams
from trainer.distributed_env import DistributedEnv, all_reduce_sum
from trainer.forward_steps import ReferenceLogProbs
from trainer.global_batch import Batch
from trainer.grpo_loss import group_advantages
from trainer.options import GRPOOptions, TrainingOptions
from trainer.parallelize import ParallelRun
from trainer.reward_functions import completion_text, prompt_text
from trainer.rewards import NamedReward, load_reward_functions, score
from utils.conversation import build_generation_prompt, check_messages, stop_ids
from utils.data_files import find_data_files
from utils.dataset_splits import TRAIN_SPLITS
from utils.labels import IGNORE_INDEX
from utils.readers import iter_records
from utils.tokenizer_protocol import Tokenizer

WholeModel = Callable[[], AbstractContextManager[torch.nn.Module]]
SAMPLES_SHOWN = 4  # prompts whose greedy answers an evaluation logs


# ---- 1. prompts ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class PromptRecord:
    prompt: Any                # the record's `prompt`: a string, or a messages list
    ids: list[int]             # what the policy reads: the text, or the chat template's prompt
    columns: dict[str, Any]    # the record's other fields, for the reward functions


def load_prompts(data_dir: str, tokenizer: Tokenizer, max_prompt_tokens: int, *,
                 option: str = "--data_dir", splits: Sequence[str] = TRAIN_SPLITS,
                 room: str = "--max_seq_len minus --max_completion_length: raise --max_seq_len"
                 ) -> list[PromptRecord]:
    """Every record of the files `data_dir` names (jsonl, json, parquet, a `datasets` folder or
    Hub dataset: its first split of `splits`), in order. A record without a usable `prompt`, or
    one longer than `max_prompt_tokens`, is an error naming its file and line; `option` (which
    gave `data_dir`) and `room` (where the limit comes from, and the fix) are the caller's words
    for its messages."""
    records = []
    for path in find_data_files(data_dir, splits=splits, option=option):
        for record in iter_records(path):
            prompt = record.data.get("prompt")
            where = f"{record.path}:{record.number}"
            if isinstance(prompt, str) and prompt:
                ids = tokenizer.encode(prompt, add_special_tokens=False)
            elif isinstance(prompt, list):
                try:
                    check_messages(prompt)
                except ValueError as error:
                    raise ValueError(f"{where}: prompt: {error}") from None
                ids = build_generation_prompt(tokenizer, prompt)
            else:
                raise ValueError(f"{where}: a GRPO record needs 'prompt': a non-empty string or "
                                 f"a messages list; it has {sorted(record.data)[:8]}")
            if len(ids) > max_prompt_tokens:
                raise ValueError(f"{where}: the prompt is {len(ids)} tokens; at most "
                                 f"{max_prompt_tokens} fit ({room})")
            columns = {key: value for key, value in record.data.items() if key != "prompt"}
            records.append(PromptRecord(prompt, ids, columns))
    if not records:
        raise ValueError(f"{option} {data_dir}: no prompt records found")
    return records


# ---- 2. sample ----------------------------------------------------------------------------------
def answer_seed(seed: int, position: int, answer: int) -> int:
    """The random stream of one answer: a hash of where it is in the run, not of which rank
    or batch row produced it."""
    digest = hashlib.blake2b(f"{seed}:{position}:{answer}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # manual_seed takes 63 bits


def sample_answers(model: torch.nn.Module, tokenizer: Tokenizer, prompts: list[list[int]],
                   seeds: list[int], max_new_tokens: int, temperature: float,
                   top_p: float | None) -> list[list[int]]:
    """The new token ids of each prompt (stop token included when it came), all prompts
    decoded together by the serving engine; temperature 0 is greedy."""
    answers: list[list[int]] = [[] for _ in prompts]
    stops = stop_ids(tokenizer)

    def collect(row: int) -> Callable[[int | Finished], None]:
        def deliver(event: int | Finished) -> None:
            if not isinstance(event, Finished):
                answers[row].append(event)
            elif event.reason == "error":
                raise RuntimeError(f"generating a rollout failed: {event.message}")
        return deliver

    requests = [GenerationRequest(prompt_ids=ids, max_new_tokens=max_new_tokens,
                                  stop_ids=stops,
                                  sampling=SamplingParams(temperature, top_p=top_p, seed=seed),
                                  deliver=collect(row))
                for row, (ids, seed) in enumerate(zip(prompts, seeds))]
    was_training = model.training
    engine = Engine(model, max_batch_size=len(requests), real_vocab_size=len(tokenizer))
    try:
        engine.run_to_completion(requests)
    finally:
        model.train(was_training)
    return answers


def answer_text(tokenizer: Tokenizer, prompt: Any, ids: list[int], stops: list[int]) -> Any:
    """An answer as reward functions take it (TRL's forms): text without its stop token, or
    an assistant message for a messages prompt."""
    text = tokenizer.decode(ids[:-1] if ids and ids[-1] in stops else ids)
    return text if isinstance(prompt, str) else [{"role": "assistant", "content": text}]


# ---- 3. score -----------------------------------------------------------------------------------
def score_answers(tokenizer: Tokenizer, records: list[PromptRecord], answers: list[list[int]],
                  rewards: list[NamedReward]) -> tuple[list[Any], torch.Tensor]:
    """The answers as the reward functions take them (`answer_text`) and their rewards
    [functions, answers] (`score`: NaN where a function returned None); answer i is to
    records[i]."""
    stops = stop_ids(tokenizer)
    completions = [answer_text(tokenizer, record.prompt, ids, stops)
                   for record, ids in zip(records, answers)]
    table = torch.tensor(score(rewards, [record.prompt for record in records], completions,
                               reward_columns(records, answers)), dtype=torch.float64)
    return completions, table


def weighted_rewards(table: torch.Tensor, rewards: list[NamedReward]) -> torch.Tensor:
    """[functions, answers] -> each answer's weighted sum (None counts 0), NaN where no
    function scored it."""
    weights = torch.tensor([reward.weight for reward in rewards], dtype=torch.float64)
    total = (table * weights[:, None]).nansum(dim=0)
    total[table.isnan().all(dim=0)] = math.nan
    return total


def reward_statistics(table: torch.Tensor, rewards: list[NamedReward], answers: list[list[int]],
                      group: int, max_length: int, stops: list[int], env: DistributedEnv
                      ) -> dict[str, float]:
    """The round's statistics over every rank's answers (collective): the reward's mean and
    std, each function's, the answers' length, the share cut at `max_length`, and the share of
    groups whose rewards are all equal (they teach nothing)."""
    series = {"reward": weighted_rewards(table, rewards),
              **{f"rewards/{reward.name}": row for reward, row in zip(rewards, table)}}
    groups = series["reward"].nan_to_num(0.0).view(-1, group)
    cut = [len(ids) == max_length and ids[-1] not in stops for ids in answers]
    local = [float(len(answers)), float(sum(map(len, answers))), float(sum(cut)),
             float(len(groups)), float((groups == groups[:, :1]).all(dim=1).sum())]
    for values in series.values():
        scored = values[~values.isnan()]
        local += [float(len(scored)), float(scored.sum()), float(scored.pow(2).sum())]
    totals = all_reduce_sum(local, env)
    answers_total, tokens, cut_total, groups_total, equal_total = totals[:5]
    metrics = {"completion_length": tokens / answers_total,
               "completions_cut": cut_total / answers_total,
               "frac_reward_zero_std": equal_total / groups_total}
    for index, name in enumerate(series):
        count, total, squares = totals[5 + 3 * index:8 + 3 * index]
        mean = total / count if count else math.nan
        variance = (squares - count * mean * mean) / (count - 1) if count > 1 else math.nan
        std = math.sqrt(max(variance, 0.0)) if count > 1 else math.nan
        metrics |= ({"reward": mean, "reward_std": std} if name == "reward"
                    else {f"{name}/mean": mean, f"{name}/std": std})
    return metrics


# ---- 5. batches ---------------------------------------------------------------------------------
def rollout_batch(prompts: list[list[int]], answers: list[list[int]], pad_id: int) -> Batch:
    """Rows prompt + answer, right-padded; `labels[t]` is token t + 1 on the answer's tokens
    (utils/labels.py), -100 elsewhere."""
    rows = [prompt + answer for prompt, answer in zip(prompts, answers)]
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for row, (prompt, ids) in enumerate(zip(prompts, rows)):
        input_ids[row, :len(ids)] = torch.tensor(ids)
        attention_mask[row, :len(ids)] = 1
        labels[row, len(prompt) - 1:len(ids) - 1] = torch.tensor(ids[len(prompt):])
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}


@torch.no_grad()
def add_log_probs(model: torch.nn.Module, batch: Batch, sampling_policy: bool,
                  reference: ReferenceLogProbs | None) -> None:
    """The sampling policy's token log-probs (`old_logps`: needed once the batch is reused,
    where later steps compare the moved policy with it) and the reference's (β > 0), both in
    eval mode, added to `batch`."""
    device = model.lm_head.weight.device
    inputs = {key: batch[key].to(device) for key in ("input_ids", "labels", "attention_mask")}
    with _eval_mode(model):
        if sampling_policy:
            batch["old_logps"] = model.token_log_probs(**inputs).cpu()
        if reference is not None:
            batch["reference_logps"] = reference(model, inputs).cpu()


@dataclass
class Round:
    """This rank's rollouts of one round: the micro-batches, and how many were handed out."""

    micro_batches: list[Batch]
    metrics: dict[str, float]
    handed_out: int = 0


class RolloutData:
    """The training data of a GRPO run (the `TrainData` the loop iterates and checkpoints):
    endless micro-batches of rollouts, made round by round as the module docstring says."""

    def __init__(self, prompts: list[PromptRecord], grpo: GRPOOptions, tokenizer: Tokenizer,
                 rewards: list[NamedReward], env: DistributedEnv, *, batch_size: int,
                 accumulation: int, seed: int) -> None:
        self.prompts, self.grpo, self.tokenizer, self.rewards = prompts, grpo, tokenizer, rewards
        self.env, self.batch_size, self.accumulation = env, batch_size, accumulation
        self.seed = seed
        self.prompts_per_rank = batch_size * accumulation // grpo.num_generations
        self.sampler = StatefulDistributedSampler(len(prompts), env.rank, env.world_size, seed)
        self.round: Round | None = None
        self.policy: ParallelRun | None = None
        self.reference: ReferenceLogProbs | None = None

    def use_policy(self, policy: ParallelRun, reference: ReferenceLogProbs | None) -> None:
        """The policy that samples, spread over ranks as the run holds it (trainer/
        parallelize.py), and the reference (None when β = 0). Given after the model is built,
        which happens after the data (a checkpoint restores both)."""
        self.policy, self.reference = policy, reference

    def __iter__(self) -> Iterator[Batch]:
        uses = self.grpo.grpo_iterations * self.accumulation
        while True:
            if self.round is None or self.round.handed_out == uses:
                self.round = self._new_round()
            batch = self.round.micro_batches[self.round.handed_out % self.accumulation]
            self.round.handed_out += 1
            yield dict(batch)

    def _new_round(self) -> Round:
        group = self.grpo.num_generations
        order = iter(self.sampler)
        drawn = []
        for _ in range(self.prompts_per_rank):
            position = self.sampler.total_consumed + self.env.rank
            drawn.append((position, self.prompts[next(order)]))
        records = [record for _, record in drawn for _ in range(group)]
        seeds = [answer_seed(self.seed, position, answer) for position, _ in drawn
                 for answer in range(group)]
        stops = stop_ids(self.tokenizer)
        self.policy.optimizer.finish_param_sync()  # ZeRO-1 may still be gathering the weights
        with self.policy.whole_model() as model:  # every rank enters; each holds the whole model
            answers = sample_answers(model, self.tokenizer, [r.ids for r in records], seeds,
                                     self.grpo.max_completion_length, self.grpo.temperature,
                                     self.grpo.top_p)
            micro_batches = [rollout_batch([r.ids for r in records[start:start + self.batch_size]],
                                           answers[start:start + self.batch_size], stops[0])
                             for start in range(0, len(records), self.batch_size)]
            for batch in micro_batches:
                add_log_probs(model, batch, self.grpo.grpo_iterations > 1, self.reference)
        _, table = score_answers(self.tokenizer, records, answers, self.rewards)
        metrics = reward_statistics(table, self.rewards, answers, group,
                                    self.grpo.max_completion_length, stops, self.env)
        advantages = group_advantages(weighted_rewards(table, self.rewards), group,
                                      self.grpo.scale_rewards,
                                      batch_std=metrics["reward_std"]).float()
        for index, batch in enumerate(micro_batches):
            batch["advantages"] = advantages[index * self.batch_size:(index + 1)
                                             * self.batch_size]
        return Round(micro_batches, metrics)

    # ---- TrainData --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The prompt order's position (global) and this rank's round in progress (plain
        containers: checkpoints are read with `weights_only`)."""
        return {"prompts": self.sampler.state_dict(),
                "round": None if self.round is None else dataclasses.asdict(self.round)}

    def restore(self, saved: list[dict[str, Any]]) -> str | None:
        """The saved prompt position; the round in progress when this rank saved one (same
        world size), else a new round starts: said in the returned note."""
        if not isinstance(saved[0], dict) or "prompts" not in saved[0]:
            raise ValueError("the checkpoint's data state is not a GRPO run's")
        self.sampler.load_state_dict(saved[0]["prompts"])
        if len(saved) == self.env.world_size:
            mine = saved[self.env.rank]["round"]
            self.round = None if mine is None else Round(**mine)
            return None
        return (f"note: the world size changed ({len(saved)} -> {self.env.world_size}): the "
                "round of rollouts in progress is dropped and a new one sampled")

    def step_metrics(self) -> dict[str, float]:
        return self.round.metrics if self.round is not None else {}

    def skipped_records(self) -> int:
        return 0  # a bad prompt record stops the run at start (load_prompts)

    def policy_counts(self) -> dict[str, int]:
        return {}


def reward_columns(records: list[PromptRecord], answers: list[list[int]]) -> dict[str, list[Any]]:
    """The records' other fields as one list per field (None where a record lacks it), and
    the answers' token ids: the keyword arguments of every reward function."""
    names = list(dict.fromkeys(name for record in records for name in record.columns))
    return {**{name: [record.columns.get(name) for record in records] for name in names},
            "completion_ids": answers}


@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def build_rollouts(options: TrainingOptions, tokenizer: Tokenizer, env: DistributedEnv
                   ) -> tuple[RolloutData, RewardEvaluator]:
    """The GRPO run's data and evaluator: the prompt records of --data_dir, the last
    --eval_iters x (prompts per step) of them held out for evaluation (at most half), the
    reward functions (never from the run's data, tokenizer, model or output folders)."""
    grpo, optimization = options.grpo, options.optimization
    prompts = load_prompts(options.data.data_dir, tokenizer,
                           options.data.max_seq_len - grpo.max_completion_length)
    rewards = load_reward_functions(grpo.reward_fn, grpo.reward_weights, [
        options.data.data_dir, options.data.tokenizer_dir, options.model.init_from,
        options.run.out_dir])
    prompts_per_step = (optimization.batch_size * optimization.gradient_accumulation_steps
                        * env.world_size // grpo.num_generations)
    held_out = min(options.eval.eval_iters * prompts_per_step, len(prompts) // 2)
    train, valid = prompts[:len(prompts) - held_out], prompts[len(prompts) - held_out:]
    if env.is_main:
        print(f"GRPO: {len(train)} training prompts ({prompts_per_step} per step x "
              f"{grpo.num_generations} answers), {len(valid)} held out for evaluation; "
              f"rewards: {', '.join(reward.name for reward in rewards)}", flush=True)
    evaluator = RewardEvaluator(valid, rewards, tokenizer, grpo.max_completion_length, env)
    data = RolloutData(train, grpo, tokenizer, rewards, env,
                       batch_size=optimization.batch_size,
                       accumulation=optimization.gradient_accumulation_steps,
                       seed=optimization.seed)
    return data, evaluator


# ---- evaluation -----------------------------------------------------------------------------
class RewardEvaluator:
    """GRPO's evaluation: greedy answers to the held-out prompts, scored by the reward
    functions (`val_reward`, `val_rewards/<name>`); its `val_loss` is −val_reward, so
    `ckpt/best` is the most rewarded checkpoint. Same call as `trainer.evaluation.Evaluator`."""

    def __init__(self, prompts: list[PromptRecord], rewards: list[NamedReward],
                 tokenizer: Tokenizer, max_new_tokens: int, env: DistributedEnv) -> None:
        self.prompts = prompts[env.rank::env.world_size]
        self.rewards, self.tokenizer, self.env = rewards, tokenizer, env
        self.max_new_tokens = max_new_tokens

    def __call__(self, scored: Any, model: Any, whole_model: WholeModel | None = None
                 ) -> tuple[dict[str, float], list[dict[str, Any]]]:
        with (whole_model or (lambda: contextlib.nullcontext(model)))() as whole:
            # greedy; a seed all the same, so that no global random stream is drawn from
            answers = sample_answers(whole, self.tokenizer, [r.ids for r in self.prompts],
                                     [0] * len(self.prompts), self.max_new_tokens, 0.0, None)
        completions, table = score_answers(self.tokenizer, self.prompts, answers, self.rewards)
        total = weighted_rewards(table, self.rewards)
        local = [float(len(self.prompts)), float(total.nansum())]
        local += [float(row.nansum()) for row in table]
        totals = all_reduce_sum(local, self.env)
        count = max(totals[0], 1.0)
        metrics = {"val_reward": totals[1] / count, "val_loss": -totals[1] / count,
                   **{f"val_rewards/{reward.name}": total / count
                      for reward, total in zip(self.rewards, totals[2:])}}
        samples = [{"prompt": prompt_text(record.prompt),  # a messages prompt: its last turn
                    "completion": completion_text(completion), "reward": float(reward)}
                   for record, completion, reward in zip(self.prompts[:SAMPLES_SHOWN],
                                                         completions, total)
                   ] if self.env.is_main else []
        return metrics, samples
