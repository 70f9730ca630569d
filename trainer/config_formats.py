"""The trainer's config files in the four formats people already write: `.py` (z2all's own
`exp_config.py`), `.json`, `.yaml`/`.yml` (as litgpt) and `.toml` (as torchtitan).

Each holds options flat (`lr: 3e-4`) or nested by option group (`optimization: {lr: 3e-4}`,
a `[optimization]` table in TOML); both read to the same flat {option: value}. Nothing in a
config file is executed: a `.py` file may hold only `name = <literal>` lines (read with
`ast.literal_eval`), YAML is read with `yaml.safe_load` (no Python objects), JSON and TOML
are data by design.

Two format quirks are smoothed over: PyYAML follows YAML 1.1, where `3e-4` (no dot) is a
string, so the reader here takes it as the float YAML 1.2 says it is; TOML has no null, so an
optional option is cleared with the string "none", as on the command line.
"""

from __future__ import annotations

import ast
import json
import re
import tomllib
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from trainer.command_line import check_name
from trainer.options import GROUPS, OPTION_GROUP, OPTION_TYPES, TrainingOptions

RESOLVED_KEY = "resolved"  # what `auto` options resolved to on a run (not an option)
FORMATS = ("py", "json", "yaml", "toml")
SUFFIX_FORMAT = {".py": "py", ".json": "json", ".yaml": "yaml", ".yml": "yaml", ".toml": "toml"}


class _Yaml12Floats(yaml.SafeLoader):
    """yaml.safe_load, reading `1e-4` as a float (YAML 1.2) rather than a string (1.1)."""


_Yaml12Floats.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
    list("-+0123456789."))


def _read_py(text: str, path: Path) -> dict[str, Any]:
    values = {}
    try:
        body = ast.parse(text, filename=str(path)).body
    except SyntaxError as error:
        raise ValueError(f"{path}:{error.lineno}: invalid Python: {error.msg}") from None
    for node in body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)):
            raise ValueError(f"{path}:{node.lineno}: only `name = value` lines are allowed")
        try:
            values[node.targets[0].id] = ast.literal_eval(node.value)
        except ValueError:
            raise ValueError(f"{path}:{node.lineno}: the value must be a literal") from None
    return values


def _read_json(text: str, path: Path) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}:{error.lineno}: invalid JSON: {error.msg}") from None


def _read_yaml(text: str, path: Path) -> Any:
    try:
        return yaml.load(text, Loader=_Yaml12Floats) or {}  # an empty file: no options
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise ValueError(f"{path}{where}: invalid YAML: "
                         f"{getattr(error, 'problem', None) or error}") from None


def _read_toml(text: str, path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{path}: invalid TOML: {error}") from None


def _flatten(values: dict[str, Any], path: Path) -> dict[str, Any]:
    """Options nested under their group's name joined with the flat ones; an option under
    another group's name, or given twice, is refused."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        inner = value.items() if key in GROUPS and isinstance(value, dict) else [(key, value)]
        for name, item in inner:
            if not isinstance(name, str):  # YAML allows `1: 2` or `[a]: b`
                raise ValueError(f"{path}: option names are text, got the key {name!r}")
            check_name(name, str(path))
            if key in GROUPS and OPTION_GROUP[name] != key:
                raise ValueError(f"{path}: option {name!r} belongs under "
                                 f"{OPTION_GROUP[name]!r}, not {key!r}")
            if name in flat:
                raise ValueError(f"{path}: option {name!r} is given twice")
            flat[name] = item
    return flat


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Flat {option: value} of a config file, names checked (values are checked by the
    caller, against the options' types)."""
    path = Path(path)
    fmt = SUFFIX_FORMAT.get(path.suffix.lower())
    if fmt is None:
        raise ValueError(f"{path}: a config file must be .py, .json, .yaml, .yml or .toml")
    reader = {"py": _read_py, "json": _read_json, "yaml": _read_yaml, "toml": _read_toml}[fmt]
    try:  # utf-8-sig: a leading byte-order mark (some Windows editors write one) is skipped
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text (byte {error.start}): save it as UTF-8"
                         ) from None
    values = reader(text, path)
    if not isinstance(values, dict):
        raise ValueError(f"{path}: expected a mapping of options (flat, or nested under the "
                         f"group names {', '.join(GROUPS)})")
    values.pop(RESOLVED_KEY, None)
    flat = _flatten(values, path)
    if fmt == "toml":  # no null in TOML: "none" clears an optional option
        flat = {name: None if value == "none" and type(None) in
                typing.get_args(OPTION_TYPES[name]) else value for name, value in flat.items()}
    return flat


def _toml_value(value: Any) -> str:
    if value is None:
        return '"none"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)  # 1e-08, inf and nan are TOML too
    return json.dumps(value, ensure_ascii=False)  # a JSON string or list of strings is TOML


def format_config(options: TrainingOptions, fmt: str, doc: str = "",
                  resolved: dict[str, Any] | None = None) -> str:
    """`options` as a config file of format `fmt` that reads back to the same options; `doc`
    heads it (a comment; in .py the docstring), `resolved` is recorded (JSON: a key of its own,
    elsewhere a comment: reading the file back ignores it, so `auto` decides afresh)."""
    if fmt == "json":
        values = {**options.to_dict(), **({RESOLVED_KEY: resolved} if resolved else {})}
        return json.dumps(values, indent=2, ensure_ascii=False) + "\n"
    lines = [f'"""{doc}"""' if fmt == "py" else f"# {doc}"] if doc else []
    if resolved:
        lines.append(f"# {RESOLVED_KEY} on this run: {json.dumps(resolved)}")
    groups = {group: {spec.name: getattr(getattr(options, group), spec.name)
                      for spec in fields(cls)} for group, cls in GROUPS.items()}
    if fmt == "yaml":
        lines.append(yaml.safe_dump(groups, sort_keys=False, allow_unicode=True).rstrip())
    for group, values in groups.items():
        if fmt == "py":
            lines += [f"\n# --- {group}"] + [f"{k} = {v!r}" for k, v in values.items()]
        elif fmt == "toml":
            lines += [f"\n[{group}]"] + [f"{k} = {_toml_value(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"
