"""lm-evaluation-harness on our model: per item, lm-eval's replies, log-likelihoods and scores
on the shipped demo tasks equal our own computation (an unbatched greedy loop and unbatched
log-softmax sums, graded by the demo's grader)."""

from __future__ import annotations

import json
import random

import pytest
import torch
import torch.nn.functional as F

from data.demo_tasks import is_correct
from tokenizer import load_tokenizer
from tools import evaluate
from tools.lm_eval_model import Z2allLM
from utils.conversation import IM_END, build_generation_prompt

from .test_evaluate import tiny_model

torch.set_num_threads(1)  # the test machine is small and shared
LIMIT = 12  # items per task: the first 12 of each shipped file
MAX_NEW_TOKENS = 12  # as z2all_demo_skills.yaml


def prompt_ids(tokenizer, prompt: str, chat: bool) -> list[int]:
    if chat:
        return build_generation_prompt(tokenizer, [{"role": "user", "content": prompt}])
    return tokenizer.encode(prompt, add_special_tokens=False)


@torch.no_grad()
def greedy_reply(model, tokenizer, prompt: str, chat: bool) -> str:
    """One token at a time, the whole sequence re-run each step: no batching, no cache."""
    stop = tokenizer.convert_tokens_to_ids(IM_END) if chat else tokenizer.eos_token_id
    ids, new = prompt_ids(tokenizer, prompt, chat), []
    for _ in range(MAX_NEW_TOKENS):
        token = int(model(torch.tensor([ids + new])).logits[0, -1].argmax())
        if token == stop:
            break
        new.append(token)
    return tokenizer.decode(new)


@torch.no_grad()
def continuation_log_prob(model, tokenizer, prompt: str, answer: str, chat: bool) -> float:
    context = prompt_ids(tokenizer, prompt, chat)
    answer_ids = tokenizer.encode(answer, add_special_tokens=False)
    log_probs = F.log_softmax(model(torch.tensor([context + answer_ids])).logits[0].float(), -1)
    return sum(float(log_probs[len(context) - 1 + i, token]) for i, token in enumerate(answer_ids))


def shipped_items(name: str) -> list[dict]:
    with open(evaluate.TASKS_DIR / name, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle][:LIMIT]


@pytest.mark.parametrize("chat", [True, False])
def test_lm_eval_equals_our_own_accuracy_item_by_item(tiny_hf_tokenizer_dir, chat):
    tokenizer = load_tokenizer(tiny_hf_tokenizer_dir)
    model = tiny_model(tokenizer, seed=random.randrange(1000))
    lm = Z2allLM(model, tokenizer, chat=chat, max_length=64, batch_size=5)
    results = evaluate.run_lm_eval(lm, ["z2all_demo_skills", "z2all_demo_choice"], limit=LIMIT)

    skills = {s["doc"]["prompt"]: s for s in results["samples"]["z2all_demo_skills"]}
    items = shipped_items("skills.jsonl")
    assert sorted(skills) == sorted(item["prompt"] for item in items)
    correct = 0
    for item in items:
        reply = greedy_reply(model, tokenizer, item["prompt"], chat)
        sample = skills[item["prompt"]]
        assert sample["resps"][0][0] == reply
        assert sample["exact_match"] == is_correct(item["task"], item["prompt"], reply)
        correct += is_correct(item["task"], item["prompt"], reply)
    assert results["results"]["z2all_demo_skills"]["exact_match,none"] == correct / len(items)

    choice = {s["doc"]["prompt"]: s for s in results["samples"]["z2all_demo_choice"]}
    items = shipped_items("choice.jsonl")
    assert sorted(choice) == sorted(item["prompt"] for item in items)
    right = 0
    for item in items:
        ours = [continuation_log_prob(model, tokenizer, item["prompt"], answer, chat)
                for answer in item["choices"]]
        theirs = [resp[0][0] for resp in choice[item["prompt"]]["resps"]]
        assert theirs == pytest.approx(ours, abs=1e-4)
        picked = max(range(len(ours)), key=ours.__getitem__)
        assert choice[item["prompt"]]["acc"] == float(picked == item["label"])
        right += picked == item["label"]
    assert results["results"]["z2all_demo_choice"]["acc,none"] == right / len(items)


def test_unknown_task_is_refused_with_the_shipped_names(tiny_hf_tokenizer_dir):
    tokenizer = load_tokenizer(tiny_hf_tokenizer_dir)
    lm = Z2allLM(tiny_model(tokenizer, seed=0), tokenizer, chat=True, max_length=64)
    with pytest.raises(ValueError, match="z2all_demo_choice, z2all_demo_skills"):
        evaluate.run_lm_eval(lm, ["z2all_demo_skils"])


class Request:
    """The one field of lm-eval's Instance that a model reads."""

    def __init__(self, *args):
        self.args = args


@torch.no_grad()
def test_rolling_log_likelihood_equals_the_sum_over_consecutive_windows(tiny_hf_tokenizer_dir):
    """With L dividing the token count, lm-eval's rolling windows are the consecutive L-token
    chunks of [EOS] + tokens, each predicting the next L tokens."""
    tokenizer = load_tokenizer(tiny_hf_tokenizer_dir)
    model = tiny_model(tokenizer, seed=random.randrange(1000))
    rng = random.Random()
    words = ["model", "tokens", "我们", "naïve", "42", "the"]
    while True:
        text = " ".join(rng.choice(words) for _ in range(rng.randint(10, 20)))
        tokens = tokenizer.encode(text, add_special_tokens=False)
        divisors = [d for d in range(4, len(tokens) // 2 + 1) if len(tokens) % d == 0]
        if divisors and len(tokens) <= 64:  # 64: the tiny model's max_position_embeddings
            break
    window = rng.choice(divisors)
    sequence = torch.tensor([tokenizer.eos_token_id, *tokens])
    expected = 0.0
    for start in range(0, len(tokens), window):
        log_probs = F.log_softmax(model(sequence[None, start:start + window]).logits[0], -1)
        targets = sequence[start + 1:start + window + 1]
        expected += float(log_probs.gather(1, targets[:, None]).sum())
    lm = Z2allLM(model, tokenizer, chat=False, max_length=window, batch_size=3)
    assert lm.loglikelihood_rolling([Request(text)]) == [pytest.approx(expected, abs=1e-3)]
    # One window holding everything: the plain log-likelihood of the text after EOS.
    whole = Z2allLM(model, tokenizer, chat=False, max_length=len(tokens))
    unsplit = F.log_softmax(model(sequence[None, :-1]).logits[0], -1)
    assert whole.loglikelihood_rolling([Request(text)]) == [pytest.approx(
        float(unsplit.gather(1, sequence[1:, None]).sum()), abs=1e-3)]
