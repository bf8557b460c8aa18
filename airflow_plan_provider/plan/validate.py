"""Plan validation: every rule checked, every problem reported, nothing silently repaired."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from airflow_plan_provider.exceptions import PlanValidationError
from airflow_plan_provider.plan.graph import find_cycle, topological_layers
from airflow_plan_provider.plan.model import Edge, Node, Plan, ValidatedPlan
from airflow_plan_provider.plan.problems import Problem
from airflow_plan_provider.plan.references import contains_reference, iter_references

if TYPE_CHECKING:
    from airflow_plan_provider.tools.registry import Tool


@dataclass(frozen=True)
class Limits:
    """Size limits. ``max_depth`` is the number of layers a plan may have (the DAG's layer tasks)."""

    max_nodes: int = 200
    max_depth: int = 10


def _loc(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc)


def _schema_problems(error: ValidationError, prefix: str, nodes: tuple[str, ...] = ()) -> list[Problem]:
    return [
        Problem("schema", f"{e['msg']}", nodes, path=_loc((prefix, *e["loc"])) if prefix else _loc(e["loc"]))
        for e in error.errors()
    ]


def _parse(raw: Any) -> tuple[Plan | None, list[Problem]]:
    """Parse element by element so one malformed node does not hide the problems of the others."""
    if isinstance(raw, Plan):
        return raw, []
    if isinstance(raw, str | bytes):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as error:
            return None, [Problem("schema", f"plan is not valid JSON: {error}")]
    if not isinstance(raw, Mapping):
        return None, [Problem("schema", f"plan must be a JSON object, got {type(raw).__name__}")]
    problems: list[Problem] = []
    unknown = sorted(set(raw) - set(Plan.model_fields))
    for key in unknown:
        problems.append(Problem("schema", f"unknown top-level field {key!r}", path=str(key)))
    goal = raw.get("goal", "")
    if not isinstance(goal, str):
        problems.append(Problem("schema", "goal must be a string", path="goal"))
        goal = str(goal)
    raw_nodes, raw_edges = raw.get("nodes"), raw.get("edges", [])
    if not isinstance(raw_nodes, list):
        problems.append(Problem("schema", "'nodes' must be a list of nodes", path="nodes"))
        raw_nodes = []
    if not isinstance(raw_edges, list):
        problems.append(Problem("schema", "'edges' must be a list of edges", path="edges"))
        raw_edges = []
    nodes: list[Node] = []
    for index, item in enumerate(raw_nodes):
        try:
            nodes.append(Node.model_validate(item))
        except ValidationError as error:
            node_id = str(item.get("id")) if isinstance(item, Mapping) and "id" in item else ()
            problems += _schema_problems(error, f"nodes[{index}]", (node_id,) if node_id else ())
    edges: list[Edge] = []
    for index, item in enumerate(raw_edges):
        try:
            edges.append(Edge.model_validate(item))
        except ValidationError as error:
            problems += _schema_problems(error, f"edges[{index}]")
    return Plan(goal=goal, nodes=nodes, edges=edges), problems


def _param_problems(node: Node, tool: Tool) -> list[Problem]:
    problems = []
    for error in tool.validator.iter_errors(node.params):
        if contains_reference(error.instance):
            continue  # checked again once the reference is resolved, right before the call
        path = "params" + "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        problems.append(
            Problem(
                "bad_params",
                f"node {node.id!r} ({tool.name}): {error.message}",
                (node.id,),
                path=path,
                detail={"schema_path": "/".join(str(p) for p in error.absolute_schema_path)},
            )
        )
    return problems


