"""Put a student's function in the place of the project's, everywhere the project can see it.

`python -m course check NAME` runs the project's own tests for a target such as
`model.kernels:apply_rotary` with the workspace's function in its place. A test reaches the
target by many names: the defining module's attribute, every `from model.kernels import
apply_rotary` bound before the swap, a class attribute for a method, a registry dict. So the swap
is done twice:

1. In this process (`swap_everywhere`): the target's module is imported, and every module of
   `sys.modules` whose namespace holds the original object (or a module-level plain dict
   holding it, a registry) gets the replacement; a method is replaced on every class whose own
   `__dict__` holds it. Imports that run later read the defining module, which already holds
   the replacement. `restore` sweeps the other way, which also reaches the modules first
   imported (binding the replacement) during the check.
2. In child processes (the gloo ranks of `parallel.local_ranks.run_on_ranks`, forked from a
   server that imported only torch): `SPEC_ENV` names a small JSON file `{"target",
   "workspace"}`, and `course/child_site/sitecustomize.py` (on the children's PYTHONPATH)
   installs `SwapFinder`, which swaps the attribute right after the target's module is first
   executed. The file is read at that moment, so one long-lived fork server serves many checks.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import types
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPEC_ENV = "Z2ALL_COURSE_SWAP"
CHILD_SITE = Path(__file__).resolve().parent / "child_site"
REPO = Path(__file__).resolve().parents[1]


def split_target(target: str) -> tuple[str, list[str]]:
    """'pkg.module:Qual.name' -> ('pkg.module', ['Qual', 'name'])."""
    module_name, _, qualname = target.partition(":")
    if not module_name or not qualname:
        raise ValueError(f"target {target!r} is not of the form pkg.module:Qual.name")
    return module_name, qualname.split(".")


def owner_and_name(module: types.ModuleType, parts: list[str]) -> tuple[Any, str]:
    """The object holding the target (its module, or its class for a method) and its name."""
    owner: Any = module
    for part in parts[:-1]:
        owner = getattr(owner, part)
    return owner, parts[-1]


def load_workspace(target: str, workspace: Path) -> Any:
    """The replacement: the workspace file's function of the target's name, wrapped like the
    original (staticmethod/classmethod) and named like it, so pickling by name finds it."""
    module_name, parts = split_target(target)
    owner, name = owner_and_name(importlib.import_module(module_name), parts)
    spec = importlib.util.spec_from_file_location(f"course_workspace_{name.strip('_')}",
                                                  workspace)
    assert spec is not None and spec.loader is not None
    code = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(code)
    function = _unwrapped(getattr(code, name, None))  # written with @staticmethod, or without
    if not callable(function):
        raise ValueError(f"{workspace} defines no function {name}")
    function.__module__, function.__qualname__ = module_name, ".".join(parts)
    raw = owner.__dict__.get(name) if isinstance(owner, type) else None
    if isinstance(raw, (staticmethod, classmethod)):
        return type(raw)(function)
    return function


def _unwrapped(value: Any) -> Any:
    return value.__func__ if isinstance(value, (staticmethod, classmethod)) else value


@dataclass(frozen=True)
class Swap:
    """The project's object (`original`, as its owner holds it) and what took its place."""

    original: Any
    replacement: Any


def _sweep(old: Any, new: Any) -> None:
    """Every module attribute, module-level dict entry and class attribute that is `old`
    (bare, or wrapped in staticmethod/classmethod on a class) becomes `new`."""
    with warnings.catch_warnings():  # reading some modules' attributes warns (deprecations)
        warnings.simplefilter("ignore")
        bare_old, bare_new = _unwrapped(old), _unwrapped(new)
        seen_classes: set[int] = set()
        for module in list(sys.modules.values()):
            namespace = getattr(module, "__dict__", None)
            if not isinstance(namespace, dict):
                continue
            for key, value in list(namespace.items()):
                if value is bare_old or value is old:
                    setattr(module, key, bare_new)
                elif type(value) is dict:  # a registry: {"allreduce": allreduce_hook}
                    # (plain dicts only: other libraries' mapping classes may load on reading,
                    # and fail, as transformers' lazy auto-model maps do once TRL is imported)
                    for item_key, item in list(value.items()):
                        if item is bare_old:
                            value[item_key] = bare_new
                elif isinstance(value, type) and id(value) not in seen_classes:
                    seen_classes.add(id(value))
                    for attr, raw in list(vars(value).items()):
                        if _unwrapped(raw) is bare_old:
                            setattr(value, attr, new)


def _original(target: str) -> Any:
    module_name, parts = split_target(target)
    owner, name = owner_and_name(importlib.import_module(module_name), parts)
    return owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)


def swap_everywhere(target: str, replacement: Any) -> Swap:
    """Replace the target's original object by `replacement` wherever `sys.modules` holds it."""
    swap = Swap(original=_original(target), replacement=replacement)
    _sweep(swap.original, replacement)
    return swap


def restore(swap: Swap) -> None:
    """Put the original back: where the swap put the replacement, and wherever a module
    imported since then bound it."""
    _sweep(swap.replacement, swap.original)


def write_spec(spec_file: Path, target: str | None, workspace: Path | None) -> None:
    """Tell child processes what to swap (or, with target None, nothing)."""
    payload = {} if target is None else {"target": target, "workspace": str(workspace)}
    tmp = spec_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload), encoding="utf-8")
    tmp.replace(spec_file)


def children_swap_through(spec_file: Path) -> None:
    """Make processes started from now on (fork servers included) read `spec_file`."""
    os.environ[SPEC_ENV] = str(spec_file)
    paths = [str(CHILD_SITE), str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(
        os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))


def _current_spec() -> dict[str, str]:
    path = os.environ.get(SPEC_ENV)
    if not path:
        return {}
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


class _SwappingLoader(importlib.abc.Loader):
    """Runs the real loader, then puts the workspace's function in the fresh module."""

    def __init__(self, inner: importlib.abc.Loader, spec: dict[str, str]) -> None:
        self.inner, self.spec = inner, spec

    def create_module(self, module_spec: importlib.machinery.ModuleSpec) -> Any:
        return self.inner.create_module(module_spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.inner.exec_module(module)
        _, parts = split_target(self.spec["target"])
        owner, name = owner_and_name(module, parts)
        setattr(owner, name, load_workspace(self.spec["target"], Path(self.spec["workspace"])))


class SwapFinder(importlib.abc.MetaPathFinder):
    """On the first import of the target's module, hands out a swapping loader."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if not os.environ.get(SPEC_ENV):
            return None
        spec = _current_spec()
        if spec.get("target", "").partition(":")[0] != fullname:
            return None
        found = importlib.machinery.PathFinder.find_spec(fullname, path)
        if found is None or found.loader is None:
            return None
        found.loader = _SwappingLoader(found.loader, spec)
        return found


def install_finder() -> None:
    if not any(isinstance(finder, SwapFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, SwapFinder())
