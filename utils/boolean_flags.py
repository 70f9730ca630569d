"""Booleans are spelled the same on every z2all command line:

    --skip_bad_records                 true
    --skip_bad_records true|false      also 1|0, yes|no, any case; `--skip_bad_records=false` too
    --no_skip_bad_records              false (also spelled --no-skip_bad_records)

The trainer parses its own command line with these words (trainer/command_line.py); every
argparse tool declares its flags with `add_boolean_flag`, so a flag copied from a training
command, or from a config, means the same in a data or export tool.
"""

from __future__ import annotations

import argparse
from typing import Any

BOOL_WORDS = ("true", "false", "1", "0", "yes", "no")
TRUE_WORDS = ("true", "1", "yes")
NEGATION_PREFIXES = ("no_", "no-")  # --no_flag, --no-flag


def parse_bool(text: str) -> bool:
    """"true" / "1" / "yes" -> True, "false" / "0" / "no" -> False, any case; else ValueError."""
    if text.lower() not in BOOL_WORDS:
        raise ValueError(f"expects true or false (or 1/0, yes/no), got {text!r}")
    return text.lower() in TRUE_WORDS


def _flag_value(text: str) -> bool:
    """parse_bool for argparse, whose message then is ours (`argument --x: expects ...`)."""
    try:
        return parse_bool(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_boolean_flag(parser: argparse.ArgumentParser | Any, name: str, *, help: str,  # noqa: A002
                     default: bool = False) -> None:
    """`--name [true|false]` and its negations `--no_name` / `--no-name` on `parser` (or an
    argument group of it), all setting `args.name`."""
    dest = name.removeprefix("--")
    parser.add_argument(name, dest=dest, nargs="?", const=True, default=default,
                        type=_flag_value, metavar="true|false",
                        help=f"{help} (default: {str(default).lower()}; --no_{dest} sets false)")
    parser.add_argument(*(f"--{prefix}{dest}" for prefix in NEGATION_PREFIXES), dest=dest,
                        action="store_false", help=argparse.SUPPRESS)
