"""`python -m course list | start | check | solution`: the exercises from the command line.

    python -m course list [--json]        the exercises, by chapter (--json: name, chapter,
                                          target, workspace, mistakes)
    python -m course start NAME [--force] write course/work/NAME.py: the target's imports,
                                          signature and docstring, `raise NotImplementedError`
    python -m course check NAME           run the project's tests for the target with
                                          course/work/NAME.py's function in its place
    python -m course solution NAME        print the project's own function

`check` exits 0 when every test passes, 1 when one fails (it prints the first failing
assertion and the exercise's common mistakes), 2 for bad input (no such exercise, no
workspace yet).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from course.checking import run_check
from course.exercises import BY_NAME, EXERCISES, Exercise
from course.swap import REPO, split_target
from course.workspace import function_source, stub_source
from utils.atomic_io import atomic_write_text
from utils.cli_errors import run_main
from utils.option_parser import OptionParser

CHAPTERS = REPO / "course" / "chapters"


def _relative(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def chapter_file(chapter: int) -> Path:
    return next(CHAPTERS.glob(f"{chapter:02d}_*.md"))


def exercise_named(name: str) -> Exercise:
    if name not in BY_NAME:
        raise ValueError(f"no exercise {name!r}: `python -m course list` shows the "
                         f"{len(EXERCISES)} there are")
    return BY_NAME[name]


def header(exercise: Exercise) -> str:
    module_name, parts = split_target(exercise.target)
    method = (f"\nA method of `{module_name}.{parts[0]}`, written here as a function taking "
              f"`self`;\nthe class's docstring and fields say what `self` holds."
              if len(parts) > 1 else "")
    return (f'"""Exercise {exercise.name} (chapter {exercise.chapter}, '
            f'{_relative(chapter_file(exercise.chapter))}):\nwrite `{exercise.target}` again.'
            f'{method}\n\nCheck it:           python -m course check {exercise.name}\n'
            f'The project\'s own: python -m course solution {exercise.name}\n"""')


def listing(as_json: bool) -> str:
    rows = [{"name": e.name, "chapter": e.chapter, "target": e.target,
             "workspace": _relative(e.workspace),
             "mistakes": [_relative(m.path) for m in e.mistake_files()]} for e in EXERCISES]
    if as_json:
        return json.dumps(rows, indent=1)
    lines = []
    for exercise in EXERCISES:
        started = "started" if exercise.workspace.exists() else ""
        lines.append(f"{exercise.chapter:>2}  {exercise.name:<20} {exercise.target}  {started}"
                     .rstrip())
    return "\n".join(lines)


def start(exercise: Exercise, force: bool) -> str:
    if exercise.workspace.exists() and not force:
        raise ValueError(f"{_relative(exercise.workspace)} is already started: check it with "
                         f"`python -m course check {exercise.name}`, or pass --force to "
                         f"start again from the stub (your version is lost)")
    exercise.workspace.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(exercise.workspace, stub_source(exercise.target, header(exercise)))
    return (f"wrote {_relative(exercise.workspace)}: write the function there, then run "
            f"`python -m course check {exercise.name}`")


def check(exercise: Exercise, verbose: bool, workspace: Path | None = None
          ) -> tuple[int, str]:
    """(exit code, report) of the exercise's tests run on `workspace` (default: the student's
    course/work/NAME.py)."""
    workspace = workspace or exercise.workspace
    if not workspace.exists():
        raise FileNotFoundError(f"{_relative(workspace)} does not exist: run "
                                f"`python -m course start {exercise.name}` first")
    result = run_check(exercise, workspace)
    if result.passed:
        return 0, (f"passed: {len(exercise.tests)} reference test selection(s) of "
                   f"{exercise.target} pass with your function")
    lines = [f"failed: {result.failed_test}", f"  {result.message.strip()}", "",
             "hint: the common mistakes of this exercise:"]
    lines += [f"  - {m.title}: {m.hint}" for m in exercise.mistake_files()]
    if verbose:
        lines += ["", result.output]
    return 1, "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = OptionParser(prog="python -m course", description=__doc__,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    listed = commands.add_parser("list", help="the exercises, by chapter")
    listed.add_argument("--json", action="store_true", help="one JSON list of the exercises")
    started = commands.add_parser("start", help="write the workspace course/work/NAME.py")
    started.add_argument("name")
    started.add_argument("--force", action="store_true", help="overwrite a started workspace")
    checked = commands.add_parser("check", help="run the project's tests on your function")
    checked.add_argument("name")
    checked.add_argument("--verbose", action="store_true", help="also pytest's whole report")
    solution = commands.add_parser("solution", help="print the project's function")
    solution.add_argument("name")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "list":
        print(listing(args.json))
        return 0
    exercise = exercise_named(args.name)
    if args.command == "start":
        print(start(exercise, args.force))
        return 0
    if args.command == "solution":
        print(function_source(exercise.target), end="")
        return 0
    code, report = check(exercise, args.verbose)
    print(report)
    return code


def entry() -> int:
    return run_main(main)
