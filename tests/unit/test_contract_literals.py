"""No task id or XCom key is written as a string literal outside the contract module.

The code is parsed (``ast``) and a string equal to a task id or key of
:mod:`airflow_plan_provider.contract` is reported where code names a task or an XCom with it: an
argument of the XCom and task-instance readers, a ``task_id=`` / ``task_ids=`` / ``key=`` argument, a
comparison with a task id or key, an index into task states, task instances or XComs, a key of a
``parents=`` mapping; and any string shaped like a pool lane's task, a select task or a locked output's
key, wherever it is.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from airflow_plan_provider import contract

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("airflow_plan_provider", "harness", "tests", "bench", "scripts", "dags")
#: Files whose literals are what they check: the contract's own values, and this finder's examples.
ALLOWED = {
    "airflow_plan_provider/contract.py",
    "tests/unit/test_contract.py",
    "tests/unit/test_contract_literals.py",
}

NAMES = {
    value
    for name, value in vars(contract).items()
    if name.endswith(("_TASK", "_KEY")) and isinstance(value, str)
}
SHAPED = re.compile(
    rf"^({contract.NODES_TASK}{contract.LANE_SEPARATOR}|{contract.SELECT_PREFIX}{contract.NODES_TASK}"
    rf"|{contract.LOCKED_PREFIX})"
)
INSTANCE = re.compile(rf"^{contract.NODES_TASK}(_\d+|\[\d+\])$")  # a mapped instance's state key
READERS = {
    "xcom",
    "_xcom",
    "xcom_pull",
    "xcom_push",
    "get_task",
    "task_instance",
    "task_log",
    "try_number",
    "task_state",
    "records",
    "follow",
    "startswith",
}
KEYWORDS = {"task_id", "task_ids", "key", "approval_task_id", "replan_task_id", "node_task"}
HOLDERS = re.compile(r"state|tis\b|xcoms|task_dict|tries|rendered|logs")
COMPARED = re.compile(r"task_id|\bkey\b")


def strings(node: ast.AST) -> Iterator[ast.Constant]:
    for child in ast.walk(node):
        if isinstance(child, ast.Constant) and isinstance(child.value, str):
            yield child


def named(node: ast.AST) -> Iterator[ast.Constant]:
    """The strings under ``node`` that are a task id or key of the contract."""
    return (s for s in strings(node) if s.value in NAMES or INSTANCE.match(s.value))


def literals(source: str) -> list[tuple[int, str]]:
    """(line, literal) of every task id or key written as a literal where code names a task or XCom."""
    found: set[tuple[int, str]] = set()
    for node in ast.walk(ast.parse(source)):
        places: list[ast.AST] = []
        if isinstance(node, ast.Call):
            function = (
                node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            )
            places += node.args if function in READERS else []
            places += [kw.value for kw in node.keywords if kw.arg in KEYWORDS]
            places += [
                key
                for kw in node.keywords
                if kw.arg == "parents" and isinstance(kw.value, ast.Dict)
                for key in kw.value.keys
                if key is not None
            ]
        elif isinstance(node, ast.Compare) and COMPARED.search(ast.unparse(node)):
            places.append(node)
        elif isinstance(node, ast.Subscript) and HOLDERS.search(ast.unparse(node.value)):
            places.append(node.slice)
        found.update((s.lineno, s.value) for place in places for s in named(place))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and SHAPED.match(node.value):
            found.add((node.lineno, node.value))
    return sorted(found)


def test_the_finder_finds_each_kind_of_place() -> None:
    source = """
xcom(run, "finalize", key="replan_conf")
ti.xcom_pull(task_ids="plan")
assert task_states(run)["nodes[2]"] == "failed"
assert ti.task_id == "approve"
states = {"r": {"nodes_0": "success"}}
ParentsFinishedTrigger(dag_id="d", run_id="r", parents={"nodes": [0]})
lane = "nodes__api"
conf = {"goal": "g", "plan": {"nodes": []}}  # a run's conf and a plan: not names of the contract
"""
    assert literals(source) == [
        (2, "finalize"),
        (2, "replan_conf"),
        (3, "plan"),
        (4, "nodes[2]"),
        (5, "approve"),
        (7, "nodes"),
        (8, "nodes__api"),
    ]


def test_no_task_id_or_key_is_a_literal_outside_the_contract() -> None:
    found = {
        f"{path.relative_to(ROOT).as_posix()}:{line}: {value!r}"
        for folder in FOLDERS
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path.relative_to(ROOT).as_posix() not in ALLOWED
        for line, value in literals(path.read_text(encoding="utf-8"))
    }
    assert sorted(found) == []
