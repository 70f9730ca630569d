"""Workspaces: the file a student writes an exercise in, made from the project's own function.

`stub_source(target)` keeps what the student needs and removes the answer:

    from __future__ import annotations
    import torch                                  # the module's imports the function uses
    from model.kernels import gpu_kernels         # the module's own names the function uses

    def apply_rotary(x: torch.Tensor, ...) -> torch.Tensor:
        \"\"\"(the project's docstring: the contract)\"\"\"
        raise NotImplementedError

A method becomes a module-level function that takes `self` (it is put on the class as it is).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap

from course.swap import split_target


def _definition(tree: ast.Module, parts: list[str]) -> ast.FunctionDef:
    body: list[ast.stmt] = tree.body
    node: ast.AST | None = None
    for part in parts:
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef))
                     and n.name == part), None)
        if node is None:
            raise LookupError(f"no definition {part!r} at the top of its module or class")
        body = node.body
    assert isinstance(node, ast.FunctionDef)
    return node


def _bound_names(node: ast.stmt) -> list[str]:
    """Names a top-level statement of a module defines."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    return []


def _absolute(node: ast.ImportFrom, module_name: str) -> str:
    if not node.level:
        return node.module or ""
    package = module_name.split(".")[:-node.level]
    return ".".join(package + ([node.module] if node.module else []))


def function_source(target: str) -> str:
    """The project's function, as written (dedented for a method)."""
    module_name, parts = split_target(target)
    source = inspect.getsource(importlib.import_module(module_name))
    node = _definition(ast.parse(source), parts)
    lines = source.splitlines()
    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
    return textwrap.dedent("\n".join(lines[start - 1:node.end_lineno])) + "\n"


def needed_imports(target: str) -> list[str]:
    """The import lines the target's body needs: the module's imports it uses, and the
    module's own top-level names it uses."""
    module_name, parts = split_target(target)
    tree = ast.parse(inspect.getsource(importlib.import_module(module_name)))
    node = _definition(tree, parts)
    used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    imports = ["from __future__ import annotations", ""]
    own: list[str] = []
    for statement in tree.body:
        if isinstance(statement, ast.Import):
            imports += [f"import {a.name}" + (f" as {a.asname}" if a.asname else "")
                        for a in statement.names
                        if (a.asname or a.name.split(".")[0]) in used]
        elif isinstance(statement, ast.ImportFrom) and statement.module != "__future__":
            names = [a for a in statement.names if (a.asname or a.name) in used]
            if names:
                listed = ", ".join(a.name + (f" as {a.asname}" if a.asname else "")
                                   for a in names)
                imports.append(f"from {_absolute(statement, module_name)} import {listed}")
        else:
            own += [name for name in _bound_names(statement)
                    if name in used and name not in parts]
    if own:
        imports.append(f"from {module_name} import {', '.join(sorted(set(own)))}")
    return imports


def stub_source(target: str, header: str) -> str:
    """The workspace for `target`: imports, signature and docstring, `raise NotImplementedError`."""
    module_name, parts = split_target(target)
    source = inspect.getsource(importlib.import_module(module_name))
    node = _definition(ast.parse(source), parts)
    lines = source.splitlines()
    first_body = node.body[0]
    has_docstring = (isinstance(first_body, ast.Expr) and isinstance(first_body.value,
                                                                     ast.Constant)
                     and isinstance(first_body.value.value, str))
    end = first_body.end_lineno if has_docstring else first_body.lineno - 1
    head = "\n".join(lines[node.lineno - 1:end])
    indent = " " * (first_body.col_offset - node.col_offset)
    function = textwrap.dedent(head + "\n" + " " * node.col_offset + indent
                               + "raise NotImplementedError")
    return "\n".join([header, *needed_imports(target)]).rstrip() + "\n\n\n" + function + "\n"


def solution_source(target: str) -> str:
    """The project's own function as a workspace (what the course's test checks passes)."""
    return ("\n".join(needed_imports(target)).rstrip() + "\n\n\n"
            + function_source(target))
