"""The `path:function` names a chapter gives, found in the code: `size_of` measures one (its
lines, decorators and docstring included), `names_in` lists those a chapter's text gives.

    `model/kernels.py:apply_rotary` (19 lines)     a function, a class, or Class.method

The course's test checks that every name a chapter gives exists and that its stated size is
still about right (chapters name functions, never line numbers, so edits rarely stale them);
`python -m course.reading` restates every chapter's sizes after the code changed.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from course.swap import REPO

NAME = re.compile(r"`([\w./]+\.py):([\w.]+)`(?:(\s+)\((\d+) lines?\))?")


def size_of(path: str, qualname: str) -> int:
    """Lines of the definition `qualname` in the file `path` (relative to the repository)."""
    body = ast.parse((REPO / path).read_text(encoding="utf-8")).body
    node: ast.AST | None = None
    for part in qualname.split("."):
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                       ast.ClassDef)) and n.name == part), None)
        if node is None:
            raise LookupError(f"{path} has no {qualname}")
        body = node.body
    assert node is not None
    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
    return node.end_lineno - start + 1


def names_in(chapter: Path) -> list[tuple[str, str, int | None]]:
    """(path, qualname, stated size or None) of every `path:name` the chapter gives."""
    return [(path, qualname, int(size) if size else None)
            for path, qualname, _, size in NAME.findall(chapter.read_text(encoding="utf-8"))]


def with_sizes(text: str) -> str:
    """`text` with every `path:name` (N lines) restated with its measured size."""
    def measured(match: re.Match) -> str:
        path, qualname, space, size = match.groups()
        if size is None:
            return match.group(0)
        return f"`{path}:{qualname}`{space}({size_of(path, qualname)} lines)"
    return NAME.sub(measured, text)


if __name__ == "__main__":  # python -m course.reading: restate every chapter's sizes
    for chapter in sorted((REPO / "course" / "chapters").glob("*.md")):
        chapter.write_text(with_sizes(chapter.read_text(encoding="utf-8")), encoding="utf-8")
