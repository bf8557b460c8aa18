"""Fuzz tests of the untrusted-input core: validate_plan and the reference scanner.

Whatever a planner or a run's conf hands over, ``validate_plan`` returns a ``ValidatedPlan`` or raises
``PlanValidationError`` with a bounded message, and ``iter_references`` / ``resolve`` return or raise
``UnresolvedReference``; nothing else escapes. The scanner is also checked against a plain
implementation of the syntax written here. Each example has a 2 s deadline: the inputs include hostile
shapes (64 KiB strings built to make a backtracking parser quadratic, params nested past the limit).
"""

from __future__ import annotations

import contextlib
import copy
import re
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_plan_provider.exceptions import PlanValidationError
from airflow_plan_provider.plan.model import ValidatedPlan
from airflow_plan_provider.plan.problems import MAX_REPORTED_PROBLEMS, ProblemCode
from airflow_plan_provider.plan.references import (
    MissingInput,
    UnresolvedReference,
    iter_references,
    references_in,
    resolve,
)
from airflow_plan_provider.plan.validate import validate_plan
from airflow_plan_provider.tools.registry import ToolRegistry

FUZZ = settings(max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
PROBLEM_CODES = set(ProblemCode.__args__)  # type: ignore[attr-defined]

REGISTRY = ToolRegistry()


@REGISTRY.tool
def fetch(service: str, limit: int = 10) -> dict[str, Any]:
    return {}


# --- inputs -----------------------------------------------------------------------------------------------

HOSTILE_UNITS = ["${a.b", "${a,", "${a..", "${", "$${", "${1.x ", "${1.$", "$", "}"]
hostile_strings = st.builds(
    lambda unit, count: unit * count, st.sampled_from(HOSTILE_UNITS), st.integers(1, 30_000)
)
syntax_strings = st.lists(
    st.sampled_from(
        ["$", "{", "}", ".", "a", "b", "1", "-", " ", "${", "$${", "${a", "${1", ".b", ".0", "\u00a0"]
    ),
    max_size=24,
).map("".join)
short_text = st.text(max_size=12) | syntax_strings
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | short_text


@st.composite
def deeply_nested(draw: st.DrawFn) -> Any:
    """A value inside 0..60 dicts and lists (the limit on params is 32), or thousands of them (past
    Python's recursion limit)."""
    value: Any = draw(scalars)
    wraps = draw(st.lists(st.booleans(), max_size=60) | st.integers(1000, 2000).map(lambda n: [True] * n))
    for wrap_in_dict in wraps:
        value = {"k": value} if wrap_in_dict else [value]
    return value


json_values = st.recursive(
    scalars | hostile_strings,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(short_text, children, max_size=4),
    max_leaves=20,
)
junk = json_values | deeply_nested()


def check_outcome(raw: Any, tools: ToolRegistry | None = None) -> None:
    """The only two outcomes, and a message that lists at most MAX_REPORTED_PROBLEMS problems."""
    try:
        result = validate_plan(raw, tools)
    except PlanValidationError as error:
        assert error.problems
        assert {p.code for p in error.problems} <= PROBLEM_CODES
        message = str(error)
        assert message.count("\n  - ") == min(len(error.problems), MAX_REPORTED_PROBLEMS)
        assert all(len(p.message) <= 2100 and len(p.path) <= 600 for p in error.problems)
    else:
        assert isinstance(result, ValidatedPlan)


# --- validate_plan ----------------------------------------------------------------------------------------


@FUZZ
@given(junk, st.booleans())
def test_validate_plan_on_arbitrary_values(raw: Any, with_tools: bool) -> None:
    check_outcome(raw, REGISTRY if with_tools else None)


@FUZZ
@given(st.dictionaries(st.sampled_from(["nodes", "edges", "goal", "x"]), junk, max_size=4))
def test_validate_plan_on_plan_shaped_values(raw: dict[str, Any]) -> None:
    check_outcome(raw, REGISTRY)


VALID_PLAN: dict[str, Any] = {
    "goal": "check the service",
    "nodes": [
        {"id": "1", "action": "fetch", "tool": "fetch", "params": {"service": "api"}},
        {"id": "2", "action": "fetch more", "tool": "fetch", "params": {"service": "${1.name}", "limit": 5}},
        {
            "id": "3",
            "action": "report",
            "tool": "fetch",
            "params": {"service": "rows ${2.rows.0} cost $${lit}"},
            "dependencies": ["1"],
            "expected_outcome": "a report",
        },
    ],
    "edges": [{"from": "1", "to": "2"}, {"from": "2", "to": "3", "optional": True}],
}


def test_the_plan_to_mutate_is_valid() -> None:
    assert validate_plan(VALID_PLAN, REGISTRY).layers == [["1"], ["2"], ["3"]]


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The paths to values inside ``value`` (dict keys and list indexes), 6 levels deep at most."""
    found: list[tuple[Any, ...]] = []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found.append((*prefix, key))
        if len(prefix) < 5:
            found += paths(item, (*prefix, key))
    return found


@st.composite
def mutated_plans(draw: st.DrawFn) -> dict[str, Any]:
    """The valid plan with a few values replaced, deleted, duplicated or turned into references."""
    plan = copy.deepcopy(VALID_PLAN)
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(paths(plan)))
        parent = plan
        for key in path[:-1]:
            parent = parent[key]
        key = path[-1]
        action = draw(st.sampled_from(["replace", "delete", "duplicate", "reference", "hostile", "nest"]))
        if action == "delete":
            del parent[key]
        elif action == "duplicate" and isinstance(parent, list):
            # the same object twice, not a deep copy: an earlier "nest" may have put 2000 levels here
            parent.append(parent[key])
        elif action == "reference":
            parent[key] = draw(st.sampled_from(["${1}", "${2.x}", "${3}", "${9.a}", "a ${1.b} b", "$${1}"]))
        elif action == "hostile":
            parent[key] = draw(hostile_strings)
        elif action == "nest":
            parent[key] = draw(deeply_nested())
        else:
            parent[key] = draw(junk)
        if not paths(plan):
            break
    return plan


@FUZZ
@given(mutated_plans())
def test_validate_plan_on_mutated_valid_plans(plan: dict[str, Any]) -> None:
    check_outcome(plan, REGISTRY)
    check_outcome(plan)


# --- the reference scanner --------------------------------------------------------------------------------

OUTPUTS: dict[str, Any] = {"a": {"b": [1, {"c": "x"}], "$": "dollar"}, "b": ["p", "q"], "1": "one"}
any_strings = syntax_strings | st.text(max_size=40) | hostile_strings


@FUZZ
@given(any_strings)
def test_scanner_returns_or_raises_the_documented_error(text: str) -> None:
    for ref in iter_references({"p": [text]}):
        assert ref.location == "params.p[0]"
    for params in (text, {"p": text, "q": [text, {"r": text}]}):
        with contextlib.suppress(UnresolvedReference):
            resolve(params, OUTPUTS)


ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def plain_reference(text: str, start: int) -> tuple[str, tuple[str, ...], int] | None:
    """The reference at ``text[start]`` ("${" already seen): id, path and end, or None."""
    end = start + 2
    while end < len(text) and text[end] in ID_CHARS:
        end += 1
    node_id = text[start + 2 : end]
    if not node_id:
        return None
    path: list[str] = []
    while end < len(text):
        if text[end] == "}":
            return node_id, tuple(path), end + 1
        if text[end] != ".":
            return None
        segment_end = end + 1
        while segment_end < len(text) and text[segment_end] not in ".}" and not text[segment_end].isspace():
            segment_end += 1
        if segment_end == end + 1:
            return None
        path.append(text[end + 1 : segment_end])
        end = segment_end
    return None


def plain_scan(text: str) -> list[str | tuple[str, tuple[str, ...]]]:
    """What a param string means, read character by character: literal text and (id, path) references."""
    pieces: list[str | tuple[str, tuple[str, ...]]] = []
    literal = ""
    index = 0
    while index < len(text):
        if text.startswith("$${", index):
            literal += "${"
            index += 3
            continue
        if text.startswith("${", index) and (index == 0 or text[index - 1] != "$"):
            found = plain_reference(text, index)
            if found is not None:
                if literal:
                    pieces.append(literal)
                literal = ""
                pieces.append(found[:2])
                index = found[2]
                continue
        literal += text[index]
        index += 1
    if literal:
        pieces.append(literal)
    return pieces


# The regular expression the scanner replaced: fine on short strings, and the same language.
PREVIOUS = re.compile(r"(?<!\$)\$\{([A-Za-z0-9_\-]+)((?:\.[^.}\s]+)*)\}")


@settings(max_examples=200, deadline=2000)
@given(syntax_strings | st.text(alphabet="${}.ab1 \t\u00a0\u2028", max_size=30))
def test_scanner_agrees_with_a_plain_implementation(text: str) -> None:
    expected = plain_scan(text)
    references = [piece for piece in expected if isinstance(piece, tuple)]
    assert [(r.node_id, r.path) for r in references_in(text)] == references
    assert [(m.group(1), tuple(m.group(2).split(".")[1:])) for m in PREVIOUS.finditer(text)] == references
    resolved = resolve(text, {})  # every node missing: each reference becomes a marker
    if len(expected) == 1 and isinstance(expected[0], tuple):
        assert isinstance(resolved, MissingInput)
        assert resolved.node_id == expected[0][0]
    else:
        assert resolved == "".join(
            piece if isinstance(piece, str) else f"<missing output of node {piece[0]}>" for piece in expected
        )
