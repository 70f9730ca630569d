"""From the command line's strings (and config files' literals) to typed option values, and
`--help`, which is generated from the option groups (trainer/options.py).

    python train_my_ddp.py [exp_config.py | config.json] --key=value --flag --flag=false ...
"""

from __future__ import annotations

import difflib
import json
import types
import typing
from dataclasses import fields
from typing import Any, Literal

from trainer.options import GROUPS, OPTION_GROUP, OPTION_TYPES, default_value


def check_name(name: str, source: str) -> None:
    """An error suggesting the closest names when `name` is not an option."""
    if name in OPTION_GROUP:
        return
    close = difflib.get_close_matches(name, OPTION_GROUP, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join('--' + c for c in close)}?" if close else ""
    raise ValueError(f"{source}: unknown option {name!r}{hint} (--help lists all options)")


def type_name(hint: Any) -> str:
    if typing.get_origin(hint) is Literal:
        return " | ".join(map(str, typing.get_args(hint)))
    return str(hint).replace("typing.", "") if not isinstance(hint, type) else hint.__name__


def _split_optional(hint: Any) -> tuple[Any, bool]:
    """`int | None` -> (int, True); `int` -> (int, False)."""
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) and type(None) in args:
        return next(a for a in args if a is not type(None)), True
    return hint, False


def _matches(base: Any, value: Any) -> bool:
    origin = typing.get_origin(base)
    if origin is Literal:
        return value in typing.get_args(base)
    if origin is list:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if base is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):  # bool is an int subclass; True is not a learning rate
        return False
    return isinstance(value, (int, float)) if base is float else isinstance(value, base)


def check_value(name: str, value: Any, source: str) -> Any:
    """`value` (from JSON / a .py file) checked against the option's type (int -> float ok)."""
    check_name(name, source)
    base, optional = _split_optional(OPTION_TYPES[name])
    if value is None and optional:
        return None
    if not _matches(base, value):
        raise ValueError(
            f"{source}: option {name!r} expects {type_name(OPTION_TYPES[name])}, got {value!r}")
    return float(value) if base is float else value


def parse_value(name: str, text: str) -> Any:
    """A command-line string -> the option's type (`--x=none` clears an optional)."""
    hint = OPTION_TYPES[name]
    base, optional = _split_optional(hint)
    if optional and text.lower() in ("none", "null", ""):
        return None
    try:
        if base is bool:
            if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return text.lower() in ("true", "1", "yes")
        if base is int:
            return int(float(text)) if "e" in text.lower() and float(text).is_integer() \
                else int(text)
        if base is float:
            return float(text)
        if typing.get_origin(base) is list:
            value = json.loads(text) if text.startswith("[") else [text]
            return check_value(name, value, "--" + name)
        if typing.get_origin(base) is Literal:
            return check_value(name, text, "--" + name)
        return text
    except ValueError as error:
        if str(error).startswith("--"):
            raise
        raise ValueError(f"--{name}: expects {type_name(hint)}, got {text!r}") from None


def parse_command_line(argv: list[str]) -> tuple[str | None, dict[str, Any]]:
    """`[config_file] --k=v --flag ...` -> (config file or None, {option: parsed value})."""
    config_file, overrides = None, {}
    for arg in argv:
        if not arg.startswith("--"):
            if config_file is not None:
                raise ValueError(f"only one config file may be given ({config_file!r}, {arg!r})")
            config_file = arg
            continue
        name, has_value, text = arg[2:].partition("=")
        check_name(name, "command line")
        if not has_value:
            if OPTION_TYPES[name] is not bool:
                raise ValueError(f"--{name} needs a value: "
                                 f"--{name}=<{type_name(OPTION_TYPES[name])}>")
            text = "true"
        overrides[name] = parse_value(name, text)
    return config_file, overrides


def format_help() -> str:
    lines = ["usage: [torchrun ...] train_my_ddp.py [config.py|config.json] [--option=value ...]",
             "booleans: --flag or --flag=true|false; optionals: --x=none",
             "precedence: defaults < config file < command line (on --resume: the run's "
             "saved config.json < explicit options)"]
    for group, cls in GROUPS.items():
        lines.append(f"\n{group} ({cls.__module__}.{cls.__name__}):")
        for spec in fields(cls):
            lines.append(f"  --{spec.name:<28s} {type_name(OPTION_TYPES[spec.name])} = "
                         f"{default_value(spec.name)!r}")
            lines.append(f"      {spec.metadata['help']}")
    return "\n".join(lines)
