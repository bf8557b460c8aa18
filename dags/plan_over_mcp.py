"""Plan over an MCP server: the payment-latency investigation with its queries served by MCP.

The same goal and planner as ``plan_and_execute``; here the latency, dependency-health and error-log
queries are tools of the demo's MCP server (``plan_demo/mcp_server.py``, the ``mcp`` SDK's own server),
reached through the Airflow connection ``plan_demo_mcp`` (conn type ``mcp``: stdio or streamable HTTP).
The planning task lists the server's tools when a run plans (the run's Plan tab shows them, and where
each node's tool comes from); the deploy query, the correlation and the report writer are Python tools.
`make demo` and `make airflow` define the connection.
"""

from __future__ import annotations

from airflow_plan_provider import NodeExecution, build_plan_dag
from plan_demo.planner import payment_latency_planner
from plan_demo.tools import mcp_registry

plan_over_mcp = build_plan_dag(
    "plan_over_mcp",
    planner=payment_latency_planner(),
    tools=mcp_registry,
    goal="find why the payment API got slow yesterday and write a report",
    execution=NodeExecution(max_active_nodes=5),
    tags=["example", "plan", "mcp"],
    doc_md=__doc__,
    description="Plan a latency investigation over the tools of an MCP server and Python tools.",
)
