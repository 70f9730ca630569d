"""The built-in reward functions (trainer/reward_functions.py), in TRL's call convention, with
string and conversational prompts and completions."""

from __future__ import annotations

import pytest

from trainer.reward_functions import answer_format, demo_task_correct, exact_answer
from trainer.rewards import load_reward_functions, score


def chat(role: str, text: str) -> list[dict[str, str]]:
    return [{"role": role, "content": text}]


@pytest.mark.parametrize(("function", "prompts", "completions", "columns", "expected"), [
    (demo_task_correct, ["What is 7 + 5?", "Reverse the word \"dipo\"."], ["12\n", "dipo"],
     {"task": ["add1", "reverse"]}, [1.0, 0.0]),
    (demo_task_correct, [chat("user", "What is 7 + 5?")], [chat("assistant", " 12")],
     {"task": ["add1"]}, [1.0]),
    (exact_answer, ["q", "q", "q"], ["so 4\n#### 42", "42", "#### 41"],
     {"answer": [42, "42", "42"]}, [1.0, 1.0, 0.0]),
    (answer_format, ["q", "q", "q"], ["work\n#### 42", "42", "#### "], {}, [1.0, 0.0, 0.0]),
])
def test_built_in_rewards(function, prompts, completions, columns, expected):
    assert function(prompts=prompts, completions=completions, **columns) == expected


def test_rewards_load_by_name_and_are_scored_with_their_weights():
    rewards = load_reward_functions("trainer.reward_functions:exact_answer,"
                                    "trainer.reward_functions:answer_format", "2,0.5", [])
    assert [(reward.name, reward.weight) for reward in rewards] == [("exact_answer", 2.0),
                                                                   ("answer_format", 0.5)]
    table = score(rewards, ["q", "q"], ["#### 3", "3"], {"answer": ["3", "4"]})
    assert table == [[1.0, 0.0], [1.0, 0.0]]
