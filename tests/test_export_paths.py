"""Every folder a README or docs command writes is git-ignored and removed by `make clean`.

A reader pasting the README's commands must not end up with untracked exports (`hf_model/`)
in `git status`, nor keep them after `make clean`. The paths are taken from the commands
themselves (`--out X`, `--out_dir X`, `--report_dir X`); placeholders (`<run>`, `DIR`,
`$OUT`) and absolute paths are the reader's choice and skipped.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
OUTPUT_OPTION = re.compile(r"--(?:out|out_dir|report_dir)[ =]([^\s`\"',)]+)")


def _written_paths() -> set[str]:
    """The concrete output paths of every command line in README.md and docs/*.md."""
    found = set()
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = page.read_text(encoding="utf-8").replace("\\\n", " ")  # continuation lines
        for line in text.splitlines():
            if "python" not in line and "torchrun" not in line:
                continue
            for path in OUTPUT_OPTION.findall(line):
                placeholder = any(mark in path for mark in "<{$*") or path.isupper()
                if not placeholder and not path.startswith(("/", "~")):
                    found.add(path.rstrip("/"))
    return found


def _prefixes(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:count]) for count in range(1, len(parts) + 1)]


def _git_ignored(path: str) -> bool:
    """Whether a pattern of the repository's .gitignore covers `path` (as git reads an
    anchored `/dir/` or a plain name)."""
    for pattern in (REPO / ".gitignore").read_text().splitlines():
        pattern = pattern.strip()
        if not pattern or pattern.startswith("#"):
            continue
        name = pattern.strip("/")
        if pattern.startswith("/") and any(fnmatch.fnmatchcase(prefix, name)
                                           for prefix in _prefixes(path)):
            return True
        if not pattern.startswith("/") and any(fnmatch.fnmatchcase(part, name)
                                               for part in path.split("/")):
            return True
    return False


def _cleaned(path: str) -> bool:
    """Whether `make clean`'s `rm -rf` removes `path` (or a folder above it)."""
    recipe = (REPO / "Makefile").read_text().split("\nclean:", 1)[1].split("\n\n", 1)[0]
    removed = [word for line in recipe.splitlines() if "rm -rf" in line
               for word in line.split("rm -rf", 1)[1].split()]
    return any(fnmatch.fnmatchcase(prefix, target.rstrip("/"))
               for prefix in _prefixes(path) for target in removed)


def test_the_commands_name_outputs_at_all():
    assert {"hf_model", "out/pre", "data/demo"} <= _written_paths()


@pytest.mark.parametrize("path", sorted(_written_paths()))
def test_every_output_of_a_documented_command_is_ignored_and_cleaned(path):
    assert _git_ignored(path), f"{path}: add it to .gitignore"
    assert _cleaned(path), f"{path}: add it to `make clean`"
