"""The code stays readable: no function anywhere outside tests/ longer than ~100 lines, no
class in the entry points (train_my_ddp.py, trainer/, monitor_process.py, monitor/) either,
and the training loop one screen (the front door reads as parse -> build -> loop -> close)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import subprocess
from pathlib import Path

import train_my_ddp
from trainer import loop_actions
from trainer.setup import Reporting, Run, RunPlace, Stepping

REPO = Path(__file__).resolve().parents[2]
LIMIT = 100
LOOP_LIMIT = 90


def _definitions(path: Path) -> list[tuple[str, int]]:
    """(qualified name, body lines) of every function and class, nested ones included."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                found.append((name, child.end_lineno - child.lineno + 1))
                visit(child, name + ".")

    visit(ast.parse(path.read_text(encoding="utf-8")), "")
    return found


def _functions(path: Path) -> list[tuple[str, int]]:
    """(name, lines) of every function and method, nested ones included."""
    return [(node.name, node.end_lineno - node.lineno + 1)
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_no_function_of_any_package_is_longer_than_about_a_hundred_lines():
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True,
                            text=True, check=True).stdout.split()
    paths = [REPO / name for name in listed if not name.startswith("tests/")]
    assert len(paths) > 100 and REPO / "server" / "app.py" in paths  # every package is seen
    too_long = [f"{path.relative_to(REPO)}:{name} ({lines} lines)" for path in paths
                if path.exists() for name, lines in _functions(path) if lines > LIMIT]
    assert not too_long, too_long


def test_no_class_of_the_entry_points_is_longer_than_about_a_hundred_lines():
    paths = [REPO / "train_my_ddp.py", REPO / "monitor_process.py",
             *sorted((REPO / "trainer").glob("*.py")), *sorted((REPO / "monitor").glob("*.py"))]
    too_long = [f"{path.name}:{name} ({lines} lines)" for path in paths
                for name, lines in _definitions(path) if lines > LIMIT]
    assert not too_long, too_long


def test_the_training_loop_is_one_screen():
    lengths = dict(_definitions(REPO / "train_my_ddp.py"))
    assert lengths["train"] + lengths["train_step"] <= LOOP_LIMIT, lengths


def test_a_run_is_a_few_small_typed_parts_and_the_loop_actions_take_what_they_use():
    """`Run` is three parts (where it is, what the loop steps, what it reports), none of them a
    grab bag; the actions that need one or two parts take those, not the whole run."""
    assert [field.name for field in dataclasses.fields(Run)] == ["place", "steps", "report"]
    assert all(len(dataclasses.fields(part)) <= 8 for part in (RunPlace, Stepping, Reporting))
    for action in (loop_actions.evaluate, loop_actions.finish, loop_actions.is_diverged,
                   train_my_ddp.train_step):
        assert "run" not in inspect.signature(action).parameters, action.__name__
