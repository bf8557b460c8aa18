"""Plan DAGs whose tools come from MCP servers and a PostgreSQL table (tests/e2e/test_mcp_sources.py).

The connections come from the cluster's environment: ``e2e_mcp_stdio`` (``tests/mcp_server.py`` over
stdio, started by each call), ``e2e_mcp_http`` (the same server over streamable HTTP, started by the
test) and ``e2e_pg`` (a PostgreSQL database holding ``orders``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow_plan_provider import NodeExecution, build_plan_dag
from airflow_plan_provider.testing import CallLog, ScriptedPlanner, ScriptedTool, scripted_registry
from airflow_plan_provider.tools.mcp import McpServer
from airflow_plan_provider.tools.sql import sql_tool

CALL_LOG_ENV = "PLAN_E2E_CALL_LOG"  # the folder the test gives every process for call logs


def call_log(dag_id: str) -> CallLog:
    return CallLog.in_folder_of(CALL_LOG_ENV, dag_id)


def summary(params: dict[str, Any]) -> dict[str, Any]:
    return {"looked_up": params["found"], "orders": params["orders"]["rows"], "index": params["index"]}


STDIO_PLAN = {
    "goal": "summarize the orders",
    "nodes": [
        {"id": "1", "action": "look the table up", "tool": "mcp.lookup", "params": {"key": "orders"}},
        {
            "id": "2",
            "action": "read the orders",
            "tool": "orders_sql",
            "params": {"sql": "SELECT id, amount FROM orders ORDER BY id"},
        },
        {"id": "3", "action": "read the index", "tool": "mcp.broken", "params": {"reason": "index offline"}},
        {
            "id": "4",
            "action": "summarize",
            "tool": "summarize",
            "params": {"found": "${1}", "orders": "${2}", "index": "${3}"},
        },
    ],
    "edges": [],
}
AROUND_THE_INDEX = {
    "nodes": [
        {"id": "3", "action": "look the index up", "tool": "mcp.lookup", "params": {"key": "index"}},
        STDIO_PLAN["nodes"][3],
    ],
    "edges": [],
}
stdio_tools = scripted_registry(ScriptedTool("summarize", log=call_log("e2e_mcp_stdio"), returns=summary))
stdio_tools.add_source(McpServer("e2e_mcp_stdio", prefix="mcp."))
stdio_tools.add(sql_tool("e2e_pg", tables=["orders"], name="orders_sql", row_limit=10))

e2e_mcp_stdio = build_plan_dag(
    "e2e_mcp_stdio",
    planner=ScriptedPlanner(STDIO_PLAN, on_error=[("broken on purpose", AROUND_THE_INDEX)]),
    tools=stdio_tools,
    execution=NodeExecution(retries=1, retry_delay=timedelta(seconds=1)),
    tags=["e2e"],
)

HTTP_PLAN = {
    "goal": "record the invoice, then look it up",
    "nodes": [
        {
            "id": "1",
            "action": "record the invoice",
            "tool": "mcp.record",
            "params": {"item": "inv-7", "seconds": 8},
        },
        {"id": "2", "action": "look it up", "tool": "mcp.lookup", "params": {"key": "${1.item}"}},
    ],
    "edges": [],
}
http_tools = scripted_registry()
http_tools.add_source(McpServer("e2e_mcp_http", prefix="mcp.", timeout=30))

e2e_mcp_http = build_plan_dag(
    "e2e_mcp_http",
    planner=ScriptedPlanner(HTTP_PLAN),
    tools=http_tools,
    execution=NodeExecution(retries=6, retry_delay=timedelta(seconds=2)),
    tags=["e2e"],
)
