"""A run's options from defaults, a config file, the command line and (on --resume) the run's
own saved config; and the two files a run saves them to.

Precedence, lowest first: defaults < config file < command line. With `--resume`, the run's
saved `config.json` takes the place of the defaults (less `resume` and `stop_at_iter`, which
describe one invocation), so a resumed run continues with what it was started with, plus
whatever you pass explicitly (changes that break bitwise reproducibility are warned about).
A run saves the resolved options twice: `config.json` (machine-readable) and
`exp_config.py` (one `name = value` per line, accepted back as the config file). Both also
record what an `auto` option resolved to on this run (config.json's "resolved" entry, a
comment in exp_config.py); reading the file back ignores it, so `auto` decides afresh.
"""

from __future__ import annotations

import ast
import json
import sys
import warnings
from dataclasses import fields
from pathlib import Path
from typing import Any

from trainer.command_line import check_value, format_help, parse_command_line
from trainer.distributed_env import is_main_process
from trainer.option_validation import check_options
from trainer.options import (
    FIXED_ON_LORA_RESUME,
    FIXED_ON_RESUME,
    GROUPS,
    PATH_OPTIONS,
    PER_INVOCATION,
    RESUME_SAFE,
    TrainingOptions,
    default_value,
)
from utils.atomic_io import atomic_write_json, atomic_write_text

RESOLVED_KEY = "resolved"  # config.json: what `auto` options resolved to (not an option)


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Options from a `config.json` or an `exp_config.py` (only `name = <literal>` lines),
    each checked against its option's type."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        try:
            values = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{error.lineno}: invalid JSON: {error.msg}") from None
        if not isinstance(values, dict):
            raise ValueError(f"{path}: expected a JSON object of options")
        values.pop(RESOLVED_KEY, None)
    elif path.suffix == ".py":
        values = {}
        for node in ast.parse(text, filename=str(path)).body:
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue  # the docstring
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name)):
                raise ValueError(f"{path}:{node.lineno}: only `name = value` lines are allowed")
            try:
                values[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                raise ValueError(f"{path}:{node.lineno}: the value must be a literal") from None
    else:
        raise ValueError(f"{path}: a config file must be .py or .json")
    return {name: check_value(name, value, str(path)) for name, value in values.items()}


def save_config(options: TrainingOptions, run_dir: str | Path,
                resolved: dict[str, Any] | None = None) -> None:
    """Write `config.json` and `exp_config.py` (both atomic) into the run dir; `resolved`
    (what `auto` options became on this run, e.g. the measured precision) is recorded too."""
    run_dir = Path(run_dir)
    atomic_write_json(run_dir / "config.json",
                      {**options.to_dict(), **({RESOLVED_KEY: resolved} if resolved else {})})
    lines = ['"""Resolved config of this run: python train_my_ddp.py exp_config.py [--k=v ...]"""']
    if resolved:
        lines.append(f"# {RESOLVED_KEY} on this run: {json.dumps(resolved)}")
    for group, cls in GROUPS.items():
        values = getattr(options, group)
        lines.append(f"\n# --- {group}")
        lines += [f"{spec.name} = {getattr(values, spec.name)!r}" for spec in fields(cls)]
    atomic_write_text(run_dir / "exp_config.py", "\n".join(lines) + "\n")


def resolve_options(argv: list[str]) -> tuple[TrainingOptions, list[str]]:
    """The run's options from the command line (see the module docstring for precedence),
    validated; and human-readable notes (resume changes) for the log."""
    config_file, overrides = parse_command_line(argv)
    explicit = load_config_file(config_file) if config_file else {}
    explicit.update(overrides)
    merged = TrainingOptions.from_dict(explicit).to_dict()
    notes: list[str] = []
    saved_path = Path(merged["out_dir"]) / "config.json"
    if merged["resume"]:
        if not saved_path.is_file():
            raise ValueError(f"--resume: {merged['out_dir']} holds no run to continue (no "
                             "config.json): drop --resume to start one there")
        saved = {k: v for k, v in load_config_file(saved_path).items()
                 if k not in PER_INVOCATION}
        merged = {**TrainingOptions.from_dict(saved).to_dict(), **explicit}
        notes = _resume_changes(saved, explicit)
    options = TrainingOptions.from_dict(merged)
    check_options(options)
    _warn_ignored_lora_options(explicit, options)
    return options, notes


def _resume_changes(saved: dict[str, Any], explicit: dict[str, Any]) -> list[str]:
    """A note per option changed on --resume, or a warning where the change breaks bitwise
    identity (said once, by rank 0); a change of the model's shape, the data's sample length
    or a LoRA run's base cannot be honoured (the checkpoint holds that model and that data
    position) and is refused."""
    changed = {name: value for name, value in explicit.items()
               if name in saved and not _same_value(name, saved[name], value)}
    fixed_names = FIXED_ON_LORA_RESUME if saved.get("lora_rank") else FIXED_ON_RESUME
    fixed = [f"--{name}={value!r} (the run has {saved[name]!r})"
             for name, value in changed.items() if name in fixed_names]
    if fixed:
        raise ValueError(f"--resume cannot change {', '.join(fixed)}: the checkpoint holds "
                         "that model and data position; start a new run (--out_dir) instead")
    notes = []
    for name, value in changed.items():
        line = f"resume: {name} changed {saved[name]!r} -> {value!r}"
        if name in RESUME_SAFE:
            notes.append(line)
        elif is_main_process():
            warnings.warn(f"{line} (breaks bitwise reproducibility)", stacklevel=3)
    return notes


def _same_value(name: str, saved: Any, value: Any) -> bool:
    """A path is the same where it names the same place: the run records its tokenizer_dir
    absolute, and a command line may give it relative."""
    if name in PATH_OPTIONS and saved is not None and value is not None:
        return Path(saved).resolve() == Path(value).resolve()
    return saved == value


def _warn_ignored_lora_options(explicit: dict[str, Any], options: TrainingOptions) -> None:
    """--lora_alpha & co. do nothing with --lora_rank=0 (LoRA off): said once, not silently
    dropped (a value equal to the default is what every saved config lists, so not said)."""
    ignored = [f"--{name}={value!r}" for name, value in explicit.items()
               if name.startswith("lora_") and name != "lora_rank"
               and value != default_value(name)]
    if ignored and options.lora.lora_rank == 0 and is_main_process():
        warnings.warn(f"{', '.join(ignored)} ignored: --lora_rank=0 means LoRA off (set "
                      "--lora_rank to train adapters)", stacklevel=3)


def options_from_argv(argv: list[str] | None = None) -> tuple[TrainingOptions, list[str]]:
    """Entry-point helper: prints help and exits on --help; a bad option raises ValueError
    (the entry point's `utils.cli_errors.run_main` prints it in one line, exit code 2)."""
    argv = sys.argv[1:] if argv is None else argv
    if "--help" in argv or "-h" in argv:
        print(format_help())
        raise SystemExit(0)
    return resolve_options(argv)
