"""Checkable skills for the demo's SFT and DPO stages, and the grader used to measure them.

A tiny model (a few million parameters, minutes of CPU training) cannot learn to chat, but it
can learn small string and arithmetic skills whose answers are unambiguous, so "did SFT work?"
becomes an accuracy number instead of an impression. The tasks are graded by difficulty:

    task     example prompt                          answer   what the model must do
    copy     Repeat the word "bakito".               bakito   copy a span (attention only)
    upper    Write "lomera" in capital letters.      LOMERA   map each letter
    add1     What is 7 + 5?                          12       recall 100 facts
    length   How many letters are in "sutava"?       6        count
    reverse  Reverse the word "dipo".                opid     copy in reverse order
    add2     What is 47 + 38?                        85       carry across digits

Each task phrases its prompt in a few ways, so a fact seen in training under one phrasing can
be asked under another. The grader never trusts a stored answer: it recomputes the answer from
the prompt (`solve`), so an evaluation file cannot disagree with the rules.
Words are pronounceable nonsense built from syllables, so they are endless and not in any
training prose, and tokenizers split them into several pieces like real rare words.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

CONSONANTS = "bdfgklmnprstvz"
VOWELS = "aeiou"
WORD_IN_QUOTES = re.compile(r'"([a-z]+)"')
TWO_NUMBERS = re.compile(r"(\d+) \+ (\d+)")


def random_word(rng: random.Random) -> str:
    """A pronounceable nonsense word of 2-7 letters: 1-3 consonant+vowel syllables and maybe a
    final consonant, e.g. "tamikos"."""
    syllables = rng.randint(1, 3)
    word = "".join(rng.choice(CONSONANTS) + rng.choice(VOWELS) for _ in range(syllables))
    return word + (rng.choice(CONSONANTS) if rng.random() < 0.5 else "")


def _word_of(prompt: str) -> str:
    match = WORD_IN_QUOTES.search(prompt)
    if match is None:
        raise ValueError(f"no quoted word in prompt {prompt!r}")
    return match.group(1)


def _sum_of(prompt: str) -> str:
    match = TWO_NUMBERS.search(prompt)
    if match is None:
        raise ValueError(f"no 'a + b' in prompt {prompt!r}")
    return str(int(match.group(1)) + int(match.group(2)))


def _off_by_one(rng: random.Random, answer: str) -> str:
    """A near-miss number: the typical arithmetic slip (never negative)."""
    value = int(answer)
    return str(value + 1 if value == 0 or rng.random() < 0.5 else value - 1)


def _garbled(rng: random.Random, word: str) -> str:
    """A near-miss word: two neighbouring letters swapped (or the last one dropped)."""
    swappable = [i for i in range(len(word) - 1) if word[i] != word[i + 1]]
    if not swappable:
        return word[:-1]
    i = rng.choice(swappable)
    return word[:i] + word[i + 1] + word[i] + word[i + 2:]


@dataclass(frozen=True)
class Task:
    name: str
    templates: tuple[str, ...]  # prompt phrasings; "{word}" or "{a}"/"{b}" are filled in
    draw: Callable[[random.Random], dict[str, object]]  # random operands for the template
    solve: Callable[[str], str]  # prompt -> the one correct answer
    near_miss: Callable[[random.Random, str, str], str]  # (rng, prompt, answer) -> wrong answer

    def sample(self, rng: random.Random) -> tuple[str, str]:
        """A fresh (prompt, answer) pair."""
        prompt = rng.choice(self.templates).format(**self.draw(rng))
        return prompt, self.solve(prompt)

    def wrong_answer(self, rng: random.Random, prompt: str) -> str:
        """A plausible but wrong answer, for DPO's `rejected` side."""
        answer = self.solve(prompt)
        wrong = self.near_miss(rng, prompt, answer)
        return wrong if wrong != answer else answer + answer[-1]


def _draw_word(rng: random.Random) -> dict[str, object]:
    return {"word": random_word(rng)}


TASKS: dict[str, Task] = {task.name: task for task in [
    Task("copy",
         ('Repeat the word "{word}".', 'Say "{word}" back to me.', 'Echo: "{word}"'),
         _draw_word, _word_of, lambda rng, prompt, answer: _garbled(rng, answer)),
    Task("upper",
         ('Write "{word}" in capital letters.', 'Uppercase the word "{word}".',
          'Shout "{word}".'),
         _draw_word, lambda prompt: _word_of(prompt).upper(),
         lambda rng, prompt, answer: answer.capitalize() if rng.random() < 0.5
         else _garbled(rng, answer)),
    Task("add1",
         ("What is {a} + {b}?", "Compute {a} + {b}.", "{a} + {b} = ?"),
         lambda rng: {"a": rng.randint(0, 9), "b": rng.randint(0, 9)}, _sum_of,
         lambda rng, prompt, answer: _off_by_one(rng, answer)),
    Task("length",
         ('How many letters are in "{word}"?', 'Count the letters of "{word}".',
          'Length of "{word}"?'),
         _draw_word, lambda prompt: str(len(_word_of(prompt))),
         lambda rng, prompt, answer: _off_by_one(rng, answer)),
    Task("reverse",
         ('Reverse the word "{word}".', 'Spell "{word}" backwards.',
          'Write "{word}" from right to left.'),
         _draw_word, lambda prompt: _word_of(prompt)[::-1],
         lambda rng, prompt, answer: _word_of(prompt) if rng.random() < 0.5
         else _garbled(rng, answer)),
    Task("add2",
         ("What is {a} + {b}?", "Compute {a} + {b}.", "{a} + {b} = ?"),
         lambda rng: {"a": rng.randint(10, 99), "b": rng.randint(10, 99)}, _sum_of,
         lambda rng, prompt, answer: str(int(answer) + rng.choice([-10, -1, 1, 10]))),
]}


def is_correct(task: str, prompt: str, response: str) -> bool:
    """Whether a model's `response` answers `prompt` of `task`; surrounding whitespace is ignored
    (generation often ends with a newline), anything else (a trailing period, more words) is not."""
    return response.strip() == TASKS[task].solve(prompt)
