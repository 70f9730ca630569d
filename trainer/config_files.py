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
from trainer.option_validation import check_options
from trainer.options import (
    FIXED_ON_RESUME,
    GROUPS,
    PER_INVOCATION,
    RESUME_SAFE,
    TrainingOptions,
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
    return options, notes


def _resume_changes(saved: dict[str, Any], explicit: dict[str, Any]) -> list[str]:
    """A note per option changed on --resume (warned about where it breaks bitwise identity);
    a change of the model's shape or the data's sample length cannot be honoured (the
    checkpoint holds that model and that data position) and is refused."""
    fixed = [f"--{name}={value!r} (the run has {saved[name]!r})"
             for name, value in explicit.items()
             if name in FIXED_ON_RESUME and name in saved and saved[name] != value]
    if fixed:
        raise ValueError(f"--resume cannot change {', '.join(fixed)}: the checkpoint holds "
                         "that model and data position; start a new run (--out_dir) instead")
    notes = []
    for name, value in explicit.items():
        if name in saved and saved[name] != value:
            breaks = "" if name in RESUME_SAFE else " (breaks bitwise reproducibility)"
            notes.append(f"resume: {name} changed {saved[name]!r} -> {value!r}{breaks}")
            if breaks:
                warnings.warn(notes[-1], stacklevel=3)
    return notes


def options_from_argv(argv: list[str] | None = None) -> tuple[TrainingOptions, list[str]]:
    """Entry-point helper: prints help and exits on --help; a bad option raises ValueError
    (the entry point's `utils.cli_errors.run_main` prints it in one line, exit code 2)."""
    argv = sys.argv[1:] if argv is None else argv
    if "--help" in argv or "-h" in argv:
        print(format_help())
        raise SystemExit(0)
    return resolve_options(argv)
