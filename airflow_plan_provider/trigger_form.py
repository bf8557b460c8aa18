"""The trigger form of a plan DAG: its Params, the DAG's tools listed beside the ready-plan field, and an
example plan written from those tools.

Airflow draws a Param's ``description_md`` as Markdown in a small font, where an inline code box is
taller than the line it sits on and covers the lines above and below it. The form therefore marks
names in bold, not as inline code; the example plan is a fenced block, drawn on its own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from airflow.sdk import Param

from airflow_plan_provider.plan.budgets import Budgets
from airflow_plan_provider.tools.registry import ToolRegistry
from airflow_plan_provider.tools.tool import Tool

#: JSON Schema types whose value a node usually takes from an earlier node's output.
_STRUCTURED = frozenset({"object", "array"})


def tools_markdown(tools: Mapping[str, Tool]) -> str:
    """The tools a ready plan may call, for the trigger form: one line each, with its params (name, type,
    optional or not) and the first line of its description."""
    lines = []
    for name in sorted(tools):
        tool = tools[name]
        required = set(_schema(tool).get("required") or [])
        params = [
            f"{param} ({_kind(spec)}{'' if param in required else ', optional'})"
            for param, spec in _properties(tool).items()
        ]
        summary = (tool.description or "").strip().splitlines()[0] if (tool.description or "").strip() else ""
        risky = " Needs approval." if tool.needs_approval else ""
        lines.append(f"- **{name}**: {summary}{risky} Params: {', '.join(params) or 'none'}.")
    for source in tools.sources if isinstance(tools, ToolRegistry) else ():
        origin = source.declaration()
        lines.append(
            f"- the tools of {origin['kind'].upper()} server **{origin['conn_id']}** (Airflow connection), "
            f"named {origin['prefix']}<tool>: listed when a run plans (the run's Plan tab shows them)."
        )
    return "\n".join(lines)


def ready_plan_example(tools: Mapping[str, Tool]) -> str:
    """A plan written from ``tools``, for the trigger form: up to two nodes calling tools that need no
    earlier output, and a node calling a tool that takes one, fed by them (``${1}``, ``${2}``). Each node
    gives its tool's required params: the schema's default, first enum value or example where it has
    one, a reference for an object or array (or untyped) param, else a placeholder naming the param.
    The same tools give the same text."""
    names = sorted(tools)
    consumer = next((name for name in names if _takes_output(tools[name])), None)
    sources = [name for name in names if name != consumer and not _takes_output(tools[name])][:2]
    nodes: list[dict[str, Any]] = []
    for index, name in enumerate(sources, start=1):
        nodes.append(_node(str(index), tools[name], references=[]))
    if consumer is not None:
        nodes.append(_node(str(len(nodes) + 1), tools[consumer], references=[n["id"] for n in nodes]))
    edges = [{"from": n["id"], "to": nodes[-1]["id"]} for n in nodes[:-1]] if consumer else []
    lines = ",\n".join(_node_lines(node) for node in nodes)
    return '{\n  "nodes": [\n' + lines + '\n  ],\n  "edges": ' + json.dumps(edges) + "\n}"


def _node_lines(node: Mapping[str, Any]) -> str:
    """A node of the example on two lines, its params on the second (the form's box is narrow)."""
    head = json.dumps({k: v for k, v in node.items() if k != "params"})[:-1]
    return f'    {head},\n     "params": {json.dumps(node["params"])}}}'


def plan_params(
    goal: str = "",
    budgets: Budgets | None = None,
    tools: Mapping[str, Tool] | None = None,
    *,
    frozen: bool = False,
    replans: bool = True,
) -> dict[str, Param]:
    """The trigger form: a goal, an optional ready plan (with the DAG's ``tools`` listed beside it and an
    example written from them), and the session budgets.

    Only the fields that apply: a DAG that runs its own ``frozen`` plan has no goal, ready plan or replan
    budget (its goal is its plan's, and it never replans); one that does not ``replans`` has no replan
    budget.
    """
    budgets = budgets or Budgets()
    form: dict[str, Param] = {}
    if not frozen:
        form["goal"] = Param(goal, type="string", title="Goal", description="What the plan should achieve.")
        form["plan"] = _ready_plan_param(tools)
    if replans and not frozen:
        form["max_replans"] = Param(
            budgets.max_replans,
            type="integer",
            minimum=0,
            title="Max replans",
            description=(
                "How many times the session may replan the part of the plan a failed node (or a node "
                "whose result made the rest moot) affects; each replan is a new run of this DAG. "
                "0: a failed node fails the session."
            ),
        )
    form["max_steps"] = Param(
        budgets.max_steps,
        type="integer",
        minimum=1,
        title="Max node executions",
        description=(
            "How many node executions (tool calls) the session may make across all its runs; "
            "reused nodes do not count. Nodes past the budget are skipped and the session fails "
            "with reason step_budget."
        ),
    )
    return form


def _ready_plan_param(tools: Mapping[str, Tool] | None) -> Param:
    text = (
        "Optional. A plan to run as given: the planner is skipped, the plan is validated as is "
        "(an invalid one is rejected with its problems) and never replanned. Each node calls one "
        "of this DAG's tools; ${ID} passes node ID's output, ${ID.field} part of it."
    )
    if tools:
        text += (
            " For example, with this DAG's tools (put your own values in):\n\n```json\n"
            + ready_plan_example(tools)
            + "\n```"
        )
    if tools or (isinstance(tools, ToolRegistry) and tools.sources):
        text += "\n\n**This DAG's tools**\n\n" + tools_markdown(tools)
    return Param(None, type=["null", "object"], title="Ready plan", description_md=text)


def _node(node_id: str, tool: Tool, references: list[str]) -> dict[str, Any]:
    """One node of the example, calling ``tool``; its structured params take ``references`` in turn."""
    required = set(_schema(tool).get("required") or [])
    params: dict[str, Any] = {}
    feeds = iter(references)
    for param, spec in _properties(tool).items():
        if param in required:
            params[param] = _example_value(param, spec, feeds)
    return {"id": node_id, "action": tool.name.replace("_", " "), "tool": tool.name, "params": params}


def _example_value(param: str, spec: Mapping[str, Any], feeds: Any) -> Any:
    for key in ("default", "examples", "enum"):
        if key in spec:
            return spec[key][0] if key != "default" and spec[key] else spec[key]
    kinds = set(_types(spec))
    if not kinds or kinds & _STRUCTURED:
        feed = next(feeds, None)
        if feed is not None:
            return f"${{{feed}}}"
        return [] if kinds == {"array"} else {}
    kind = sorted(kinds)[0]
    return {"integer": 1, "number": 1.0, "boolean": True, "null": None}.get(kind, f"<{param}>")


def _takes_output(tool: Tool) -> bool:
    """Whether a required param of ``tool`` is structured (or untyped): a value from an earlier node."""
    required = set(_schema(tool).get("required") or [])
    return any(
        not _types(spec) or set(_types(spec)) & _STRUCTURED
        for param, spec in _properties(tool).items()
        if param in required
    )


def _schema(tool: Tool) -> Mapping[str, Any]:
    return tool.args_schema if isinstance(tool.args_schema, Mapping) else {}


def _properties(tool: Tool) -> dict[str, Mapping[str, Any]]:
    properties = _schema(tool).get("properties") or {}
    return {str(k): v if isinstance(v, Mapping) else {} for k, v in properties.items()}


def _types(spec: Mapping[str, Any]) -> list[str]:
    kind = spec.get("type")
    if isinstance(kind, list):
        return [str(k) for k in kind]
    if kind is None:
        options = [option for option in spec.get("anyOf") or [] if isinstance(option, Mapping)]
        return [kind for option in options for kind in _types(option)]
    return [str(kind)]


def _kind(spec: Mapping[str, Any]) -> str:
    return "/".join(_types(spec)) or "any"
