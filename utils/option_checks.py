"""Range checks for command-line options, so every CLI refuses a bad value before any work.

A CLI collects the problems of all its options in one place and raises them together:

    problems = [range_problem("--batch_size", args.batch_size, low=1),
                range_problem("--top_p", args.top_p, low=0, high=1, low_open=True)]
    raise_problems(problems)   # ValueError("--top_p must be in (0, 1], got 1.5"); None: fine

Option groups are dataclasses whose fields are declared with `option(default, help)`: the
help text travels with the field, and `--help` and the docs' options table are made from it.

NaN and infinity are never valid: a NaN compares false with every bound, so without this a
`--grad_clip=nan` would pass `>= 0` checks written the natural way and silently do nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import field
from typing import Any


def option(default: Any, help: str) -> Any:  # noqa: A002 - `help` reads best in the knobs
    """A dataclass field with its one-line help (a list default is copied per instance)."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


def _interval(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    if high is None:
        return f"{'>' if low_open else '>='} {low:g}"
    if low is None:
        return f"{'<' if high_open else '<='} {high:g}"
    return f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"


def range_problem(name: str, value: float | None, low: float | None = None,
                  high: float | None = None, *, low_open: bool = False,
                  high_open: bool = False) -> str | None:
    """Why `value` of option `name` is out of range, or None if it is fine (None values are:
    an unset optional option is checked where its default is chosen)."""
    if value is None:
        return None
    fine = math.isfinite(value)
    if fine and low is not None:
        fine = value > low if low_open else value >= low
    if fine and high is not None:
        fine = value < high if high_open else value <= high
    if fine:
        return None
    kind = "" if math.isfinite(value) else "a finite number "
    return f"{name} must be {kind}{_interval(low, high, low_open, high_open)}, got {value!r}"


def join_problems(problems: Iterable[str | None]) -> str:
    """Every problem found, in one line ("" if the options were all fine, i.e. all None)."""
    return "; ".join(problem for problem in problems if problem)


def raise_problems(problems: Iterable[str | None]) -> None:
    """One ValueError naming every problem found (the Nones are options that were fine)."""
    if found := join_problems(problems):
        raise ValueError(found)
