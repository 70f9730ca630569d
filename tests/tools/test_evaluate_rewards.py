"""tools.evaluate --prompts --reward_fn (tools/reward_eval.py): the figures equal a hand count
over the model's own answers (decoded by GRPO's `sample_answers` with GRPO's per-answer seeds),
greedy ones equal the trainer's `val_reward`; pass@k is Chen et al.'s estimator; the results
land in evaluations.json and report.md; bad options and reward modules are one line.

The model is a tiny random one (its answers are 4 arbitrary tokens); the reward module, a
user's file written here, scores whether the text's length is a multiple of 3 and whether it
holds the record's `letter`: deterministic given the text, and spread over the answers."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests.tools.test_evaluate import tiny_model
from tokenizer import load_tokenizer
from tools import evaluate
from tools.reward_eval import pass_at_k
from trainer.distributed_env import DistributedEnv
from trainer.rewards import load_reward_functions
from trainer.rollouts import (
    RewardEvaluator,
    answer_seed,
    answer_text,
    load_prompts,
    sample_answers,
)
from utils.cli_errors import EXIT_BAD_INPUT
from utils.cli_errors import run_main as cli_run_main
from utils.conversation import stop_ids

REWARD_MODULE = '''
def third_length(prompts, completions, **columns):
    return [float(len(text) % 3 == 0) for text in completions]


def has_letter(prompts, completions, letter, **columns):
    return [None if want is None else float(want in text)
            for text, want in zip(completions, letter)]
'''
PROMPTS = [{"prompt": "Once upon a time", "letter": "e"}, {"prompt": "The king said"},
           {"prompt": "In the morning", "letter": "a"}]
MAX_NEW_TOKENS = 4
SEED = 2  # one whose 3 answers a prompt pass 0, 1 or 2 times: pass@1 < pass@3 < 1


@pytest.fixture
def inputs(tmp_path, tiny_hf_tokenizer_dir):
    """(the tokenizer, the model saved at tmp/model, the prompts folder, the reward module)."""
    tokenizer = load_tokenizer(tiny_hf_tokenizer_dir)
    model = tiny_model(tokenizer, seed=11)
    model.save_pretrained(tmp_path / "model")
    (tmp_path / "prompts").mkdir()
    prompts = tmp_path / "prompts"
    (prompts / "train.jsonl").write_text("".join(json.dumps(record) + "\n" for record in PROMPTS))
    rewards = tmp_path / "my_rewards.py"
    rewards.write_text(REWARD_MODULE)
    return tokenizer, model, prompts, rewards


def argv(tmp_path, tokenizer_dir, prompts, *extra) -> list[str]:
    return ["--ckpt", str(tmp_path / "model"), "--tokenizer_dir", str(tokenizer_dir),
            "--prompts", str(prompts), "--max_new_tokens", str(MAX_NEW_TOKENS),
            "--seed", str(SEED), "--dtype", "fp32", "--device", "cpu",
            "--report_dir", str(tmp_path / "report"), *extra]


def hand_figures(model, tokenizer, prompts, group: int, temperature: float) -> dict[str, float]:
    """The figures counted by hand from the answers `sample_answers` gives, all prompts in one
    batch: weighted reward = third_length + 0.5 x has_letter (None counting 0), passing at 1."""
    records = load_prompts(str(prompts), tokenizer, 10_000)
    repeated = [record for record in records for _ in range(group)]
    seeds = [answer_seed(SEED, position, answer) for position in range(len(records))
             for answer in range(group)]
    answers = sample_answers(model, tokenizer, [record.ids for record in repeated], seeds,
                             MAX_NEW_TOKENS, temperature, 1.0)
    texts = [answer_text(tokenizer, record.prompt, ids, stop_ids(tokenizer))
             for record, ids in zip(repeated, answers)]
    third = [float(len(text) % 3 == 0) for text in texts]
    letter = [float(record.columns.get("letter", "\0") in text)
              for record, text in zip(repeated, texts)]
    weighted = [a + 0.5 * b for a, b in zip(third, letter)]
    passed = [sum(value >= 1.0 for value in weighted[start:start + group])
              for start in range(0, len(weighted), group)]
    figures = {"reward": sum(weighted) / len(texts),
               "rewards/third_length": sum(third) / len(texts),
               "rewards/has_letter": sum(letter) / len(texts),
               "pass@1": sum(c / group for c in passed) / len(records)}
    figures[f"pass@{group}"] = sum(
        1 - math.comb(group - c, group) / math.comb(group, group) for c in passed) / len(records)
    return figures | {"prompts": len(records), "answers": len(texts)}


@pytest.mark.parametrize("group, sampling", [(1, []), (3, ["--temperature", "1.0"])],
                         ids=["greedy", "3-sampled"])
def test_figures_equal_a_hand_count_over_the_models_answers(
        tmp_path, tiny_hf_tokenizer_dir, inputs, capsys, group, sampling):
    tokenizer, model, prompts, rewards = inputs
    expected = hand_figures(model, tokenizer, prompts, group, 1.0 if sampling else 0.0)
    assert 0 < expected["reward"] < 1.5  # the answers differ in what they earn
    assert not sampling or expected["pass@1"] < expected["pass@3"] < 1
    # --batch_size 2: the CLI decodes 2 prompts, then 1; each answer keeps its own seed
    evaluate.main(argv(tmp_path, tiny_hf_tokenizer_dir, prompts, "--reward_fn",
                       f"{rewards}:third_length,{rewards}:has_letter", "--reward_weights", "1,0.5",
                       "--num_generations", str(group), "--batch_size", "2", *sampling))
    out, err = capsys.readouterr()
    assert "answering prompts" in err and "3/3" in err.rsplit("\r", 1)[-1]
    (entry,) = json.loads((tmp_path / "report" / "evaluations.json").read_text())
    assert entry["title"] == "rewards" and entry["settings"]["num_generations"] == group
    assert entry["scores"]["prompts"] == pytest.approx(expected, rel=1e-12)
    assert f"reward {expected['reward']:.4g}" in out
    assert "## Evaluation: rewards" in (tmp_path / "report" / "report.md").read_text()
    if not sampling:  # greedy: the trainer's own evaluation of a GRPO run gives the same reward
        functions = load_reward_functions(f"{rewards}:third_length,{rewards}:has_letter",
                                          "1,0.5", [])
        evaluator = RewardEvaluator(load_prompts(str(prompts), tokenizer, 10_000), functions,
                                    tokenizer, MAX_NEW_TOKENS,
                                    DistributedEnv(0, 1, 0, 1, torch.device("cpu")))
        metrics, _ = evaluator(None, model)
        assert metrics["val_reward"] == pytest.approx(expected["reward"], rel=1e-12)


@pytest.mark.parametrize("answers, passed, k, expected", [
    (1, 0, 1, 0.0), (1, 1, 1, 1.0),
    (4, 1, 1, 1 / 4),                      # pass@1 is the share that passed
    (4, 1, 4, 1.0),                        # one of all four passed
    (5, 0, 3, 0.0),
    (10, 3, 2, 1 - 21 / 45),               # 1 - C(7,2)/C(10,2)
    (10, 8, 3, 1.0),                       # fewer than 3 failed: every draw of 3 passes
    (200, 13, 10, 1 - math.comb(187, 10) / math.comb(200, 10)),
])
def test_pass_at_k_is_the_unbiased_estimator(answers, passed, k, expected):
    assert pass_at_k(answers, passed, k) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("extra, reason, before_loading", [
    (["--reward_fn", "REWARDS:third_length", "--num_generations", "3", "--temperature", "0"],
     "--num_generations 3 samples different answers to each prompt: give --temperature above 0",
     True),
    (["--reward_fn", "REWARDS:third_length", "--num_generations", "3"],
     "--num_generations 3 samples different answers to each prompt: give --temperature above 0",
     True),
    (["--reward_fn", "no_such_rewards:third_length"],
     "--reward_fn 'no_such_rewards:third_length': no module 'no_such_rewards'", True),
    (["--reward_fn", "PROMPTS/my_rewards.py:third_length"], "is inside", True),
    ([], "--prompts needs --reward_fn module:function", True),
    (["--reward_fn", "REWARDS:third_length", "--prompts", "PROMPTS/nothing"],
     "--prompts PROMPTS/nothing: no such file or directory", True),
    (["--reward_fn", "REWARDS:third_length", "--report_dir", "PROMPTS/results"],
     "--report_dir PROMPTS/results is inside --prompts PROMPTS", True),
    (["--reward_fn", "REWARDS:third_length", "--max_new_tokens", "64"],
     "--max_new_tokens 64 leaves no room for a prompt in the model's 64 positions", False),
    (["--reward_fn", "REWARDS:third_length", "--max_new_tokens", "62"],
     "at most 2 fit (the model's 64 positions minus --max_new_tokens: lower --max_new_tokens)",
     False),
], ids=["greedy-K", "no-temperature-K", "missing-module", "inside-the-prompts", "no-reward-fn",
        "no-prompts", "report-in-prompts", "no-room", "prompt-too-long"])
def test_bad_options_and_reward_modules_are_one_line(tmp_path, tiny_hf_tokenizer_dir, inputs,
                                                     capsys, extra, reason, before_loading):
    _, _, prompts, rewards = inputs
    (prompts / "my_rewards.py").write_text(REWARD_MODULE)
    extra = [arg.replace("REWARDS", str(rewards)).replace("PROMPTS", str(prompts))
             for arg in extra]
    reason = reason.replace("PROMPTS", str(prompts))
    assert cli_run_main(evaluate.main, argv(tmp_path, tiny_hf_tokenizer_dir, prompts,
                                            *extra)) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "Traceback" not in err and reason in err.strip().splitlines()[-1], err
    assert ("dtype fp32" not in err) == before_loading, err  # load_for_inference says it
    assert not (tmp_path / "report").exists() and not (prompts / "results").exists()
