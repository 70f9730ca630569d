"""A run's options from defaults, a config file, the command line and (on --resume) the run's
own saved config; and the two files a run saves them to.

Precedence, lowest first: defaults < config file < command line. With `--resume`, the run's
saved `config.json` takes the place of the defaults (less `resume` and `stop_at_iter`, which
describe one invocation), so a resumed run continues with what it was started with, plus
whatever you pass explicitly (changes that break bitwise reproducibility are warned about).
The grid's shape (--tensor_parallel, --pipeline_parallel, --context_parallel,
--sequence_parallel) is inherited only whole: passing any of them resets the others to
their defaults (`_whole_grid`).
The config file may be `.py`, `.json`, `.yaml`/`.yml` or `.toml` (trainer/config_formats.py),
and `--print_config [py|json|yaml|toml]` prints the resolved options in that format and exits
(a file you can start from). A run saves the resolved options twice: `config.json`
(machine-readable) and `exp_config.py` (one `name = value` per line, accepted back as the
config file). Both hold the per-invocation options (`resume`, `stop_at_iter`, `overwrite`) at
their defaults: they describe how the run was last invoked, not the run, and a resumed run's
`exp_config.py` reused as a new run's config must not say `resume = True`.
A Hub id given for `--init_from` / `--tokenizer_dir` is saved as its snapshot directory in the
HF cache (utils/hub.py), which names the commit. Both files also
record what an `auto` option resolved to on this run (config.json's "resolved" entry, a
comment in exp_config.py); reading the file back ignores it, so `auto` decides afresh.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

from trainer.command_line import check_value, format_help, parse_command_line
from trainer.config_formats import FORMATS, format_config, read_config_file
from trainer.distributed_env import is_main_process
from trainer.option_validation import check_options
from trainer.options import (
    FIXED_ON_LORA_RESUME,
    FIXED_ON_RESUME,
    GRID_SHAPE,
    PATH_OPTIONS,
    PER_INVOCATION,
    RESUME_SAFE,
    TrainingOptions,
    default_value,
)
from utils.atomic_io import atomic_write_text
from utils.hub import local_dir, snapshot_of
from utils.option_checks import raise_problems
from utils.option_parser import underscored
from utils.run_ownership import foreign_dir_problem

HUB_OPTIONS = ("init_from", "tokenizer_dir")  # may name a Hugging Face Hub id (utils/hub.py)


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Options from a config file (trainer/config_formats.py: .py, .json, .yaml/.yml or
    .toml, flat or nested by group), each checked against its option's type."""
    values = read_config_file(path)
    return {name: check_value(name, value, str(path)) for name, value in values.items()}


def save_config(options: TrainingOptions, run_dir: str | Path,
                resolved: dict[str, Any] | None = None) -> None:
    """Write `config.json` and `exp_config.py` (both atomic) into the run dir; `resolved`
    (what `auto` options became on this run, e.g. the measured precision) is recorded too,
    with the Hub id and commit of each Hub option that names a snapshot ("hub").
    The per-invocation options are written at their defaults (see the module docstring)."""
    run_dir = Path(run_dir)
    values = options.to_dict()
    hub = {name: found for name in HUB_OPTIONS if (found := snapshot_of(values[name]))}
    resolved = {**(resolved or {}), **({"hub": hub} if hub else {})} or None
    options = TrainingOptions.from_dict(
        {**values, **{name: default_value(name) for name in PER_INVOCATION}})
    atomic_write_text(run_dir / "config.json", format_config(options, "json", resolved=resolved))
    atomic_write_text(run_dir / "exp_config.py", format_config(
        options, "py", "Resolved config of this run: python train_my_ddp.py exp_config.py "
        "[--k=v ...]", resolved))


def resolve_options(argv: list[str]) -> tuple[TrainingOptions, list[str]]:
    """The run's options from the command line (see the module docstring for precedence),
    validated; and human-readable notes (resume changes) for the log."""
    config_file, overrides = parse_command_line(argv)
    explicit = load_config_file(config_file) if config_file else {}
    explicit.update(overrides)
    for name in HUB_OPTIONS:  # a Hub id -> its snapshot dir, whose name is the commit
        if explicit.get(name):
            explicit[name] = local_dir(explicit[name], f"--{name}", explicit.get("revision"))
    merged, notes = explicit, []
    if explicit.get("resume", default_value("resume")):
        out_dir = explicit.get("out_dir", default_value("out_dir"))
        saved_path = Path(out_dir) / "config.json"
        # what is not a run's is not read either (utils/run_ownership.py)
        raise_problems([foreign_dir_problem(saved_path.parent, f"--out_dir={out_dir}")])
        if not saved_path.is_file():
            raise ValueError(f"--resume: {out_dir} holds no run to continue (no "
                             "config.json): drop --resume to start one there")
        saved = {k: v for k, v in load_config_file(saved_path).items()
                 if k not in PER_INVOCATION}
        explicit = _whole_grid(explicit)
        merged = {**TrainingOptions.from_dict(saved).to_dict(), **explicit}
        notes = _resume_changes(saved, explicit)
    options = TrainingOptions.from_dict(merged)
    check_options(options)
    _warn_ignored_lora_options(explicit, options)
    return options, notes


