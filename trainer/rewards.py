"""Reward functions for GRPO: `--reward_fn module:function[,module:function ...]`.

A reward function has TRL's signature, so one written for TRL's `GRPOTrainer` works here:

    def my_reward(prompts, completions, **columns) -> list[float | None]: ...

`prompts` and `completions` are lists of equal length (G completions per prompt, each prompt
repeated G times); a prompt is what the record's `prompt` held (a string, or a messages list),
a completion is a string, or `[{"role": "assistant", "content": text}]` for a messages prompt.
`columns` are the record's other fields, one value per completion (e.g. `answer=[...]`), plus
`completion_ids` (the token ids). None means "not scored" (e.g. a math reward on a code task):
it counts as 0 in the weighted sum, and an answer no function scored gets advantage 0.

The functions are *code*: `module` is imported like any Python module (from the working
directory, the project, or a path to a .py file), as a user's own code is; that is why a
function from inside the data, tokenizer, checkpoint or output folder is refused: nothing in a
data folder is ever executed. Built-in ones: trainer/reward_functions.py.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RewardFunction = Callable[..., list]


@dataclass(frozen=True)
class NamedReward:
    name: str          # for the metrics: rewards/<name>/mean
    function: RewardFunction
    weight: float


def load_reward_functions(specs: str, weights: str, folders_never_imported: Sequence[str | None]
                          ) -> list[NamedReward]:
    """The functions `--reward_fn` names, with their `--reward_weights` (default 1 each).
    ValueError (one line, naming the option) for a bad spec, a module that does not import, a
    name that is not a function, or a module inside one of `folders_never_imported`."""
    names = [spec.strip() for spec in specs.split(",") if spec.strip()]
    if not names:
        raise ValueError("--task_type=grpo needs --reward_fn module:function (e.g. "
                         "trainer.reward_functions:exact_answer; see trainer/rewards.py)")
    weight_values = parse_weights(weights, len(names))
    return [NamedReward(spec.rpartition(":")[2], _load(spec, folders_never_imported), weight)
            for spec, weight in zip(names, weight_values)]


def parse_weights(weights: str, count: int) -> list[float]:
    if not weights.strip():
        return [1.0] * count
    try:
        values = [float(weight) for weight in weights.split(",")]
    except ValueError:
        raise ValueError(f"--reward_weights {weights!r}: expected comma-separated numbers"
                         ) from None
    if len(values) != count or not all(math.isfinite(value) for value in values):
        raise ValueError(f"--reward_weights {weights!r}: give one finite weight per "
                         f"--reward_fn function ({count})")
    return values


def _load(spec: str, folders_never_imported: Sequence[str | None]) -> RewardFunction:
    module_name, colon, function_name = spec.rpartition(":")
    if not colon or not module_name or not function_name.isidentifier():
        raise ValueError(f"--reward_fn {spec!r}: expected module:function, e.g. "
                         "my_rewards:correct or rewards/my_rewards.py:correct")
    origin = _module_origin(module_name)
    if origin is None:
        raise ValueError(f"--reward_fn {spec!r}: no module {module_name!r} (a module on the "
                         "Python path, in the working directory, or a path to a .py file)")
    for folder in filter(None, folders_never_imported):
        if Path(folder).exists() and origin.resolve().is_relative_to(Path(folder).resolve()):
            raise ValueError(f"--reward_fn {spec!r}: {origin} is inside {folder}; code is never "
                             "run from a data, tokenizer, model or run folder: keep reward "
                             "functions with your code")
    try:
        module = _import(module_name, origin)
    except Exception as error:  # the user's module failed to import: say which and why
        raise ValueError(f"--reward_fn {spec!r}: importing {origin} failed: "
                         f"{type(error).__name__}: {error}") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ValueError(f"--reward_fn {spec!r}: {origin} has no function {function_name!r}")
    return function


def _module_origin(module_name: str) -> Path | None:
    """The file a module name or .py path would import from (None: there is none)."""
    if module_name.endswith(".py"):
        path = Path(module_name)
        return path if path.is_file() else None
    if str(Path.cwd()) not in sys.path:  # `python train_my_ddp.py` puts only its own folder
        sys.path.append(str(Path.cwd()))
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec is not None and spec.origin else None


def _import(module_name: str, origin: Path) -> Any:
    if not module_name.endswith(".py"):
        return importlib.import_module(module_name)
    spec = importlib.util.spec_from_file_location(f"z2all_rewards_{origin.stem}", origin)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def score(rewards: Sequence[NamedReward], prompts: list[Any], completions: list[Any],
          columns: dict[str, list[Any]]) -> list[list[float]]:
    """[function][completion] rewards, NaN where a function returned None. A function that
    fails or returns something else than one number (or None) per completion stops the run
    with a message naming it."""
    table = []
    for reward in rewards:
        try:
            values = reward.function(prompts=prompts, completions=completions, **columns)
        except Exception as error:
            raise RuntimeError(f"--reward_fn {reward.name} failed: {type(error).__name__}: "
                               f"{error}") from error
        if not isinstance(values, (list, tuple)) or len(values) != len(completions):
            raise RuntimeError(f"--reward_fn {reward.name} returned {type(values).__name__} "
                               f"of length {len(values) if hasattr(values, '__len__') else '?'}"
                               f"; expected a list of {len(completions)} floats or None")
        try:
            table.append([math.nan if value is None else float(value) for value in values])
        except (TypeError, ValueError):
            raise RuntimeError(f"--reward_fn {reward.name} returned a value that is not a "
                               "number or None") from None
    return table
