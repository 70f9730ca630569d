"""An option's name is spelled with underscores or dashes alike on every z2all command line:

    --eval_interval 5   --eval-interval 5   --eval-interval=5
    --no_eval_at_start  --no-eval-at-start  --no-eval_at_start

as torchrun reads `--nproc_per_node` and `--nproc-per-node`, so a name typed from memory of
another tool's habit is not refused. The options are declared (and saved in a run's config)
with underscores only; a dashed spelling is read as that name. The trainer parses its own
command line (trainer/command_line.py) through `underscored`; every argparse tool builds its
parser as an `OptionParser`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

END_OF_OPTIONS = "--"  # after it, everything is a positional (argparse's own convention)


def underscored(name: str) -> str:
    """An option name in its declared spelling: `--eval-interval` -> `--eval_interval`,
    `eval-interval` -> `eval_interval` (leading dashes kept)."""
    bare = name.lstrip("-")
    return name[:len(name) - len(bare)] + bare.replace("-", "_")


class OptionParser(argparse.ArgumentParser):
    """argparse's parser, reading `--a-b` wherever `--a_b` is one of its options."""

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        args = sys.argv[1:] if args is None else list(args)
        return super().parse_known_args(self._declared_spellings(args), namespace)

    def _declared_spellings(self, args: list[str]) -> list[str]:
        """`args` with each dashed long option that this parser declares with underscores
        respelled (`--eval-interval=5` -> `--eval_interval=5`); values, positionals and
        anything after a bare `--` are left alone."""
        spelled = []
        for index, arg in enumerate(args):
            if arg == END_OF_OPTIONS:
                return spelled + args[index:]
            name, equals, value = arg.partition("=")
            declared = underscored(name)
            if (name.startswith("--") and name not in self._option_string_actions
                    and declared in self._option_string_actions):
                arg = declared + equals + value
            spelled.append(arg)
        return spelled
