"""validate_plan: one test per problem code, the accepted plan shapes, and reference resolution."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from typing import Any

import pytest
from pydantic import BaseModel

from airflow_plan_provider.exceptions import PlanningError, PlanValidationError
from airflow_plan_provider.plan.model import ValidatedPlan
from airflow_plan_provider.plan.references import MissingInput, UnresolvedReference, resolve
from airflow_plan_provider.plan.validate import Limits, validate_plan
from airflow_plan_provider.planners.base import (
    PlanRequest,
    plan_with_repairs,
    rejected_problem_count,
    rejected_summary,
)
from airflow_plan_provider.problems import MAX_REPORTED_PROBLEMS, Problem
from airflow_plan_provider.testing.scripted import ScriptedPlanner
from airflow_plan_provider.tools.registry import ToolRegistry


class SummaryArgs(BaseModel):
    service: str
    hours: int = 24


def make_registry() -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool(description="Latency percentiles of a service for one day")
    def query_metrics(service: str, day: str) -> dict[str, Any]:
        return {}

    @registry.tool(args=SummaryArgs, description="Summary of a service over some hours")
    def summarize(service: str, hours: int = 24) -> str:
        return ""

    return registry


TOOLS = make_registry()


def node(node_id: Any, tool: str = "t", **params: Any) -> dict[str, Any]:
    return {"id": node_id, "action": f"step {node_id}", "tool": tool, "params": params}


def edge(source: Any, target: Any, optional: bool = False) -> dict[str, Any]:
    return {"from": source, "to": target, "optional": optional}


def problems_of(plan: Any, tools: ToolRegistry | None = None, limits: Limits | None = None) -> list[Problem]:
    with pytest.raises(PlanValidationError) as caught:
        validate_plan(plan, tools, limits)
    assert caught.value.problems, "PlanValidationError without problems"
    return caught.value.problems


def only(problems: list[Problem], code: str) -> list[Problem]:
    return [p for p in problems if p.code == code]


def assert_real_cycle(cycle: Sequence[str], edges: set[tuple[str, str]]) -> None:
    assert len(cycle) >= 3, cycle  # at least two distinct nodes, first repeated at the end
    assert cycle[0] == cycle[-1]
    assert len(set(cycle[:-1])) == len(cycle) - 1, "a node repeats inside the cycle"
    for source, target in itertools.pairwise(cycle):
        assert (source, target) in edges, f"{source} -> {target} is not an edge"


# --- schema -------------------------------------------------------------------------------------------


def test_bad_json_text_is_a_schema_problem() -> None:
    [problem] = problems_of('{"nodes": [')
    assert problem.code == "schema"
    assert problem.message.startswith("plan is not valid JSON")


def test_bytes_that_are_not_text_are_a_schema_problem() -> None:
    [problem] = problems_of(b'{"nodes": "\xff"}')
    assert problem.code == "schema"
    assert problem.message.startswith("plan is not valid JSON")


def test_json_nested_too_deeply_is_a_schema_problem() -> None:
    [problem] = problems_of("[" * 100_000)
    assert (problem.code, problem.message) == ("schema", "plan is not valid JSON: nested too deeply")


@pytest.mark.parametrize(
    ("raw", "kind"), [("[1, 2]", "list"), ("42", "int"), ([], "list"), (None, "NoneType")]
)
def test_plan_that_is_not_an_object(raw: Any, kind: str) -> None:
    [problem] = problems_of(raw)
    assert problem.code == "schema"
    assert problem.message == f"plan must be a JSON object, got {kind}"


def test_node_missing_fields_reports_each_field_with_the_node_id() -> None:
    problems = problems_of({"nodes": [{"id": "1"}]})
    assert {(p.code, p.path) for p in problems} == {
        ("schema", "nodes[0].action"),
        ("schema", "nodes[0].tool"),
    }
    assert all(p.nodes == ("1",) for p in problems)
    assert all(p.message == "Field required" for p in problems)


def test_wrong_types_are_reported_at_their_path() -> None:
    plan = {
        "goal": 3,
        "nodes": [
            {"id": ["x"], "action": "a", "tool": "t"},
            {"id": "2", "action": "b", "tool": "t", "params": "x"},
        ],
        "edges": [{"from": "1", "to": "2", "optional": "maybe"}],
    }
    paths = {p.path for p in problems_of(plan) if p.code == "schema"}
    assert paths == {"goal", "nodes[0].id", "nodes[1].params", "edges[0].optional"}


def test_nodes_and_edges_must_be_lists() -> None:
    problems = problems_of({"nodes": {"id": "1"}, "edges": "1->2"})
    assert {(p.code, p.path) for p in problems} == {("schema", "nodes"), ("schema", "edges")}


def test_node_id_must_match_the_id_pattern() -> None:
    [problem] = problems_of({"nodes": [node("has space")]})
    assert (problem.code, problem.path) == ("schema", "nodes[0].id")


def test_unknown_fields_are_rejected_everywhere() -> None:
    plan = {
        "nodes": [{**node("1"), "retries": 3}, node("2")],
        "edges": [{**edge("1", "2"), "weight": 1}],
        "x": 1,
    }
    problems = problems_of(plan)
    assert {(p.code, p.path) for p in problems} == {
        ("schema", "x"),
        ("schema", "nodes[0].retries"),
        ("schema", "edges[0].weight"),
    }
    assert only(problems, "schema")[0].message == "unknown top-level field 'x'"


def test_top_level_keys_that_are_not_strings_are_a_schema_problem() -> None:
    problems = problems_of({1: "one", "x": 2, "nodes": [node("1")]})
    assert [(p.code, p.path) for p in problems] == [("schema", "1"), ("schema", "x")]


def test_one_bad_node_does_not_hide_the_others() -> None:
    plan = {"nodes": [node("1"), {"id": "2"}, node("3")], "edges": [edge("1", "9")]}
    problems = problems_of(plan)
    assert {p.code for p in problems} == {"schema", "dangling_edge"}


# --- graph rules ----------------------------------------------------------------------------------------


def test_empty_plan() -> None:
    [problem] = problems_of({"nodes": []})
    assert (problem.code, problem.path) == ("empty_plan", "nodes")


def test_duplicate_id() -> None:
    [problem] = problems_of({"nodes": [node("1"), node("2"), node("1")]})
    assert problem.code == "duplicate_id"
    assert problem.nodes == ("1",)
    assert problem.message == "node id '1' is used 2 times"


def test_dangling_edge_names_the_missing_end() -> None:
    [problem] = problems_of({"nodes": [node("1")], "edges": [edge("1", "9")]})
    assert problem.code == "dangling_edge"
    assert problem.nodes == ("9",)
    assert problem.path == "edges[0]"
    assert problem.message == "edge 1 -> 9 names unknown node(s) 9"


def test_dangling_dependency() -> None:
    [problem] = problems_of({"nodes": [node("1"), {**node("2"), "dependencies": ["1", "7"]}]})
    assert (problem.code, problem.nodes) == ("dangling_edge", ("7",))


def test_self_loop() -> None:
    [problem] = problems_of({"nodes": [node("1"), node("2")], "edges": [edge("1", "2"), edge("2", "2")]})
    assert problem.code == "self_loop"
    assert problem.nodes == ("2",)
    assert problem.path == "edges[1]"


def test_cycle_is_reported_in_edge_direction() -> None:
    edges = [("1", "2"), ("2", "3"), ("3", "1"), ("3", "4"), ("5", "1")]
    plan = {"nodes": [node(str(i)) for i in range(1, 6)], "edges": [edge(s, t) for s, t in edges]}
    [problem] = problems_of(plan)
    assert problem.code == "cycle"
    assert_real_cycle(problem.nodes, set(edges))
    assert set(problem.nodes) == {"1", "2", "3"}
    assert problem.message == "plan has a cycle: " + " -> ".join(problem.nodes)


def test_cycle_through_a_reference() -> None:
    plan = {"nodes": [node("1", x="${2.value}"), node("2")], "edges": [edge("1", "2")]}
    [problem] = problems_of(plan)
    assert problem.code == "cycle"
    assert_real_cycle(problem.nodes, {("1", "2"), ("2", "1")})


# --- tools and params -----------------------------------------------------------------------------------


def test_unknown_tool_lists_the_known_tools() -> None:
    [problem] = problems_of({"nodes": [node("1", "query_logs")]}, TOOLS)
    assert problem.code == "unknown_tool"
    assert problem.nodes == ("1",)
    assert problem.path == "nodes[0].tool"
    assert problem.message == "node '1' uses unknown tool 'query_logs'; known tools: query_metrics, summarize"


def test_tools_are_not_checked_without_a_registry() -> None:
    assert validate_plan({"nodes": [node("1", "anything", whatever=1)]}).layers == [["1"]]


def test_bad_params_wrong_type_from_a_signature() -> None:
    [problem] = problems_of({"nodes": [node("1", "query_metrics", service="api", day=5)]}, TOOLS)
    assert problem.code == "bad_params"
    assert problem.nodes == ("1",)
    assert problem.path == "params.day"
    assert problem.message == "node '1' (query_metrics): 5 is not of type 'string'"


def test_bad_params_missing_required_arg_from_a_signature() -> None:
    [problem] = problems_of({"nodes": [node("1", "query_metrics", service="api")]}, TOOLS)
    assert (problem.code, problem.path) == ("bad_params", "params")
    assert problem.message == "node '1' (query_metrics): 'day' is a required property"


def test_bad_params_from_a_pydantic_args_model() -> None:
    plan = {
        "nodes": [node("1", "summarize", hours="all"), node("2", "summarize", service="api", colour="red")]
    }
    problems = problems_of(plan, TOOLS)
    assert {(p.code, p.nodes, p.path) for p in problems} == {
        ("bad_params", ("1",), "params.hours"),
        ("bad_params", ("1",), "params"),  # service is required
        ("bad_params", ("2",), "params"),  # colour is not an argument
    }
    assert any("'service' is a required property" in p.message for p in problems)
    assert any("'colour' was unexpected" in p.message for p in problems)


def test_bad_params_nested_path() -> None:
    registry = ToolRegistry()

    @registry.tool
    def tag(labels: list[int]) -> None:
        return None

    [problem] = problems_of({"nodes": [node("1", "tag", labels=[1, "two"])]}, registry)
    assert problem.path == "params.labels[1]"


def test_json_schema_with_a_list_of_types() -> None:
    registry = ToolRegistry()
    schema = {"type": "object", "properties": {"level": {"type": ["string", "null"]}}, "required": ["level"]}

    @registry.tool(args=schema)
    def set_level(level: str | None) -> None:
        return None

    assert validate_plan({"nodes": [node("1", "set_level", level=None)]}, registry).layers == [["1"]]
    [problem] = problems_of({"nodes": [node("1", "set_level", level=3)]}, registry)
    assert (problem.code, problem.path) == ("bad_params", "params.level")
    assert problem.message == "node '1' (set_level): 3 is not of type 'string', 'null'"


def test_valid_params_pass() -> None:
    plan = {
        "nodes": [
            node("1", "query_metrics", service="api", day="2024-05-01"),
            node("2", "summarize", service="x"),
        ]
    }
    assert validate_plan(plan, TOOLS).layers == [["1", "2"]]


def test_param_holding_a_reference_is_not_rejected_by_its_type() -> None:
    plan = {
        "nodes": [
            node("1", "query_metrics", service="api", day="2024-05-01"),
            node("2", "summarize", service="${1.service}", hours="${1.hours}"),
            node("3", "summarize", service="api", hours="${1}"),
        ]
    }
    validated = validate_plan(plan, TOOLS)
    assert validated.layers == [["1"], ["2", "3"]]


def test_missing_required_arg_is_reported_next_to_a_reference() -> None:
    plan = {
        "nodes": [
            node("1", "query_metrics", service="api", day="d"),
            node("2", "query_metrics", day="${1.day}"),
        ]
    }
    [problem] = problems_of(plan, TOOLS)
    assert (problem.code, problem.nodes, problem.path) == ("bad_params", ("2",), "params")
    assert "'service' is a required property" in problem.message


def test_unknown_param_holding_a_reference_is_reported() -> None:
    plan = {"nodes": [node("1", "summarize", service="a"), node("2", "summarize", service="b", extra="${1}")]}
    [problem] = problems_of(plan, TOOLS)
    assert (problem.code, problem.nodes) == ("bad_params", ("2",))
    assert "'extra' was unexpected" in problem.message


# --- references -----------------------------------------------------------------------------------------


def test_reference_to_an_unknown_node() -> None:
    [problem] = problems_of({"nodes": [node("1"), node("2", x="p99 was ${9.p99}")]})
    assert problem.code == "bad_reference"
    assert problem.nodes == ("2", "9")
    assert problem.path == "nodes[1].params.x"
    assert problem.message == "node '2' refers to unknown node '9'"


def test_reference_to_itself() -> None:
    [problem] = problems_of({"nodes": [node("1"), node("2", x=["a", {"y": "${2}"}])]})
    assert problem.code == "bad_reference"
    assert problem.nodes == ("2",)
    assert problem.path == "nodes[1].params.x[1].y"


def test_escaped_reference_is_not_a_reference() -> None:
    assert validate_plan({"nodes": [node("1", x="literal $${9}")]}).parents == {"1": []}


def test_reference_implies_a_hard_edge() -> None:
    plan = {"nodes": [node("1"), node("2", x="${1}"), node("3", x="${1.p99}", y="${2.rows.0}")]}
    validated = validate_plan(plan)
    assert validated.layers == [["1"], ["2"], ["3"]]
    assert validated.parents == {"1": [], "2": ["1"], "3": ["1", "2"]}
    assert validated.soft_edges == []


# --- limits ---------------------------------------------------------------------------------------------


def test_too_many_nodes() -> None:
    [problem] = problems_of({"nodes": [node(str(i)) for i in range(3)]}, limits=Limits(max_nodes=2))
    assert problem.code == "too_many_nodes"
    assert problem.message == "plan has 3 nodes; the limit is 2"


def test_depth_is_limited_only_by_the_node_count() -> None:
    """Nodes run without layer barriers: a chain as long as ``max_nodes`` is valid."""
    limits = Limits()
    chain = {
        "nodes": [node(str(i)) for i in range(limits.max_nodes)],
        "edges": [edge(str(i), str(i + 1)) for i in range(limits.max_nodes - 1)],
    }
    assert len(validate_plan(chain, limits=limits).layers) == limits.max_nodes
    assert not hasattr(limits, "max_depth")


# --- several problems -----------------------------------------------------------------------------------


def test_every_problem_is_reported_at_once() -> None:
    plan = {
        "nodes": [
            node("1", "query_metrics", service="api", day=1),
            node("1", "summarize", service="x"),
            node("2", "no_such_tool", x="${8}"),
            {"id": "3", "tool": "summarize"},
        ],
        "edges": [edge("1", "9"), edge("2", "2")],
    }
    problems = problems_of(plan, TOOLS)
    assert {p.code for p in problems} == {
        "schema",
        "duplicate_id",
        "dangling_edge",
        "self_loop",
        "unknown_tool",
        "bad_params",
        "bad_reference",
    }
    assert len(problems) == 7


def test_error_message_lists_every_problem() -> None:
    error = PlanValidationError([Problem("empty_plan", "plan has no nodes", path="nodes")])
    assert str(error) == "plan is invalid (1 problem(s)):\n  - empty_plan: plan has no nodes at nodes"


# --- accepted shapes ------------------------------------------------------------------------------------

SEED_EDGES = [("1", "5"), ("2", "5"), ("3", "5"), ("4", "5"), ("5", "6")]


def seed_plan() -> dict[str, Any]:
    return {
        "goal": "find why checkout latency went up",
        "nodes": [node(str(i)) for i in range(1, 7)],
        "edges": [edge(s, t) for s, t in SEED_EDGES],
    }


def test_seed_plan_layers() -> None:
    validated = validate_plan(seed_plan())
    assert isinstance(validated, ValidatedPlan)
    assert validated.layers == [["1", "2", "3", "4"], ["5"], ["6"]]
    assert validated.parents["5"] == ["1", "2", "3", "4"]
    assert validated.parents["6"] == ["5"]


def test_dependencies_form_equals_edges_form() -> None:
    with_dependencies = {
        "goal": "find why checkout latency went up",
        "nodes": [
            *(node(str(i)) for i in range(1, 5)),
            {**node("5"), "dependencies": ["1", "2", "3", "4"]},
            {**node("6"), "dependencies": ["5"]},
        ],
    }
    a, b = validate_plan(with_dependencies), validate_plan(seed_plan())
    assert a.layers == b.layers
    assert a.parents == b.parents
    assert {(e.source, e.target, e.optional) for e in a.edges} == {
        (e.source, e.target, e.optional) for e in b.edges
    }
    assert all(n.dependencies is None for n in a.nodes)


def test_planner_shape_keeps_optional_edges() -> None:
    planner_json = json.dumps(
        {
            "nodes": [
                {"id": "1", "action": "query latency metrics", "tool": "query_metrics", "params": {}},
                {"id": "5", "action": "summarize", "tool": "summarize", "params": {}},
            ],
            "edges": [{"from": "1", "to": "5", "optional": True}],
        }
    )
    validated = validate_plan(planner_json)
    assert validated.layers == [["1"], ["5"]]
    assert validated.soft_edges == [("1", "5")]
    assert validated.is_optional("1", "5")
    assert validated.edges[0].optional is True
    assert validated.to_json_dict()["edges"] == [{"from": "1", "to": "5", "optional": True}]


def test_hard_edge_wins_over_an_optional_one() -> None:
    plan = {"nodes": [node("1"), node("2")], "edges": [edge("1", "2", optional=True), edge("1", "2")]}
    assert validate_plan(plan).soft_edges == []


def test_integer_ids_are_accepted_as_strings() -> None:
    plan = {"nodes": [node(1), node(2), {**node(3), "dependencies": [2]}], "edges": [edge(1, 2)]}
    validated = validate_plan(plan)
    assert validated.node_ids == ["1", "2", "3"]
    assert validated.layers == [["1"], ["2"], ["3"]]


def test_numeric_ids_sort_numerically_in_a_layer() -> None:
    validated = validate_plan({"nodes": [node("10"), node("b"), node("2"), node("a"), node("1")]})
    assert validated.layers == [["1", "2", "10", "a", "b"]]


def test_equal_numeric_ids_order_does_not_depend_on_the_input_order() -> None:
    assert validate_plan({"nodes": [node("1"), node("01")]}).layers == [["01", "1"]]
    assert validate_plan({"nodes": [node("01"), node("1")]}).layers == [["01", "1"]]


def test_plan_text_and_bytes_are_parsed() -> None:
    text = json.dumps(seed_plan())
    assert (
        validate_plan(text).layers
        == validate_plan(text.encode()).layers
        == [["1", "2", "3", "4"], ["5"], ["6"]]
    )


# --- resolve --------------------------------------------------------------------------------------------

OUTPUTS: dict[str, Any] = {
    "1": {"p99": 412.5, "service": "checkout", "rows": [{"name": "a"}, {"name": "b"}]},
    "2": "plain text",
}


def test_whole_value_reference_keeps_the_type() -> None:
    assert resolve("${1.p99}", OUTPUTS) == 412.5
    assert resolve("${1.rows}", OUTPUTS) == [{"name": "a"}, {"name": "b"}]
    assert resolve("${1}", OUTPUTS) is OUTPUTS["1"]


def test_reference_inside_text_is_replaced_by_its_text() -> None:
    assert resolve("p99 of ${1.service} is ${1.p99} ms", OUTPUTS) == "p99 of checkout is 412.5 ms"
    assert resolve("rows: ${1.rows.0}", OUTPUTS) == 'rows: {"name": "a"}'
    assert resolve("said: ${2}", OUTPUTS) == "said: plain text"


def test_list_index_path() -> None:
    assert resolve("${1.rows.1.name}", OUTPUTS) == "b"
    assert resolve("${1.rows.-1.name}", OUTPUTS) == "b"


def test_resolve_walks_nested_params() -> None:
    params = {"service": "${1.service}", "filters": [{"p": "${1.p99}"}, 3], "n": None}
    assert resolve(params, OUTPUTS) == {"service": "checkout", "filters": [{"p": 412.5}, 3], "n": None}


@pytest.mark.parametrize("reference", ["${1.latency}", "${1.rows.5.name}", "${1.rows.x}", "${2.text}"])
def test_missing_field_names_node_and_field(reference: str) -> None:
    with pytest.raises(UnresolvedReference) as caught:
        resolve({"q": reference}, OUTPUTS)
    node_id, field = reference[2:-1].split(".", 1)
    assert f"node {node_id!r}" in str(caught.value)
    assert repr(field) in str(caught.value)
    assert str(caught.value).startswith("params.q:")


def test_absent_output_is_a_missing_input() -> None:
    value = resolve("${7.rows}", OUTPUTS)
    assert isinstance(value, MissingInput)
    assert value.node_id == "7"
    assert resolve("${7}", {"7": MissingInput("7")}).node_id == "7"
    assert resolve("rows: ${7.rows}", OUTPUTS) == "rows: <missing output of node 7>"


def test_double_dollar_escapes_a_reference() -> None:
    assert resolve("$${1}", OUTPUTS) == "${1}"
    assert resolve("cost $${1.p99} is ${1.p99}", OUTPUTS) == "cost ${1.p99} is 412.5"


# --- size limits on what a node holds -------------------------------------------------------------------


def nested_params(depth: int) -> dict[str, Any]:
    """Params nesting ``depth`` containers in all, the params object included."""
    value: Any = "leaf"
    for _ in range(depth - 1):
        value = {"k": value}
    return {"k": value}


def test_param_too_large_names_node_path_size_and_limit() -> None:
    plan = {"nodes": [node("1"), node("2", a=[{"b": "x" * 11}], c="y" * 10)]}
    [problem] = problems_of(plan, limits=Limits(max_param_chars=10))
    assert (problem.code, problem.nodes, problem.path) == (
        "param_too_large",
        ("2",),
        "nodes[1].params.a[0].b",
    )
    assert problem.message == "node '2': params.a[0].b holds 11 characters; the limit is 10"


def test_param_too_large_default_limit_is_64_kib() -> None:
    assert Limits().max_param_chars == 64 * 1024
    validate_plan({"nodes": [node("1", q="x" * 64 * 1024)]})
    [problem] = problems_of({"nodes": [node("1", q="x" * (64 * 1024 + 1))]})
    assert (problem.code, problem.path) == ("param_too_large", "nodes[0].params.q")


def test_too_large_param_is_not_read_for_references() -> None:
    [problem] = problems_of({"nodes": [node("1", q="${9} " * 5)]}, limits=Limits(max_param_chars=20))
    assert problem.code == "param_too_large"


def test_too_nested_names_node_path_and_limit() -> None:
    validate_plan({"nodes": [{**node("1"), "params": nested_params(32)}]})
    [problem] = problems_of({"nodes": [node("0"), {**node("1"), "params": nested_params(33)}]})
    assert (problem.code, problem.nodes) == ("too_nested", ("1",))
    assert problem.path == "nodes[1].params" + ".k" * 32
    assert problem.message == "node '1': params nest dicts and lists deeper than 32 levels"


def test_params_nested_10k_deep_are_a_problem_not_a_recursion_error() -> None:
    plan = {"nodes": [{**node("1", "summarize"), "params": {"service": "x", "hours": nested_params(10_000)}}]}
    for tools in (None, TOOLS):
        [problem] = problems_of(plan, tools)  # with tools: not checked against the schema either
        assert (problem.code, problem.nodes) == ("too_nested", ("1",))
        assert len(problem.path) <= 600


def test_param_depth_limit_is_configurable_up_to_the_resolver_ceiling() -> None:
    plan = {"nodes": [{**node("1"), "params": nested_params(5)}]}
    assert [p.code for p in problems_of(plan, limits=Limits(max_param_depth=4))] == ["too_nested"]
    validate_plan(plan, limits=Limits(max_param_depth=5))
    with pytest.raises(ValueError, match="max_param_depth must be at most 100"):
        Limits(max_param_depth=101)


@pytest.mark.parametrize("name", ["max_nodes", "max_param_chars", "max_text_chars"])
@pytest.mark.parametrize("value", [0, -1, True, 2.5])
def test_limits_must_be_positive_integers(name: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"Limits.{name} must be a positive integer"):
        Limits(**{name: value})


@pytest.mark.parametrize("field", ["action", "tool", "expected_outcome"])
def test_too_long_action_tool_or_outcome(field: str) -> None:
    plan = {"nodes": [{**node("1"), field: "x" * 2001}]}
    [problem] = problems_of(plan)
    assert (problem.code, problem.nodes, problem.path) == ("too_long", ("1",), f"nodes[0].{field}")
    assert problem.message == f"node '1': {field} has 2001 characters; the limit is 2000"
    validate_plan({"nodes": [{**node("1"), field: "x" * 2000}]})


def test_too_many_edges() -> None:
    plan = {"nodes": [node("1"), node("2")], "edges": [edge("1", "2")] * 3}
    [problem] = problems_of(plan, limits=Limits(max_nodes=2, max_edges_per_node=1))
    assert (problem.code, problem.message) == ("too_many_edges", "plan has 3 edges; the limit is 2")


def test_plan_far_over_the_node_limit_is_rejected_for_its_size_alone() -> None:
    """20k junk nodes: one problem, not 20k * k (the old validator built 80k problems)."""
    plan = {"nodes": [{"id": "bad id", "junk": i} for i in range(20_000)], "x": 1}
    problems = problems_of(plan, TOOLS)
    assert [(p.code, p.message) for p in problems] == [
        ("schema", "unknown top-level field 'x'"),
        ("too_many_nodes", "plan has 20000 nodes; the limit is 200 (too many to check one by one)"),
    ]


def test_plan_a_little_over_the_node_limit_gets_every_problem() -> None:
    plan = {"nodes": [node("1", "nope"), node("2"), node("3")], "edges": [edge("1", "9")]}
    problems = problems_of(plan, TOOLS, Limits(max_nodes=2))
    assert [p.code for p in problems] == [
        "too_many_nodes",
        "dangling_edge",
        "unknown_tool",
        "unknown_tool",
        "unknown_tool",
    ]


def test_plan_far_over_the_edge_limit_is_rejected_for_its_size_alone() -> None:
    plan = {"nodes": [node("1")], "edges": [{"junk": i} for i in range(50_000)]}
    [problem] = problems_of(plan)
    assert problem.message == "plan has 50000 edges; the limit is 2000 (too many to check one by one)"
    # edges written as dependencies count once parsed
    plan = {"nodes": [node("1"), {**node("2"), "dependencies": [str(i) for i in range(5000)]}]}
    [problem] = problems_of(plan)
    assert problem.code == "too_many_edges"


def test_a_validated_plan_object_far_over_the_limit_is_rejected_for_its_size() -> None:
    big = validate_plan({"nodes": [node(str(i)) for i in range(500)]}, limits=Limits(max_nodes=500))
    [problem] = problems_of(big)
    assert problem.message == "plan has 500 nodes; the limit is 200 (too many to check one by one)"


# --- what problems and errors echo is bounded -------------------------------------------------------------


def test_problems_quoting_huge_plan_text_are_clipped() -> None:
    huge = "x" * 1_000_000
    plan = {
        "nodes": [
            {**node("1"), huge: 1},
            {**node("2", "t" * 1_000_000)},
            {"id": huge, "action": "a", "tool": "t"},
        ],
        "edges": [edge(huge, "1")],
        huge: 2,
    }
    problems = problems_of(plan, TOOLS)
    assert {p.code for p in problems} == {"schema", "dangling_edge", "unknown_tool", "too_long"}
    for problem in problems:
        assert len(problem.message) <= 2100
        assert len(problem.path) <= 600
        assert all(len(n) <= 200 for n in problem.nodes)
    dangling = only(problems, "dangling_edge")[0]
    assert dangling.nodes == ("x" * 100 + "... (999900 more characters)", "1")  # node 1 did not parse


def test_error_message_lists_the_first_problems_and_counts_the_rest() -> None:
    plan = {"nodes": [node("1")], "edges": [edge("1", str(i)) for i in range(2, 102)]}
    with pytest.raises(PlanValidationError) as caught:
        validate_plan(plan)
    error = caught.value
    assert len(error.problems) == 100  # all of them, for programmatic use
    lines = str(error).splitlines()
    assert lines[0] == "plan is invalid (100 problem(s)):"
    assert lines[1] == "  - " + str(error.problems[0])
    assert lines[20] == "  - " + str(error.problems[19])
    assert lines[21:] == ["  ... and 80 more problem(s)"]


def test_planning_error_message_is_capped_and_keeps_every_problem() -> None:
    problems = [Problem("bad_params", f"problem {i}", (str(i),)) for i in range(50)]
    error = PlanningError("no valid plan", problems, reason="invalid_plan")
    assert len(error.problems) == 50
    lines = str(error).splitlines()
    assert lines[0] == "no valid plan"
    assert lines[1:21] == [f"  - bad_params: problem {i} [nodes: {i}]" for i in range(20)]
    assert lines[21:] == ["  ... and 30 more problem(s)"]


# --- the repair loop ------------------------------------------------------------------------------------


def finish(raw: Any) -> ValidatedPlan:
    return validate_plan(raw, TOOLS)


def test_repair_attempts_must_not_be_negative() -> None:
    planner = ScriptedPlanner({"nodes": [node("1")]})
    request = PlanRequest(goal="g", tools=TOOLS)
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="repair_attempts must be an integer of at least 0, got"):
            plan_with_repairs(planner, request, finish, repair_attempts=bad)  # type: ignore[arg-type]
    assert planner.requests == []


def test_rejected_attempts_keep_the_first_problems_and_a_count() -> None:
    bad = {"nodes": [node(str(i), "nope") for i in range(1, 51)]}
    good = {"nodes": [node("1", "summarize", service="api")]}
    planner = ScriptedPlanner(lambda request: good if request.problems else bad)
    outcome = plan_with_repairs(planner, PlanRequest(goal="g", tools=TOOLS), finish, repair_attempts=1)
    assert outcome.attempts == 2
    [rejected] = outcome.rejected
    assert len(rejected) == MAX_REPORTED_PROBLEMS + 1
    assert [p["code"] for p in rejected[:-1]] == ["unknown_tool"] * MAX_REPORTED_PROBLEMS
    assert rejected[-1] == {
        "code": "more_problems",
        "message": "... and 30 more problem(s)",
        "nodes": [],
        "path": "",
        "more": 30,
    }
    assert rejected_problem_count(rejected) == 50
    # the repair request still carries every problem; its prompt builder shortens them
    assert len(planner.requests[1].problems) == 50


def test_rejected_attempt_with_few_problems_has_no_marker() -> None:
    rejected = rejected_summary([Problem("empty_plan", "plan has no nodes", path="nodes")])
    assert rejected == [{"code": "empty_plan", "message": "plan has no nodes", "nodes": [], "path": "nodes"}]
    assert rejected_problem_count(rejected) == 1


def test_last_attempt_error_is_capped() -> None:
    planner = ScriptedPlanner({"nodes": [node(str(i), "nope") for i in range(1, 51)]})
    with pytest.raises(PlanningError) as caught:
        plan_with_repairs(planner, PlanRequest(goal="g", tools=TOOLS), finish, repair_attempts=0)
    assert len(caught.value.problems) == 50
    assert str(caught.value).endswith("\n  ... and 30 more problem(s)")
    assert len(str(caught.value).splitlines()) == 22
