"""From the command line's strings (and config files' literals) to typed option values, and
`--help`, which is generated from the option groups (trainer/options.py).

    python train_my_ddp.py [config.py|.json|.yaml|.toml] --key=value --key value ...
    python train_my_ddp.py config.yaml --lr 1e-3 --print_config toml   # resolved, as TOML

Every option takes its value as `--key=value` or `--key value` (as HF `TrainingArguments`,
litgpt and torchtitan do). A boolean is `--flag` (true), `--flag true|false` or `--no_flag`
(also spelled `--no-flag`), as in every z2all tool (utils/boolean_flags.py); any name may be
spelled with dashes (`--eval-interval 5`, utils/option_parser.py). The config file is the one
positional argument, also given as `--config FILE` (as litgpt and TRL spell it). An unknown name
suggests the closest ones; the common Hugging Face names (`--learning_rate`, `--output_dir`,
...) are not aliases but point at z2all's own name, so a run's saved config has one spelling
per option.
"""

from __future__ import annotations

import difflib
import json
import types
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal

from trainer.options import GROUPS, OPTION_GROUP, OPTION_TYPES, default_value
from utils.boolean_flags import BOOL_WORDS, NEGATION_PREFIXES, parse_bool
from utils.option_parser import underscored

CONFIG_FILE_OPTION = "config"  # `--config FILE`: the positional config file, by name

# Hugging Face `TrainingArguments` / TRL names -> z2all's option (and what differs).
HF_NAMES: dict[str, tuple[str, str]] = {
    "learning_rate": ("lr", ""),
    "per_device_train_batch_size": ("batch_size", ""),
    "per_device_eval_batch_size": ("batch_size", "evaluation uses the training batch size"),
    "num_train_epochs": ("max_iters", "z2all counts optimizer steps, not epochs"),
    "max_steps": ("max_iters", ""),
    "output_dir": ("out_dir", ""),
    "model_name_or_path": ("init_from", ""),
    "resume_from_checkpoint": ("resume", "it continues the run in --out_dir"),
    "warmup_steps": ("warmup_iters", ""),
    "lr_scheduler_type": ("lr_schedule", ""),
    "max_grad_norm": ("grad_clip", ""),
    "adam_epsilon": ("adam_eps", ""),
    "gradient_checkpointing": ("activation_checkpointing", ""),
    "logging_steps": ("log_interval", ""),
    "save_steps": ("save_interval", ""),
    "eval_steps": ("eval_interval", ""),
    "save_total_limit": ("keep_last", ""),
    "max_seq_length": ("max_seq_len", ""),
    "max_length": ("max_seq_len", ""),
    "bf16": ("dtype", "--dtype bf16"),
    "fp16": ("dtype", "--dtype fp16"),
    "report_to": ("tracker", ""),
    "run_name": ("wandb_run_name", ""),
    "dataloader_num_workers": ("num_workers", ""),
    "beta": ("dpo_beta", ""),
    "lora_r": ("lora_rank", ""),
    "lora_target_modules": ("lora_targets", ""),
    "use_peft": ("lora_rank", "--lora_rank 8 (any rank > 0) trains LoRA adapters"),
    "dataset_name": ("data_dir", "a Hub dataset is --data_dir hf:org/name[:config][@split]"),
    "packing": ("pack_samples", ""),
    "torch_dtype": ("dtype", ""),
    "model_revision": ("revision", ""),
    "tokenizer_name": ("tokenizer_dir", ""),
    "tokenizer_name_or_path": ("tokenizer_dir", ""),
    "eval_on_start": ("eval_at_start", ""),
    "warmup_ratio": ("warmup_iters", "z2all counts warmup in optimizer steps"),
}


def check_name(name: str, source: str) -> None:
    """An error suggesting the closest names when `name` is not an option (for a Hugging Face
    name: z2all's option for it)."""
    if name in OPTION_GROUP:
        return
    if name in HF_NAMES:
        option, note = HF_NAMES[name]
        hint = f"; did you mean --{option}? (z2all's name for HF's --{name}" + \
            (f"; {note})" if note else ")")
    else:
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
            return parse_bool(text)
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


def _negated_flag(name: str) -> str | None:
    """`no_flag` / `no-flag` -> `flag` where that is a boolean option."""
    for prefix in NEGATION_PREFIXES:
        if name.startswith(prefix) and OPTION_TYPES.get(name[len(prefix):]) is bool:
            return name[len(prefix):]
    return None


def _is_a_value_not_a_file(arg: str) -> bool:
    """After a boolean flag, `arg` is meant as its value, not as the config file: a number
    other than 1/0, or a word that is no file (`--eval_at_start -1`, `--compile maybe`)."""
    if arg.startswith("--") or arg.lower() in BOOL_WORDS:
        return False
    try:
        float(arg)
        return True
    except ValueError:
        return "." not in arg and not Path(arg).exists()


def parse_command_line(argv: list[str]) -> tuple[str | None, dict[str, Any]]:
    """`[config_file] --k=v --k v --flag --no_flag ...` -> (config file or None,
    {option: parsed value}). Names may be dashed (`--eval-interval`); `--config FILE` names
    the config file."""
    config_file, overrides = None, {}
    args = list(argv)
    while args:
        arg = args.pop(0)
        name, has_value, text = arg[2:].partition("=")
        name = underscored(name)
        if arg.startswith("--") and name == CONFIG_FILE_OPTION:
            given_next = args and not args[0].startswith("--")
            arg = text if has_value else args.pop(0) if given_next else ""
            if not arg:
                raise ValueError("--config needs a file: --config FILE (or the file alone, "
                                 "as the first argument)")
        if not arg.startswith("--"):
            if config_file is not None:
                raise ValueError(f"only one config file may be given ({config_file!r}, {arg!r})")
            config_file = arg
            continue
        if not has_value and name not in OPTION_GROUP and _negated_flag(name):
            overrides[_negated_flag(name)] = False
            continue
        check_name(name, "command line")
        if not has_value:
            if OPTION_TYPES[name] is bool:  # --flag, or --flag true|false
                if args and _is_a_value_not_a_file(args[0]):
                    raise ValueError(f"--{name}: expects true or false (or the flag alone, "
                                     f"or --no_{name}), got {args[0]!r}")
                text = args.pop(0) if args and args[0].lower() in BOOL_WORDS else "true"
            elif args and not args[0].startswith("--"):
                text = args.pop(0)
            else:
                hint = type_name(OPTION_TYPES[name])
                raise ValueError(f"--{name} needs a value: --{name} <{hint}> or "
                                 f"--{name}=<{hint}>")
        overrides[name] = parse_value(name, text)
    return config_file, overrides


def format_help() -> str:
    lines = ["usage: [torchrun ...] train_my_ddp.py [config.py|.json|.yaml|.toml] "
             "[--option value | --option=value ...]",
             "the config file may also be given as --config FILE; any --option_name may be "
             "spelled --option-name",
             "booleans: --flag, --flag true|false, --no_flag; optionals: --x none",
             "--print_config [yaml|toml|json|py]: print the resolved config and exit",
             "precedence: defaults < config file < command line (on --resume: the run's "
             "saved config.json < explicit options)"]
    for group, cls in GROUPS.items():
        lines.append(f"\n{group} ({cls.__module__}.{cls.__name__}):")
        for spec in fields(cls):
            lines.append(f"  --{spec.name:<28s} {type_name(OPTION_TYPES[spec.name])} = "
                         f"{default_value(spec.name)!r}")
            lines.append(f"      {spec.metadata['help']}")
    return "\n".join(lines)
