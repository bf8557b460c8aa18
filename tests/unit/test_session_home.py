"""The session's rules have one home: no code outside ``plan/`` changes a SessionState.

An AST scan of the package (``plan/`` excepted) for: assignments to ``S.<field>...`` (``=``, ``+=``,
annotated), calls of a mutating method on ``S.<field>...`` (``append``, ``extend``, ``update``, ...),
and ``S.event(...)``, where ``S`` is a name ``state`` / ``fresh`` or any ``<expr>.state``. Run
``python tests/unit/test_session_home.py [ROOT]`` to list what it finds in a checkout.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from airflow_plan_provider.plan.session import SessionState

ROOT = Path(__file__).resolve().parents[2]
FIELDS = set(SessionState.model_fields)
MUTATORS = {"append", "extend", "update", "insert", "pop", "popitem", "clear", "setdefault", "remove"}
MUTATORS |= {"add", "discard", "sort", "reverse", "add_tokens"}
NAMES = {"state", "fresh"}


def _is_session(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id in NAMES
    return isinstance(node, ast.Attribute) and node.attr == "state"


def _touches_field(node: ast.AST) -> bool:
    """Whether ``node`` is ``S.<field>`` followed by any attributes or subscripts."""
    while isinstance(node, ast.Attribute | ast.Subscript):
        if isinstance(node, ast.Attribute) and node.attr in FIELDS and _is_session(node.value):
            return True
        node = node.value
    return False


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return [
            t for target in node.targets for t in (target.elts if isinstance(target, ast.Tuple) else [target])
        ]
    if isinstance(node, ast.AugAssign | ast.AnnAssign):
        return [node.target]
    return []


def mutations(source: str, name: str = "<source>") -> list[str]:
    """Each SessionState mutation in ``source``, as ``name:line: what``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        found += [f"{name}:{node.lineno}: {ast.unparse(t)} =" for t in _targets(node) if _touches_field(t)]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            func = node.func
            if (func.attr == "event" and _is_session(func.value)) or (
                func.attr in MUTATORS and _touches_field(func.value)
            ):
                found.append(f"{name}:{node.lineno}: {ast.unparse(func)}(...)")
    return found


def session_mutations_outside_plan(root: Path) -> list[str]:
    package = root / "airflow_plan_provider"
    return [
        hit
        for path in sorted(package.rglob("*.py"))
        if package / "plan" not in path.parents
        for hit in mutations(path.read_text(), str(path.relative_to(root)))
    ]


def test_no_code_outside_the_core_changes_a_session() -> None:
    assert session_mutations_outside_plan(ROOT) == []


def test_the_scan_finds_every_kind_of_mutation() -> None:
    source = """
state.revision += 1
state.failed, state.last_error = [], "x"
state.usage.steps = 3
run.state.locked["a"] = value
state.history.extend(records)
self.state.usage.add_tokens(usage)
fresh.event("plan.failed")
state.revision == 1
layout = state.lanes.get("a")
"""
    assert [hit.split(": ", 1)[1] for hit in mutations(source)] == [
        "state.revision =",
        "state.failed =",
        "state.last_error =",
        "state.usage.steps =",
        "run.state.locked['a'] =",
        "state.history.extend(...)",
        "self.state.usage.add_tokens(...)",
        "fresh.event(...)",
    ]


if __name__ == "__main__":
    hits = session_mutations_outside_plan(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
    print("\n".join(hits))
    print(f"SessionState mutations outside plan/: {len(hits)}")
