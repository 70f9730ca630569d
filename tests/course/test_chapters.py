"""The chapters name only what exists: every `path:function` (with about its stated size),
every `pkg.module:name` and `pkg.module`, every file path and every `python -m` module; their
command blocks parse as the README's do (tests/test_readme_commands.py's checks: `bash -n`, and
each command stopped right after its own parser accepted it); and every exercise is given in
its chapter's Build section. (The chapters' commands were run by hand on the demo data; running
them in order belongs with the README's run test.)"""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

from course.exercises import EXERCISES
from course.reading import names_in, size_of
from course.swap import REPO
from tests.test_readme_commands import SHELL_LANGUAGES, check_command, commands_of, fenced_blocks

CHAPTERS = sorted((REPO / "course" / "chapters").glob("*.md"))
PACKAGES = {path.parent.name for path in REPO.glob("*/__init__.py")}
MODULE_NAME = re.compile(r"`((?:[a-z_]+\.)+[a-z_]+)(?::([\w.]+))?`")
FILE_PATH = re.compile(r"`([\w./-]+\.(?:py|md))`")
RUN_MODULE = re.compile(r"python -m ([\w.]+)")


def defines(module_file: Path, qualname: str) -> bool:
    body = ast.parse(module_file.read_text(encoding="utf-8")).body
    for part in qualname.split("."):
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef))
                     and n.name == part), None)
        if node is None:
            names = {t.id for n in body if isinstance(n, (ast.Assign, ast.AnnAssign))
                     for t in ast.walk(n) if isinstance(t, ast.Name)}
            return part in names and part == qualname.split(".")[-1]
        body = node.body
    return True


def module_file(module: str) -> Path | None:
    if module.split(".")[0] not in PACKAGES:
        return None
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:  # a parent is a module, not a package
        return None
    return Path(spec.origin) if spec and spec.origin else None


def test_chapters_are_numbered_in_order():
    assert [path.name[:2] for path in CHAPTERS] == [f"{n:02d}" for n in range(16)]


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda path: path.stem)
def test_every_name_a_chapter_gives_exists(chapter):
    text = chapter.read_text(encoding="utf-8")
    problems = []
    for path, qualname, stated in names_in(chapter):
        try:
            actual = size_of(path, qualname)
        except (LookupError, OSError) as error:
            problems.append(f"{path}:{qualname}: {error}")
            continue
        if stated is not None and abs(actual - stated) > max(5, 0.3 * actual):
            problems.append(f"{path}:{qualname} is {actual} lines, the chapter says {stated}: "
                            f"run python -m course.reading")
    for module, qualname in MODULE_NAME.findall(text):
        if module.split(".")[0] not in PACKAGES:
            continue  # e.g. a file name like `X.bin`
        found = module_file(module)
        if found is None:
            parent, _, attr = module.rpartition(".")  # `pkg.module.name`
            found, qualname = module_file(parent), qualname or attr
        if found is None or (qualname and not defines(found, qualname)):
            problems.append(f"{module}:{qualname}")
    problems += [path for path in FILE_PATH.findall(text) if not (REPO / path).exists()]
    problems += [module for module in RUN_MODULE.findall(text) if module_file(module) is None]
    assert not problems, f"{chapter.name} names what does not exist:\n" + "\n".join(problems)


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda exercise: exercise.name)
def test_every_exercise_is_in_its_chapters_build_section(exercise):
    chapter = next(path for path in CHAPTERS if path.name.startswith(f"{exercise.chapter:02d}"))
    build = chapter.read_text(encoding="utf-8").split("**Build")[-1]
    assert f"`{exercise.name}`" in build and f"`{exercise.target}`" in build


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda path: path.stem)
def test_every_command_of_a_chapter_parses(chapter, monkeypatch):
    for language, start, lines in fenced_blocks(chapter.read_text(encoding="utf-8"), chapter.name):
        if language not in SHELL_LANGUAGES:
            continue
        syntax = subprocess.run(["bash", "-n"], input="\n".join(lines), capture_output=True,
                                text=True)
        assert syntax.returncode == 0, f"{chapter.name}:{start}: {syntax.stderr}"
        for command in commands_of(lines):
            check_command(command.argv, monkeypatch)