def _whole_grid(explicit: dict[str, Any]) -> dict[str, Any]:
    """`explicit` with the grid's shape (GRID_SHAPE) completed from the defaults when any part
    of it is given. A resumed run inherits the saved grid only whole: the world size comes
    from the launcher, so a saved --tensor_parallel=2 kept under a new --pipeline_parallel=2
    on the same 4 ranks would make TP2 x PP2 with one data-parallel replica instead of the
    DP2 x PP2 asked for, silently halving the global batch. The completed options are
    changes like any other (warned by `_resume_changes`)."""
    if not any(name in explicit for name in GRID_SHAPE):
        return explicit
    return {**{name: default_value(name) for name in GRID_SHAPE}, **explicit}


def _resume_changes(saved: dict[str, Any], explicit: dict[str, Any]) -> list[str]:
    """A note per option changed on --resume, or a warning where the change breaks bitwise
    identity (said once, by rank 0); another Hub snapshot of the model or tokenizer, a change
    of the model's shape, the data's sample length or a LoRA run's base cannot be honoured
    (the checkpoint holds that model and that data position) and is refused."""
    changed = {name: value for name, value in explicit.items()
               if name in saved and not _same_value(name, saved[name], value)}
    _check_same_snapshots(saved, explicit)
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


def _check_same_snapshots(saved: dict[str, Any], explicit: dict[str, Any]) -> None:
    """A resumed run refuses a Hub model or tokenizer other than the snapshot it started from
    (the id's branch may have moved on since)."""
    for name in HUB_OPTIONS:
        was, now = snapshot_of(saved.get(name)), snapshot_of(explicit.get(name))
        if was and now and was != now:
            raise ValueError(
                f"--resume: --{name} {now['id']} is snapshot {now['snapshot']}, but the run "
                f"started from {was['id']} snapshot {was['snapshot']}: add --revision "
                f"{was['snapshot']} (or leave --{name} out) to continue it")


def _warn_ignored_lora_options(explicit: dict[str, Any], options: TrainingOptions) -> None:
    """--lora_alpha & co. do nothing with --lora_rank=0 (LoRA off): said once, not silently
    dropped (a value equal to the default is what every saved config lists, so not said)."""
    ignored = [f"--{name}={value!r}" for name, value in explicit.items()
               if name.startswith("lora_") and name != "lora_rank"
               and value != default_value(name)]
    if ignored and options.lora.lora_rank == 0 and is_main_process():
        warnings.warn(f"{', '.join(ignored)} ignored: --lora_rank=0 means LoRA off (set "
                      "--lora_rank to train adapters)", stacklevel=3)


def _print_config_request(argv: list[str]) -> tuple[str | None, list[str]]:
    """(the format `--print_config [FMT]` / `--print_config=FMT` asks for, or None; the other
    arguments). Bare `--print_config` is YAML, as in litgpt / jsonargparse."""
    for i, arg in enumerate(argv):
        name, has_value, fmt = arg.partition("=")
        if underscored(name) != "--print_config":
            continue
        rest = argv[:i] + argv[i + 1:]
        if not has_value:
            fmt = "yaml"
            if i + 1 < len(argv) and argv[i + 1] in FORMATS:
                fmt, rest = argv[i + 1], argv[:i] + argv[i + 2:]
        if fmt not in FORMATS:
            raise ValueError(f"--print_config={fmt}: expects {' | '.join(FORMATS)}")
        return fmt, rest
    return None, argv


def options_from_argv(argv: list[str] | None = None) -> tuple[TrainingOptions, list[str]]:
    """Entry-point helper: prints help and exits on --help, prints the resolved config and
    exits on --print_config; a bad option raises ValueError (the entry point's
    `utils.cli_errors.run_main` prints it in one line, exit code 2)."""
    argv = sys.argv[1:] if argv is None else argv
    if "--help" in argv or "-h" in argv:
        print(format_help())
        raise SystemExit(0)
    print_format, argv = _print_config_request(argv)
    options, notes = resolve_options(argv)
    if print_format is not None:
        print(format_config(options, print_format), end="")
        raise SystemExit(0)
    return options, notes