def validate_plan(
    plan: Plan | Mapping[str, Any] | str | bytes,
    tools: Mapping[str, Tool] | None = None,
    limits: Limits | None = None,
) -> ValidatedPlan:
    """Check a plan and compute its layers.

    ``tools`` maps tool names to tools; when given, unknown tools and params that break a tool's
    argument schema are problems. Raises :class:`PlanValidationError` listing every problem.

    >>> plan = validate_plan({"nodes": [{"id": "1", "action": "a", "tool": "t"},
    ...                                 {"id": "2", "action": "b", "tool": "t", "dependencies": ["1"]}]})
    >>> plan.layers
    [['1'], ['2']]
    """
    limits = limits or Limits()
    parsed, problems = _parse(plan)
    if parsed is None:
        raise PlanValidationError(problems)
    if not parsed.nodes and not problems:
        problems.append(Problem("empty_plan", "plan has no nodes", path="nodes"))
    if len(parsed.nodes) > limits.max_nodes:
        problems.append(
            Problem("too_many_nodes", f"plan has {len(parsed.nodes)} nodes; the limit is {limits.max_nodes}")
        )

    counts = Counter(node.id for node in parsed.nodes)
    for node_id, count in counts.items():
        if count > 1:
            problems.append(Problem("duplicate_id", f"node id {node_id!r} is used {count} times", (node_id,)))
    ids = set(counts)
    parents: dict[str, set[str]] = {node_id: set() for node_id in counts}
    soft: set[tuple[str, str]] = set()

    for index, edge in enumerate(parsed.edges):
        missing = [end for end in (edge.source, edge.target) if end not in ids]
        if missing:
            problems.append(
                Problem(
                    "dangling_edge",
                    f"edge {edge.source} -> {edge.target} names unknown node(s) {', '.join(missing)}",
                    tuple(missing),
                    path=f"edges[{index}]",
                )
            )
        elif edge.source == edge.target:
            problems.append(
                Problem("self_loop", f"node {edge.source!r} depends on itself", (edge.source,), f"edges[{index}]")
            )
        else:
            parents[edge.target].add(edge.source)
            if edge.optional:
                soft.add((edge.source, edge.target))

    # A parent with a hard edge and a soft edge is hard.
    hard = {(e.source, e.target) for e in parsed.edges if not e.optional}
    soft -= hard

    for index, node in enumerate(parsed.nodes):
        if tools is not None:
            tool = tools.get(node.tool)
            if tool is None:
                problems.append(
                    Problem(
                        "unknown_tool",
                        f"node {node.id!r} uses unknown tool {node.tool!r}; known tools: {', '.join(sorted(tools))}",
                        (node.id,),
                        path=f"nodes[{index}].tool",
                    )
                )
            else:
                problems += _param_problems(node, tool)
        for ref in iter_references(node.params):
            if ref.node_id not in ids:
                problems.append(
                    Problem(
                        "bad_reference",
                        f"node {node.id!r} refers to unknown node {ref.node_id!r}",
                        (node.id, ref.node_id),
                        path=f"nodes[{index}].{ref.location}",
                    )
                )
            elif ref.node_id == node.id:
                problems.append(
                    Problem(
                        "bad_reference",
                        f"node {node.id!r} refers to its own output",
                        (node.id,),
                        path=f"nodes[{index}].{ref.location}",
                    )
                )
            else:
                parents[node.id].add(ref.node_id)

    layers: list[list[str]] = []
    cycle = find_cycle(parents)
    if cycle is not None:
        problems.append(Problem("cycle", f"plan has a cycle: {' -> '.join(cycle)}", tuple(cycle)))
    else:
        layers = topological_layers(parents)
        if len(layers) > limits.max_depth:
            problems.append(
                Problem(
                    "too_deep",
                    f"plan needs {len(layers)} layers; this DAG runs at most {limits.max_depth}",
                    tuple(layers[limits.max_depth]),
                )
            )
    if problems:
        raise PlanValidationError(problems)
    return ValidatedPlan(
        goal=parsed.goal,
        nodes=parsed.nodes,
        edges=parsed.edges,
        layers=layers,
        parents={node_id: sorted(p, key=str) for node_id, p in parents.items()},
        soft_edges=sorted(soft),
    )
