"""Built-in reward functions for GRPO (`--reward_fn trainer.reward_functions:NAME`), in TRL's
signature (trainer/rewards.py): verifiable rewards, computed from the answer alone.

    demo_task_correct   1 if the demo task's answer is right (`data.demo_tasks.is_correct`;
                        records need a `task` column), else 0
    exact_answer        1 if the final answer equals the record's `answer` column, else 0
    answer_format       1 if the completion ends with a final-answer line "#### <answer>"
                        (GSM8K's convention), else 0: a shaping reward beside exact_answer
"""

from __future__ import annotations

from typing import Any

from data.demo_tasks import is_correct

FINAL_ANSWER_MARK = "####"


def completion_text(completion: Any) -> str:
    """A completion as text: a string, or the content of a conversational one."""
    return completion if isinstance(completion, str) else completion[-1]["content"]


def prompt_text(prompt: Any) -> str:
    """A prompt as text: a string, or the last user message of a messages list."""
    return prompt if isinstance(prompt, str) else prompt[-1]["content"]


def final_answer(text: str) -> str:
    """What follows the last "####", or else the whole text, stripped."""
    return text.rpartition(FINAL_ANSWER_MARK)[2].strip()


def demo_task_correct(prompts: list[Any], completions: list[Any], task: list[str],
                      **columns: Any) -> list[float]:
    return [float(is_correct(name, prompt_text(prompt), completion_text(completion)))
            for prompt, completion, name in zip(prompts, completions, task)]


def exact_answer(prompts: list[Any], completions: list[Any], answer: list[Any],
                 **columns: Any) -> list[float]:
    return [float(final_answer(completion_text(completion)) == str(expected).strip())
            for completion, expected in zip(completions, answer)]


def answer_format(prompts: list[Any], completions: list[Any], **columns: Any) -> list[float]:
    def has_final_line(text: str) -> bool:
        last_line = text.strip().rpartition("\n")[2]
        return last_line.startswith(FINAL_ANSWER_MARK) and bool(final_answer(last_line))
    return [float(has_final_line(completion_text(completion))) for completion in completions]
