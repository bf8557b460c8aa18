"""The seed scenario as a scripted plan: "find why the payment API got slow yesterday and write a report".

Nodes 1-4 query independently (latency, dependency health, deploys, error logs), 5 correlates (after
1-4), 6 writes the report (after 5): layers ``[1, 2, 3, 4] → [5] → [6]``. The tool names match
:func:`seed_tools`-style scripted tools, not the real tools of the example DAGs' demo.
"""

from __future__ import annotations

from typing import Any

from airflow_plan_provider.testing.scripted import CallLog, ScriptedPlanner, ScriptedTool

SEED_GOAL = "find why the payment API got slow yesterday"


def seed_plan(optional_4_to_5: bool = False, goal: str = SEED_GOAL) -> dict[str, Any]:
    nodes = [
        {"id": "1", "action": "query latency metrics", "tool": "query_metrics", "params": {}},
        {"id": "2", "action": "query dependency health", "tool": "query_service_health", "params": {}},
        {"id": "3", "action": "query deploy records", "tool": "query_deploys", "params": {}},
        {"id": "4", "action": "query error logs", "tool": "query_error_logs", "params": {}},
        {
            "id": "5",
            "action": "correlate latency",
            "tool": "analyze",
            "params": {"latency": "${1}", "logs": "${4}"},
        },
        {"id": "6", "action": "write the report", "tool": "report", "params": {"finding": "${5}"}},
    ]
    edges = [{"from": n, "to": "5"} for n in "123"] + [{"from": "4", "to": "5", "optional": optional_4_to_5}]
    edges.append({"from": "5", "to": "6"})
    return {"goal": goal, "nodes": nodes, "edges": edges}


def seed_revision() -> dict[str, Any]:
    """The replacement subgraph after node 3 found no deploys: node 5 correlates with dependency health,
    node 6 is unchanged (so the plan diff is revised ["5"])."""
    return {
        "nodes": [
            {
                "id": "5",
                "action": "correlate latency with dependency health",
                "tool": "analyze",
                "params": {"latency": "${1}", "health": "${2}"},
            },
            seed_plan()["nodes"][5],
        ],
        "edges": [{"from": "1", "to": "5"}, {"from": "2", "to": "5"}, {"from": "5", "to": "6"}],
    }


def seed_tools(log: CallLog, **overrides: dict[str, Any]) -> list[ScriptedTool]:
    """Scripted tools for :func:`seed_plan`; ``overrides`` change one tool's behaviour, e.g.
    ``seed_tools(log, query_deploys={"permanent": "403"})``."""
    spec: dict[str, dict[str, Any]] = {
        "query_metrics": {"returns": {"p99": 870}},
        "query_service_health": {"returns": {"fraud-check": "degraded"}},
        "query_deploys": {"returns": []},
        "query_error_logs": {"returns": {"timeouts": 412}},
        "analyze": {
            "returns": lambda params: {"inputs": sorted(k for k, v in params.items() if v is not None)}
        },
        "report": {"returns": lambda params: {"report": params["finding"]}},
    }
    for name, change in overrides.items():
        spec[name] = {**spec[name], **change}
    return [ScriptedTool(name, log=log, **kwargs) for name, kwargs in spec.items()]


def seed_replan_story(
    log: CallLog, *, optional_4_to_5: bool = False
) -> tuple[ScriptedPlanner, list[ScriptedTool]]:
    """The seed story with one replan: node 3 finds no deploys and asks for a replan, and the planner
    answers with :func:`seed_revision` (node 5 revised). Returns the planner and the scripted tools."""
    tools = seed_tools(log, query_deploys={"replan": "no deploys yesterday"})
    planner = ScriptedPlanner(seed_plan(optional_4_to_5), on_error=[("no deploys", seed_revision())])
    return planner, tools
