"""Properties of the untrusted-input core over generated inputs: ``validate_plan`` and the reference
scanner.

Whatever a planner or a run's conf hands over (any JSON value, its JSON text, any text or bytes, plan-shaped
junk, a valid plan with a few values mutated), ``validate_plan`` returns a ``ValidatedPlan`` or raises
``PlanValidationError`` with a bounded message, and ``iter_references`` / ``resolve`` return or raise
``UnresolvedReference``; nothing else escapes. A tool's params are rejected exactly when jsonschema rejects
them. Every DAG is accepted with correct layers (checked by networkx) and a topological run order that
ranks each layer by descendants; every cyclic graph is rejected with a real cycle. The scanner is checked
against a plain implementation of the syntax written here. The untrusted-input examples have a 2 s
deadline each: they include hostile shapes (64 KiB strings built to make a backtracking parser
quadratic, params nested past the limit).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import re
from typing import Any

import networkx as nx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from airflow_plan_provider.exceptions import PlanValidationError
from airflow_plan_provider.plan.graph import node_sort_key
from airflow_plan_provider.plan.model import ValidatedPlan
from airflow_plan_provider.plan.references import (
    MissingInput,
    UnresolvedReference,
    iter_references,
    references_in,
    resolve,
)
from airflow_plan_provider.plan.validate import Limits, validate_plan
from airflow_plan_provider.problems import MAX_REPORTED_PROBLEMS, ProblemCode
from airflow_plan_provider.tools.registry import ToolRegistry

#: untrusted inputs: each example within 2 s
FUZZ = settings(max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
#: generated graphs and params: no deadline (networkx checks the larger graphs slowly)
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PROBLEM_CODES = set(ProblemCode.__args__)  # type: ignore[attr-defined]
BIG = Limits(max_nodes=10_000)

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
    lambda children: st.lists(children, max_size=5) | st.dictionaries(short_text, children, max_size=5),
    max_leaves=25,
)
junk = json_values | deeply_nested()

ids = st.sampled_from(["1", "2", "3", "4", "x_1", "bad id", ""]) | st.integers(-2, 6) | scalars
references = st.builds(
    lambda i, f: f"${{{i}{f}}}", st.sampled_from(["1", "2", "3", "9"]), st.sampled_from(["", ".a"])
)
param_values = references | json_values


def maybe(
    value: st.SearchStrategy[Any], other: st.SearchStrategy[Any] = json_values
) -> st.SearchStrategy[Any]:
    """Mostly ``value``, sometimes junk."""
    return st.one_of(value, value, value, other)


plan_nodes = st.fixed_dictionaries(
    {"id": ids},
    optional={
        "action": maybe(st.text(max_size=10)),
        "tool": maybe(st.sampled_from(["fetch", "other"])),
        "params": maybe(
            st.dictionaries(st.sampled_from(["service", "limit", "x"]), param_values, max_size=3)
        ),
        "dependencies": maybe(st.lists(ids, max_size=3)),
        "expected_outcome": maybe(st.text(max_size=5)),
        "junk": json_values,
    },
)
plan_edges = st.fixed_dictionaries(
    {"from": ids, "to": ids}, optional={"optional": maybe(st.booleans()), "junk": json_values}
)
#: plans whose nodes and edges have the right keys, with some values wrong
plan_like = st.fixed_dictionaries(
    {"nodes": maybe(st.lists(maybe(plan_nodes), max_size=6))},
    optional={
        "edges": maybe(st.lists(maybe(plan_edges), max_size=8)),
        "goal": maybe(st.text()),
        "extra": json_values,
    },
)
#: a plan's top-level keys holding any junk
plan_keys_with_junk = st.dictionaries(st.sampled_from(["nodes", "edges", "goal", "x"]), junk, max_size=4)


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


# --- validate_plan on untrusted input ---------------------------------------------------------------------


@settings(FUZZ, max_examples=200)
@given(junk, st.booleans())
def test_validate_plan_on_arbitrary_values_and_their_json_text(raw: Any, with_tools: bool) -> None:
    tools = REGISTRY if with_tools else None
    check_outcome(raw, tools)
    text = None
    with contextlib.suppress(RecursionError):  # json.dumps itself gives up on thousands of levels
        text = json.dumps(raw)
    if text is not None:
        check_outcome(text, tools)


@settings(FUZZ, max_examples=200)
@given(st.text() | st.binary())
def test_validate_plan_on_arbitrary_text_and_bytes(raw: str | bytes) -> None:
    check_outcome(raw)


@settings(FUZZ, max_examples=350)
@given(plan_like | plan_keys_with_junk, st.booleans())
def test_validate_plan_on_plan_shaped_values(raw: dict[str, Any], with_tools: bool) -> None:
    check_outcome(raw, REGISTRY if with_tools else None)


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


# --- params -----------------------------------------------------------------------------------------------


class Window(BaseModel):
    start: str
    hours: int = 24


ARG_TOOLS = ToolRegistry()


@ARG_TOOLS.tool
def typed(
    name: str,
    count: int = 1,
    ratio: float = 0.5,
    flag: bool = False,
    tags: list[str] | None = None,
    maybe: int | None = None,
    extra: dict[str, Any] | None = None,
    anything: Any = None,
) -> None:
    return None


@ARG_TOOLS.tool(args=Window)
def windowed(start: str, hours: int = 24) -> None:
    return None


@ARG_TOOLS.tool(
    args={"type": "object", "properties": {"level": {"type": ["string", "null"], "maxLength": 3}}}
)
def raw_schema(level: str | None = None) -> None:
    return None


plain_text = st.text(alphabet=st.characters(blacklist_characters="$"), max_size=6)
plain_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | plain_text,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(plain_text, children, max_size=3),
    max_leaves=8,
)
arg_names = st.sampled_from(
    [
        "name",
        "count",
        "ratio",
        "flag",
        "tags",
        "maybe",
        "extra",
        "anything",
        "start",
        "hours",
        "level",
        "other",
    ]
)


@SETTINGS
@given(st.sampled_from(sorted(ARG_TOOLS)), st.dictionaries(arg_names, plain_json, max_size=5))
def test_params_are_rejected_exactly_when_jsonschema_rejects_them(
    tool_name: str, params: dict[str, Any]
) -> None:
    plan = {"nodes": [{"id": "1", "action": "call", "tool": tool_name, "params": params}]}
    expected = sorted(error.message for error in ARG_TOOLS[tool_name].validator.iter_errors(params))
    try:
        validate_plan(plan, ARG_TOOLS)
    except PlanValidationError as error:
        assert {p.code for p in error.problems} == {"bad_params"}
        reported = sorted(p.message.split(": ", 1)[1] for p in error.problems)
    else:
        reported = []
    assert reported == expected


# --- DAGs -------------------------------------------------------------------------------------------------

node_ids = st.from_regex(r"[A-Za-z0-9_\-]{1,6}", fullmatch=True)


@st.composite
def dags(draw: st.DrawFn, min_size: int = 1) -> tuple[list[str], list[tuple[str, str]]]:
    """Node ids in a random order and edges that only go from a lower to a higher position."""
    size = draw(st.integers(min_size, 40))
    names = draw(st.lists(node_ids, min_size=size, max_size=size, unique=True))
    pairs = draw(st.lists(st.tuples(st.integers(0, size - 1), st.integers(0, size - 1)), max_size=3 * size))
    edges = sorted({(names[a], names[b]) for a, b in pairs if a < b})
    return names, edges


def plan_of(names: list[str], edges: list[tuple[str, str]], rotate: int = 0) -> dict[str, Any]:
    shown = names[rotate:] + names[:rotate]  # the order of nodes in the plan does not follow the graph
    return {
        "nodes": [{"id": name, "action": "step", "tool": "t"} for name in shown],
        "edges": [{"from": source, "to": target} for source, target in edges],
    }


@SETTINGS
@given(dags(), st.integers(0, 40))
def test_every_dag_is_accepted_with_correct_layers(
    dag: tuple[list[str], list[tuple[str, str]]], rotate: int
) -> None:
    names, edges = dag
    validated = validate_plan(plan_of(names, edges, rotate % len(names)), limits=BIG)
    layers = validated.layers

    placed = [name for layer in layers for name in layer]
    assert sorted(placed) == sorted(names), "every node in exactly one layer"
    assert all(layer == sorted(layer, key=node_sort_key) for layer in layers)
    layer_of = {name: index for index, layer in enumerate(layers) for name in layer}
    assert all(layer_of[source] < layer_of[target] for source, target in edges)

    graph = nx.DiGraph(edges)
    graph.add_nodes_from(names)
    assert [set(layer) for layer in layers] == [set(g) for g in nx.topological_generations(graph)]


@SETTINGS
@given(dags(), st.integers(0, 40))
def test_the_run_order_is_topological_and_ranks_each_layer_by_descendants(
    dag: tuple[list[str], list[tuple[str, str]]], rotate: int
) -> None:
    """The node tasks' map-index order: layer by layer, and within a layer more descendants first (as
    Airflow's ``downstream`` weight rule ranks a hand-written DAG's tasks); counts checked by networkx."""
    names, edges = dag
    validated = validate_plan(plan_of(names, edges, rotate % len(names)), limits=BIG)
    graph = nx.DiGraph(edges)
    graph.add_nodes_from(names)
    below = {name: len(nx.descendants(graph, name)) for name in names}

    order = validated.run_order
    assert sorted(order) == sorted(names)
    position = {name: index for index, name in enumerate(order)}
    assert all(position[source] < position[target] for source, target in edges)
    start = 0
    for layer in validated.layers:
        chunk = order[start : start + len(layer)]
        start += len(layer)
        assert sorted(chunk) == sorted(layer), "the layers stay in order"
        assert chunk == sorted(layer, key=lambda name: (-below[name], layer.index(name)))


@st.composite
def cyclic_graphs(draw: st.DrawFn) -> tuple[list[str], list[tuple[str, str]]]:
    """A DAG plus a path through some of its nodes closed by a back edge."""
    names, edges = draw(dags(min_size=2))
    on_cycle = draw(st.lists(st.sampled_from(names), min_size=2, max_size=len(names), unique=True))
    ordered = sorted(on_cycle, key=names.index)
    loop = [*itertools.pairwise(ordered), (ordered[-1], ordered[0])]
    return names, sorted(set(edges) | set(loop))


@SETTINGS
@given(cyclic_graphs(), st.integers(0, 40))
def test_every_cyclic_graph_is_rejected_with_a_real_cycle(
    graph: tuple[list[str], list[tuple[str, str]]], rotate: int
) -> None:
    names, edges = graph
    try:
        validate_plan(plan_of(names, edges, rotate % len(names)), limits=BIG)
    except PlanValidationError as error:
        problems = error.problems
    else:
        raise AssertionError("a cyclic plan was accepted")
    assert [p.code for p in problems] == ["cycle"]
    cycle = problems[0].nodes
    assert cycle[0] == cycle[-1]
    assert len(set(cycle[:-1])) == len(cycle) - 1 >= 2
    assert all(pair in set(edges) for pair in itertools.pairwise(cycle))


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
