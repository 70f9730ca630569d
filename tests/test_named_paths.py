"""Every file, `file.py:function` and `package.module.name` that the prose names exists.

Docstrings and comments (read with `ast` and `tokenize`), README.md, docs/*.md and course/
send a reader to `trainer/config_files.py`, to `model/rope.py:apply_rotary_emb` or to
`trainer.global_batch`; a file renamed or a function moved leaves such a pointer dangling, and
nothing else would notice. A path is found when it exists from the repository root, from the
naming file's folder or one above it (`cleaning/dedup.py` inside data_preprocess/), or as the
tail of a project file's path (`tensor_parallel/sharding.py`). Paths in upstream projects we cite
(Megatron, PyTorch) and example names of a user's own files are listed in NOT_OURS; a
student's exercise workspaces (course/work/NAME.py, written by `python -m course start`) are
not in the repository.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ["utils", "tokenizer", "data", "data_preprocess", "dataset", "parallel", "model",
            "optimizer", "parallel_plan", "trainer", "tools", "monitor", "server", "bench",
            "slurm", "course"]
NOT_OURS = {
    "megatron/core/datasets/indexed_dataset.py",  # Megatron-LM, cited for the format
    "torch/optim/adam.py",  # PyTorch, cited for the update
    "tokenizer/my_tok.py",  # a user's own file in a tokenizer folder (never executed)
}
WORKSPACES = re.compile(r"^course/work/\w+\.py$")  # a student's exercise files, git-ignored
PATH = re.compile(r"(?<![\w/.\-])((?:[A-Za-z_][\w\-]*/)+[A-Za-z_][\w\-]*\.(?:py|md))"
                  r"(?::([A-Za-z_][\w.]*))?")
DOTTED = re.compile(r"`((?:" + "|".join(PACKAGES) + r")(?:\.[A-Za-z_]\w*)+)`")


def prose_files() -> list[Path]:
    files = [*REPO.glob("*.py"), REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    for package in PACKAGES:
        if (REPO / package).is_dir():
            files += sorted((REPO / package).rglob("*.py")) + sorted((REPO / package).rglob("*.md"))
    return [path for path in files if "work" not in path.relative_to(REPO).parts]


def prose_of(path: Path) -> str:
    """A markdown file whole; of a Python file, its docstrings and comments."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".md":
        return text
    pieces = [token.string for token in tokenize.generate_tokens(io.StringIO(text).readline)
              if token.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            pieces.append(ast.get_docstring(node) or "")
    return "\n".join(pieces)


PROJECT_FILES = [path.relative_to(REPO).as_posix() for path in REPO.rglob("*.py")
                 if ".venv" not in path.parts] + \
                [path.relative_to(REPO).as_posix() for path in REPO.rglob("*.md")
                 if ".venv" not in path.parts]


def find_file(named: str, naming_file: Path) -> Path | None:
    folders = [naming_file.parent, *naming_file.parent.parents]
    for folder in folders[:folders.index(REPO) + 1] if REPO in folders else [REPO]:
        if (folder / named).is_file():
            return folder / named
    tails = [relative for relative in PROJECT_FILES if relative.endswith("/" + named)]
    return REPO / tails[0] if tails else None


def defines(module_file: Path, qualified_name: str) -> bool:
    """Whether `Class.method` / `function` / `CONSTANT` is defined at the top of the module."""
    body = ast.parse(module_file.read_text(encoding="utf-8")).body
    for part in qualified_name.split("."):
        names: dict[str, ast.AST] = {}
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names[node.name] = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update({target.id: node for target in targets
                              if isinstance(target, ast.Name)})
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update({(alias.asname or alias.name): node for alias in node.names})
        if part not in names:
            return False
        node = names[part]
        body = node.body if isinstance(node, ast.ClassDef) else []
    return True


def dangling_names(path: Path) -> list[str]:
    prose, missing = prose_of(path), []
    for match in PATH.finditer(prose):
        named, function = match.group(1), match.group(2)
        if named in NOT_OURS or WORKSPACES.match(named):
            continue
        found = find_file(named, path)
        if found is None:
            missing.append(named)
        elif function and found.suffix == ".py" and not defines(found, function.rstrip(".")):
            missing.append(f"{named}:{function}")
    for match in DOTTED.finditer(prose):
        parts = match.group(1).split(".")
        for split in range(len(parts), 1, -1):  # the longest prefix that is a module
            module = REPO.joinpath(*parts[:split])
            module_file = module.with_suffix(".py") if module.with_suffix(".py").is_file() \
                else module / "__init__.py"
            if module_file.is_file():
                rest = ".".join(parts[split:])
                if rest and not defines(module_file, rest):
                    missing.append(match.group(1))
                break
        # `model.safetensors`, `model.generate`: a file or an attribute, not a module path
    return missing


@pytest.mark.parametrize("path", prose_files(), ids=lambda path: path.relative_to(REPO).as_posix())
def test_named_paths_exist(path: Path) -> None:
    assert dangling_names(path) == [], (
        f"{path.relative_to(REPO)} names what does not exist: fix the name or the pointer")


def test_a_dangling_name_is_caught(tmp_path: Path) -> None:
    module = REPO / "trainer" / "lr_schedule.py"
    prose = tmp_path / "notes.md"
    prose.write_text("See trainer/config.py, trainer/lr_schedule.py:no_such_function and "
                     "`trainer.lr_schedule.nothing_here`; trainer/lr_schedule.py, "
                     "`trainer.lr_schedule.LRSchedule` and `model.safetensors` are fine.\n")
    assert module.is_file()
    assert dangling_names(prose) == ["trainer/config.py", "trainer/lr_schedule.py:no_such_function",
                                     "trainer.lr_schedule.nothing_here"]
