"""Plan validation: every rule checked, every problem reported, nothing silently repaired."""

from __future__ import annotations

import functools
import gc
import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from graphlib import CycleError
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from pydantic import TypeAdapter, ValidationError

from airflow_plan_provider.exceptions import PlanValidationError
from airflow_plan_provider.plan.graph import topological_layers
from airflow_plan_provider.plan.model import Edge, Node, Plan, ValidatedPlan
from airflow_plan_provider.plan.references import (
    MAX_DEPTH,
    ParamsTooNested,
    Reference,
    contains_reference,
    iter_strings,
    references_in,
)
from airflow_plan_provider.problems import Problem

if TYPE_CHECKING:
    from airflow_plan_provider.tools.tool import Tool


@dataclass(frozen=True)
class Limits:
    """Size limits on a plan.

    ``max_nodes`` caps the nodes (a plan may be as deep as it has nodes: nodes do not run by layers),
    and a plan may have
    ``max_edges_per_node`` times ``max_nodes`` edges (:attr:`max_edges`; ``dependencies`` count as
    edges). The rest bound what one node holds, so that a plan from an untrusted planner or conf costs
    little to check and to store:
    ``max_param_depth`` levels of dicts and lists in ``params`` (the params object is level 1),
    ``max_param_chars`` characters in one string inside ``params`` (64 KiB: room for a query or a
    prompt; larger data belongs in an upstream output, passed by reference), and ``max_text_chars``
    characters in a node's ``action``, ``tool`` or ``expected_outcome`` (a few words each).
    """

    max_nodes: int = 200
    max_edges_per_node: int = 10
    max_param_depth: int = 32
    max_param_chars: int = 64 * 1024
    max_text_chars: int = 2000

    def __post_init__(self) -> None:
        for name in (
            "max_nodes",
            "max_edges_per_node",
            "max_param_depth",
            "max_param_chars",
            "max_text_chars",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Limits.{name} must be a positive integer, got {value!r}")
        if self.max_param_depth > MAX_DEPTH:
            # resolving references at run time walks params up to MAX_DEPTH levels only
            raise ValueError(
                f"Limits.max_param_depth must be at most {MAX_DEPTH}, got {self.max_param_depth}"
            )

    @property
    def max_edges(self) -> int:
        """The most edges a plan may have: ``max_edges_per_node`` times ``max_nodes``."""
        return self.max_edges_per_node * self.max_nodes


UNCHECKED_OVER = 2
"""A plan of more than this many times ``Limits.max_nodes`` nodes (or ``Limits.max_edges`` edges) is
rejected for its size alone, without checking node by node: a plan a little over the limit gets every
problem reported, a huge one costs no more to reject than a small one."""

_NODES: TypeAdapter[list[Node]] = TypeAdapter(list[Node])
_EDGES: TypeAdapter[list[Edge]] = TypeAdapter(list[Edge])


def _loc(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc)


def _schema_problems(error: ValidationError, prefix: str, nodes: tuple[str, ...] = ()) -> list[Problem]:
    return [
        Problem("schema", f"{e['msg']}", nodes, path=_loc((prefix, *e["loc"])) if prefix else _loc(e["loc"]))
        for e in error.errors()
    ]


def _size_problems(nodes: int, edges: int, limits: Limits, unchecked: bool = False) -> list[Problem]:
    """``too_many_nodes`` / ``too_many_edges`` for a plan of ``nodes`` nodes and ``edges`` edges."""
    more = " (too many to check one by one)" if unchecked else ""
    problems = []
    if nodes > limits.max_nodes:
        problems.append(
            Problem("too_many_nodes", f"plan has {nodes} nodes; the limit is {limits.max_nodes}{more}")
        )
    if edges > limits.max_edges:
        problems.append(
            Problem("too_many_edges", f"plan has {edges} edges; the limit is {limits.max_edges}{more}")
        )
    return problems


def _unchecked(nodes: int, edges: int, limits: Limits) -> bool:
    return nodes > UNCHECKED_OVER * limits.max_nodes or edges > UNCHECKED_OVER * limits.max_edges


def _raw_id(raw_node: Any) -> tuple[str, ...]:
    """The id of a node that failed to parse, to name it in its problems, if it is a plain value."""
    node_id = raw_node.get("id") if isinstance(raw_node, Mapping) else None
    return (str(node_id),) if isinstance(node_id, str | int | float) and str(node_id) else ()


def _parse(raw: Any, limits: Limits | None = None) -> tuple[Plan | None, list[Problem]]:
    """Parse element by element so one malformed node does not hide the problems of the others.

    With ``limits``, a plan of more than :data:`UNCHECKED_OVER` times ``limits.max_nodes`` nodes or
    ``limits.max_edges`` edges (in ``edges``) is not parsed further: its only problems are its size and
    those of its top-level fields.
    """
    if isinstance(raw, Plan):
        return raw, []
    if isinstance(raw, str | bytes):
        try:
            raw = json.loads(raw)
        except ValueError as error:  # JSONDecodeError, or bytes that are not UTF-8/16/32
            return None, [Problem("schema", f"plan is not valid JSON: {error}")]
        except RecursionError:
            return None, [Problem("schema", "plan is not valid JSON: nested too deeply")]
    if not isinstance(raw, Mapping):
        return None, [Problem("schema", f"plan must be a JSON object, got {type(raw).__name__}")]
    problems: list[Problem] = []
    unknown = sorted(set(raw) - set(Plan.model_fields), key=str)
    for key in unknown:
        problems.append(Problem("schema", f"unknown top-level field {key!r}", path=str(key)))
    goal = raw.get("goal", "")
    if not isinstance(goal, str):
        problems.append(Problem("schema", "goal must be a string", path="goal"))
        goal = ""
    raw_nodes, raw_edges = raw.get("nodes"), raw.get("edges", [])
    if not isinstance(raw_nodes, list):
        problems.append(Problem("schema", "'nodes' must be a list of nodes", path="nodes"))
        raw_nodes = []
    if not isinstance(raw_edges, list):
        problems.append(Problem("schema", "'edges' must be a list of edges", path="edges"))
        raw_edges = []
    if limits is not None and _unchecked(len(raw_nodes), len(raw_edges), limits):
        return None, [*problems, *_size_problems(len(raw_nodes), len(raw_edges), limits, unchecked=True)]
    nodes: list[Node] = []
    try:
        nodes = _NODES.validate_python(raw_nodes)  # the whole list at once; element by element on failure
    except ValidationError:
        for index, item in enumerate(raw_nodes):
            try:
                nodes.append(Node.model_validate(item))
            except ValidationError as error:
                problems += _schema_problems(error, f"nodes[{index}]", _raw_id(item))
    edges: list[Edge] = []
    try:
        edges = _EDGES.validate_python(raw_edges)
    except ValidationError:
        for index, item in enumerate(raw_edges):
            try:
                edges.append(Edge.model_validate(item))
            except ValidationError as error:
                problems += _schema_problems(error, f"edges[{index}]")
    return Plan(goal=goal, nodes=nodes, edges=edges), problems


# Keywords whose verdict depends only on an object's keys or an array's length: a reference among the
# values cannot change it, so such an error stands even when the instance holds a reference.
_SHAPE_KEYWORDS = frozenset(
    {
        "required",
        "additionalProperties",
        "minProperties",
        "maxProperties",
        "dependentRequired",
        "minItems",
        "maxItems",
    }
)

Check = Callable[[Any], bool]

# Exact type tests that imply the JSON Schema type (stricter than jsonschema: a miss falls back to it).
_TYPE_CHECKS: dict[str, Check] = {
    "string": lambda v: type(v) is str,
    "integer": lambda v: type(v) is int,
    "number": lambda v: type(v) is int or type(v) is float,
    "boolean": lambda v: type(v) is bool,
    "null": lambda v: v is None,
}
_ANNOTATION_KEYWORDS = frozenset({"title", "description", "default", "examples"})


def _always(value: Any) -> bool:
    return True


def _never(value: Any) -> bool:
    return False


def _fast_check(schema: Any) -> Check | None:
    """A quick test for the common shape of argument schemas (typed properties, ``required``,
    ``additionalProperties``, ``items``, ``anyOf``), or None for a schema outside that shape.

    The test returning True guarantees jsonschema finds no error; False only means "ask jsonschema",
    so every reported problem still comes from jsonschema.
    """
    if schema is True:
        return _always
    if not isinstance(schema, dict):
        return None
    keywords = set(schema) - _ANNOTATION_KEYWORDS
    if not keywords:
        return _always
    if keywords == {"anyOf"} and isinstance(schema["anyOf"], list):
        options = [_fast_check(option) for option in schema["anyOf"]]
        alternatives = [option for option in options if option is not None]
        if len(alternatives) < len(options):
            return None
        return lambda v: any(option(v) for option in alternatives)
    kind = schema.get("type")
    if not isinstance(kind, str):
        return None
    if kind in _TYPE_CHECKS and keywords == {"type"}:
        return _TYPE_CHECKS[kind]
    if kind == "array" and keywords <= {"type", "items"}:
        items = _fast_check(schema.get("items", True))
        if items is None:
            return None
        return lambda v: type(v) is list and all(items(item) for item in v)
    if kind == "object" and keywords <= {"type", "properties", "required", "additionalProperties"}:
        properties = schema.get("properties", {})
        required = schema.get("required", [])
        extra = schema.get("additionalProperties", True)
        if not isinstance(properties, dict) or not isinstance(required, list):
            return None
        if not all(isinstance(name, str) for name in required):
            return None
        checks = {name: _fast_check(sub) for name, sub in properties.items()}
        known = {name: check for name, check in checks.items() if check is not None}
        extra_check = _never if extra is False else _fast_check(extra)
        if extra_check is None or len(known) < len(checks):
            return None

        def check_object(value: Any) -> bool:
            if type(value) is not dict or any(name not in value for name in required):
                return False
            return all(known.get(name, extra_check)(item) for name, item in value.items())

        return check_object
    return None


def _needs_reading(params: dict[str, Any], max_chars: int) -> bool:
    """False for flat params with no string to read (no ``${``, none too large): the common case."""
    for value in params.values():
        if isinstance(value, str):
            if "${" in value or len(value) > max_chars:
                return True
        elif isinstance(value, Mapping | list):
            return True
    return False


def _scan_params(node: Node, index: int, limits: Limits) -> tuple[list[Reference], list[Problem], bool]:
    """The references in a node's params, the params' size problems (``too_nested``,
    ``param_too_large``), and whether the params nest too deeply (then they are not read further)."""
    references: list[Reference] = []
    problems: list[Problem] = []
    try:
        for location, text in iter_strings(node.params, max_depth=limits.max_param_depth):
            if len(text) > limits.max_param_chars:
                problems.append(
                    Problem(
                        "param_too_large",
                        f"node {node.id!r}: {location} holds {len(text)} characters; "
                        f"the limit is {limits.max_param_chars}",
                        (node.id,),
                        path=f"nodes[{index}].{location}",
                    )
                )
            else:
                references += references_in(text, location)
    except ParamsTooNested as error:
        message = f"node {node.id!r}: params nest dicts and lists deeper than {limits.max_param_depth} levels"
        return [], [Problem("too_nested", message, (node.id,), path=f"nodes[{index}].{error.location}")], True
    return references, problems, False


def _text_problems(node: Node, index: int, limits: Limits) -> list[Problem]:
    """A ``too_long`` problem for each of the node's action, tool and expected outcome over the limit."""
    problems = []
    for name in ("action", "tool", "expected_outcome"):
        text = getattr(node, name)
        if text is not None and len(text) > limits.max_text_chars:
            problems.append(
                Problem(
                    "too_long",
                    f"node {node.id!r}: {name} has {len(text)} characters; "
                    f"the limit is {limits.max_text_chars}",
                    (node.id,),
                    path=f"nodes[{index}].{name}",
                )
            )
    return problems


def _param_problems(node: Node, tool: Tool) -> list[Problem]:
    problems = []
    for error in tool.validator.iter_errors(node.params):
        if error.validator not in _SHAPE_KEYWORDS and contains_reference(error.instance):
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


#: what :func:`_scan_params` finds in params too small to hold anything to find
NOT_READ: tuple[Sequence[Reference], Sequence[Problem], bool] = ((), (), False)
P = ParamSpec("P")
R = TypeVar("R")


def _cyclic_gc_paused(func: Callable[P, R]) -> Callable[P, R]:
    """Run ``func`` with the cyclic garbage collector paused.

    Validation allocates many small objects that form no reference cycles (reference counting frees
    them); on plans of thousands of nodes the collector would otherwise traverse them again and again
    (``bench/validate.py``).
    """

    @functools.wraps(func)
    def paused(*args: P.args, **kwargs: P.kwargs) -> R:
        if not gc.isenabled():
            return func(*args, **kwargs)
        gc.disable()
        try:
            return func(*args, **kwargs)
        finally:
            gc.enable()

    return paused


@_cyclic_gc_paused
def validate_plan(
    plan: Plan | Mapping[str, Any] | str | bytes,
    tools: Mapping[str, Tool] | None = None,
    limits: Limits | None = None,
) -> ValidatedPlan:
    """Check a plan and compute its layers.

    ``tools`` maps tool names to tools; when given, unknown tools and params that break a tool's
    argument schema are problems. ``limits`` bounds the plan's size (:class:`Limits`); a plan far over
    the node or edge limit is rejected for its size alone (:data:`UNCHECKED_OVER`), and a node whose
    params nest too deeply gets that one problem, its params not read further. Raises
    :class:`PlanValidationError` listing every problem.

    >>> plan = validate_plan({"nodes": [{"id": "1", "action": "a", "tool": "t"},
    ...                                 {"id": "2", "action": "b", "tool": "t", "dependencies": ["1"]}]})
    >>> plan.layers
    [['1'], ['2']]
    """
    limits = limits or Limits()
    parsed, problems = _parse(plan, limits)
    if parsed is None:
        raise PlanValidationError(problems)
    if not parsed.nodes and not problems:
        problems.append(Problem("empty_plan", "plan has no nodes", path="nodes"))
    if _unchecked(len(parsed.nodes), len(parsed.edges), limits):  # a Plan, or edges from dependencies
        raise PlanValidationError(
            [*problems, *_size_problems(len(parsed.nodes), len(parsed.edges), limits, unchecked=True)]
        )
    problems += _size_problems(len(parsed.nodes), len(parsed.edges), limits)
    counts = Counter(node.id for node in parsed.nodes)
    problems += _duplicate_ids(counts)
    ids = set(counts)
    parents, soft, edge_problems = _edge_parents(parsed.edges, counts)
    problems += edge_problems
    fast_checks: dict[str, Check | None] = {}  # each tool's compiled argument check (None: none)
    for index, node in enumerate(parsed.nodes):
        if len(node.action) + len(node.tool) + len(node.expected_outcome or "") > limits.max_text_chars:
            problems += _text_problems(node, index, limits)
        references, size_problems, nested = (
            _scan_params(node, index, limits)
            if _needs_reading(node.params, limits.max_param_chars)
            else NOT_READ
        )
        if tools is not None:
            problems += _tool_problems(node, index, tools, nested, fast_checks)
        problems += size_problems
        if references:
            problems += _reference_parents(node, index, references, ids, parents[node.id])
    layers, cycle_problems = _layers(parents)
    problems += cycle_problems
    if problems:
        raise PlanValidationError(problems)
    return ValidatedPlan(
        goal=parsed.goal,
        nodes=parsed.nodes,
        edges=parsed.edges,
        layers=layers,
        parents={node_id: sorted(p) for node_id, p in parents.items()},
        soft_edges=sorted(soft),
    )


def _duplicate_ids(counts: Counter[str]) -> list[Problem]:
    """A problem for each node id used more than once."""
    return [
        Problem("duplicate_id", f"node id {node_id!r} is used {count} times", (node_id,))
        for node_id, count in counts.items()
        if count > 1
    ]


def _edge_parents(
    edges: Sequence[Edge], ids: Mapping[str, int]
) -> tuple[dict[str, set[str]], set[tuple[str, str]], list[Problem]]:
    """Each node's parents by the edges (``ids``: the node ids, in the plan's order), the soft edges
    (optional, and no hard edge joins the same two nodes: a parent with a hard edge and a soft edge is
    hard), and the edges' problems (an unknown end, a self loop)."""
    parents: dict[str, set[str]] = {node_id: set() for node_id in ids}
    soft: set[tuple[str, str]] = set()
    problems: list[Problem] = []
    for index, edge in enumerate(edges):
        source, target = edge.source, edge.target
        if source in ids and target in ids and source != target:  # the common case first
            parents[target].add(source)
            if edge.optional:
                soft.add((source, target))
            continue
        missing = [end for end in (source, target) if end not in ids]
        if missing:
            problems.append(
                Problem(
                    "dangling_edge",
                    f"edge {source} -> {target} names unknown node(s) {', '.join(missing)}",
                    tuple(missing),
                    path=f"edges[{index}]",
                )
            )
        else:
            problems.append(
                Problem("self_loop", f"node {source!r} depends on itself", (source,), f"edges[{index}]")
            )
    soft -= {(e.source, e.target) for e in edges if not e.optional}
    return parents, soft, problems


def _tool_problems(
    node: Node, index: int, tools: Mapping[str, Tool], nested: bool, fast_checks: dict[str, Check | None]
) -> Sequence[Problem]:
    """The problems of a node's tool (unknown) and of its params against the tool's argument schema
    (not checked when they nest too deeply: those are reported alone, and checking them is unbounded
    work). ``fast_checks`` keeps each tool's compiled check across the nodes."""
    tool = tools.get(node.tool)
    if tool is None:
        return [
            Problem(
                "unknown_tool",
                f"node {node.id!r} uses unknown tool {node.tool!r}; known tools: {', '.join(sorted(tools))}",
                (node.id,),
                path=f"nodes[{index}].tool",
            )
        ]
    if nested:
        return ()
    if node.tool not in fast_checks:
        fast_checks[node.tool] = _fast_check(tool.args_schema)
    fast_check = fast_checks[node.tool]
    return _param_problems(node, tool) if fast_check is None or not fast_check(node.params) else ()


def _reference_parents(
    node: Node, index: int, references: Sequence[Reference], ids: set[str], parents: set[str]
) -> list[Problem]:
    """Add the nodes ``node``'s references name to its ``parents``; a reference to an unknown node or to
    the node itself is a problem."""
    problems: list[Problem] = []
    for ref in references:
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
            parents.add(ref.node_id)
    return problems


def _layers(parents: Mapping[str, set[str]]) -> tuple[list[list[str]], list[Problem]]:
    """The plan's layers, or none and the problem naming a cycle."""
    try:
        return topological_layers(parents), []
    except CycleError as error:
        cycle = [str(node) for node in error.args[1]]
        return [], [Problem("cycle", f"plan has a cycle: {' -> '.join(cycle)}", tuple(cycle))]


def parse_plan(raw: Plan | Mapping[str, Any] | str | bytes) -> Plan:
    """Parse a plan's shape only (no graph or tool checks); raises :class:`PlanValidationError`."""
    parsed, problems = _parse(raw)
    if parsed is None or problems:
        raise PlanValidationError(problems)
    return parsed
