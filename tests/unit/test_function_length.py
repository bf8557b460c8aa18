"""Functions fit on a screen: none of the package over 60 lines, no operator's ``execute`` over 40 (a
docstring not counted)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "airflow_plan_provider"
MOST_LINES = 60
MOST_EXECUTE_LINES = 40
#: the functions left longer, by file (path inside the package) and name
LONGER: set[tuple[str, str]] = set()


def body_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The function's lines, from its ``def`` to its end, its docstring not counted."""
    lines = (function.end_lineno or function.lineno) - function.lineno + 1
    first = function.body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        lines -= (first.end_lineno or first.lineno) - first.lineno + 1
    return lines


def too_long(source: str, path: str) -> list[tuple[str, str, int]]:
    """(path, name, lines) of each function of ``source`` longer than its limit."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            limit = (
                MOST_EXECUTE_LINES if node.name == "execute" and path.startswith("operators/") else MOST_LINES
            )
            if body_lines(node) > limit:
                found.append((path, node.name, body_lines(node)))
    return found


def test_no_function_of_the_package_is_longer_than_its_limit() -> None:
    found = [
        long
        for file in sorted(PACKAGE.rglob("*.py"))
        for long in too_long(file.read_text(encoding="utf-8"), file.relative_to(PACKAGE).as_posix())
    ]
    assert [(path, name, lines) for path, name, lines in found if (path, name) not in LONGER] == []
    assert {(path, name) for path, name, _lines in found} == LONGER  # a function made shorter leaves the list


def test_a_long_function_and_a_long_execute_are_found() -> None:
    statements = "".join(f"    x{i} = {i}\n" for i in range(45))
    source = f'def execute(self):\n    """Doc."""\n{statements}\ndef helper():\n{statements}'
    assert too_long(source, "operators/node.py") == [("operators/node.py", "execute", 46)]
    assert too_long(source, "freeze.py") == []  # 46 lines: under the limit of a function that is not execute
