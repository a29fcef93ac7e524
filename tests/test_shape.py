"""The shape of src/meridian, built from the sources: no module over MAX_MODULE_LINES
lines, no function (methods and nested functions too) over MAX_FUNCTION_LINES, each
counted from its first decorator to its last line. A failure lists the offenders."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "meridian"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def function_lengths(text: str) -> list[tuple[str, int, int]]:
    """(qualified name, first line, lines) of every function in `text`."""
    out: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                    out.append((name, first, (child.end_lineno or first) - first + 1))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(text), "")
    return out


def test_function_lengths_sees_methods_and_nested_functions() -> None:
    text = "class A:\n    @staticmethod\n    def f():\n        def g():\n            pass\n"
    assert function_lengths(text) == [("A.f", 2, 4), ("A.f.g", 4, 2)]


def test_no_module_is_too_long() -> None:
    offenders = []
    for path in sources():
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES:
            offenders.append(f"{path.relative_to(PACKAGE.parent)}: {lines} lines")
    assert offenders == [], f"modules over {MAX_MODULE_LINES} lines"


def test_no_function_is_too_long() -> None:
    offenders = []
    for path in sources():
        for name, first, lines in function_lengths(path.read_text()):
            if lines > MAX_FUNCTION_LINES:
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{first} {name}: {lines}")
    assert offenders == [], f"functions over {MAX_FUNCTION_LINES} lines"
