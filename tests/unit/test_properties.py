"""Properties of validate_plan over generated inputs: it never crashes, accepts every DAG with correct
layers, and rejects every cyclic graph with a real cycle."""

from __future__ import annotations

import itertools
import json
from typing import Any

import networkx as nx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from airflow_plan_provider.exceptions import PlanValidationError
from airflow_plan_provider.plan.graph import node_sort_key
from airflow_plan_provider.plan.model import ValidatedPlan
from airflow_plan_provider.plan.problems import ProblemCode
from airflow_plan_provider.plan.validate import Limits, validate_plan
from airflow_plan_provider.tools.registry import ToolRegistry

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PROBLEM_CODES = set(ProblemCode.__args__)  # type: ignore[attr-defined]
BIG = Limits(max_nodes=10_000)

REGISTRY = ToolRegistry()


@REGISTRY.tool
def fetch(service: str, limit: int = 10) -> dict[str, Any]:
    return {}


# --- inputs -----------------------------------------------------------------------------------------------

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=25,
)

ids = st.sampled_from(["1", "2", "3", "4", "x_1", "bad id", ""]) | st.integers(-2, 6) | json_scalars
references = st.builds(
    lambda i, f: f"${{{i}{f}}}", st.sampled_from(["1", "2", "3", "9"]), st.sampled_from(["", ".a"])
)
param_values = references | json_values


def maybe(
    value: st.SearchStrategy[Any], junk: st.SearchStrategy[Any] = json_values
) -> st.SearchStrategy[Any]:
    """Mostly ``value``, sometimes junk."""
    return st.one_of(value, value, value, junk)


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
plan_like = st.fixed_dictionaries(
    {"nodes": maybe(st.lists(maybe(plan_nodes), max_size=6))},
    optional={
        "edges": maybe(st.lists(maybe(plan_edges), max_size=8)),
        "goal": maybe(st.text()),
        "extra": json_values,
    },
)


def check_outcome(raw: Any, tools: ToolRegistry | None = None) -> None:
    try:
        result = validate_plan(raw, tools, BIG)
    except PlanValidationError as error:
        assert error.problems
        assert {p.code for p in error.problems} <= PROBLEM_CODES
    else:
        assert isinstance(result, ValidatedPlan)


@SETTINGS
@given(json_values)
def test_arbitrary_json_never_crashes(raw: Any) -> None:
    check_outcome(raw)
    check_outcome(json.dumps(raw))


@SETTINGS
@given(st.text() | st.binary())
def test_arbitrary_text_never_crashes(raw: str | bytes) -> None:
    check_outcome(raw)


@SETTINGS
@given(plan_like, st.booleans())
def test_plan_shaped_junk_never_crashes(raw: dict[str, Any], with_tools: bool) -> None:
    check_outcome(raw, REGISTRY if with_tools else None)


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
