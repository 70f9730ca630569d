"""The layer order of the code base, checked on every module's imports (read with `ast`).

Bottom to top; a module may import from its own layer and from the layers below it, never from
above (docs/design.md explains each layer). Entry scripts at the repository root sit on top.
`bench/` and `tests/` are outside the order: they may import anything.

Project imports must also sit at the top of a module (or in a module-level `if`/`try`), never
inside a function: a function-level import hides a dependency from the reader and from this
test. Third-party imports inside functions are fine (optional GPU libraries, slow imports).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

LAYERS: list[set[str]] = [
    {"utils"},
    {"tokenizer"},
    {"data"},
    {"data_preprocess"},
    {"dataset"},
    {"parallel"},  # the mechanisms know no model (parallel_plan/ holds our llama's knowledge)
    {"model"},
    {"optimizer"},
    {"parallel_plan"},
    {"server"},  # the generation engine: the model server's, and GRPO's rollouts' (trainer/)
    {"trainer"},
    {"tools", "monitor", "course"},
    {path.stem for path in REPO.glob("*.py")},  # train_my_ddp, generate, monitor_process, ...
]
LAYER_OF = {package: level for level, packages in enumerate(LAYERS) for package in packages}


def project_modules() -> list[Path]:
    files = [path for path in REPO.glob("*.py")]
    for package in LAYER_OF:
        if (REPO / package).is_dir():
            files += sorted((REPO / package).rglob("*.py"))
    return files


def imported_packages(node: ast.AST, module_path: Path) -> list[str]:
    """Top-level names of what an import statement imports (relative imports resolved)."""
    if isinstance(node, ast.Import):
        return [alias.name.split(".")[0] for alias in node.names]
    assert isinstance(node, ast.ImportFrom)
    if node.level:  # `from . import x` / `from ..y import z`: inside the module's own package
        return [module_path.relative_to(REPO).parts[0]]
    return [node.module.split(".")[0]] if node.module else []


def imports_with_scope(tree: ast.Module) -> list[tuple[ast.AST, bool]]:
    """Every import statement and whether it runs at module level (not inside a def/class)."""
    found: list[tuple[ast.AST, bool]] = []

    def visit(node: ast.AST, nested: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append((child, not nested))
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                 ast.ClassDef, ast.Lambda))
            visit(child, inner)

    visit(tree, False)
    return found


def layer_violations(module_path: Path) -> list[str]:
    own = module_path.relative_to(REPO).parts[0].removesuffix(".py")
    tree = ast.parse(module_path.read_text(encoding="utf-8"), filename=str(module_path))
    problems = []
    for node, at_module_level in imports_with_scope(tree):
        for package in imported_packages(node, module_path):
            if package not in LAYER_OF:
                continue  # standard library or third party
            where = f"{module_path.relative_to(REPO)}:{node.lineno}"
            if LAYER_OF[package] > LAYER_OF[own]:
                problems.append(f"{where}: {own} (layer {LAYER_OF[own]}) imports {package} "
                                f"(layer {LAYER_OF[package]}), which is above it")
            if not at_module_level:
                problems.append(f"{where}: function-level import of project module {package}")
    return problems


def test_every_import_points_down_the_layers():
    problems = [problem for path in project_modules() for problem in layer_violations(path)]
    assert not problems, "\n".join(problems)


def test_every_top_level_folder_is_placed_in_the_order():
    """A new package must be given a layer, or this test would silently skip it."""
    outside = {"tests", "bench"}
    packages = {path.parent.name for path in REPO.glob("*/__init__.py")}
    assert packages - outside - set(LAYER_OF) == set()


@pytest.mark.parametrize("source, expected", [
    ("import model.modeling_z2all\n", [f"utils/x.py:1: utils (layer 0) imports model (layer "
                                       f"{LAYER_OF['model']}), which is above it"]),
    ("def f():\n    from utils import atomic_io\n",
     ["utils/x.py:2: function-level import of project module utils"]),
    ("def f():\n    import flash_attn\nimport torch\nfrom . import readers\n", []),
])
def test_the_checker_catches_what_it_should(tmp_path, monkeypatch, source, expected):
    """The checker itself, on small made-up modules: an upward import and a hidden one fail."""
    fake_repo = tmp_path
    (fake_repo / "utils").mkdir()
    (fake_repo / "utils" / "x.py").write_text(source)
    monkeypatch.setattr(f"{__name__}.REPO", fake_repo)
    assert layer_violations(fake_repo / "utils" / "x.py") == expected
