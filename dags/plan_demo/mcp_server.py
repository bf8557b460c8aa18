"""The demo's read-only queries served by an MCP server (the ``mcp`` SDK's own ``MCPServer``).

The example DAG ``plan_over_mcp`` plans over these tools through the Airflow connection
``plan_demo_mcp`` (conn type ``mcp``), beside the Python tools that correlate and write the report::

    python -m plan_demo.mcp_server                          # stdio (the connection's extra.command)
    python -m plan_demo.mcp_server --http 8765              # streamable HTTP on http://127.0.0.1:8765/mcp

Each tool answers from the demo's SQLite data (``PLAN_DEMO_DB``), as :mod:`plan_demo.tools` does; a
tool's error (say an unknown service) is answered as an MCP error result, which fails the node for good.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

from plan_demo import tools

CONN_ID = "plan_demo_mcp"
READ_ONLY = ToolAnnotations(read_only_hint=True, idempotent_hint=True)

server = MCPServer(
    "plan-demo", instructions="Latency, dependency health and error logs of the demo services."
)


def _answer(call: Any, **params: Any) -> dict[str, Any]:
    try:
        return dict(call(**params))
    except Exception as error:  # the demo tools raise PermanentToolError for bad input
        raise ToolError(str(error)) from None


@server.tool(
    description=tools.registry["query_metrics"].description, annotations=READ_ONLY, structured_output=True
)
def query_metrics(service: str, day: str = "yesterday") -> dict[str, Any]:
    return _answer(tools.query_metrics, service=service, day=day)


@server.tool(
    description=tools.registry["query_service_health"].description,
    annotations=READ_ONLY,
    structured_output=True,
)
def query_service_health(service: str, day: str = "yesterday") -> dict[str, Any]:
    return _answer(tools.query_service_health, service=service, day=day)


@server.tool(
    description=tools.registry["query_error_logs"].description, annotations=READ_ONLY, structured_output=True
)
def query_error_logs(service: str, day: str = "yesterday") -> dict[str, Any]:
    return _answer(tools.query_error_logs, service=service, day=day)


def connection(transport: str = "stdio", port: int | None = None, database: str | None = None) -> str:
    """The ``plan_demo_mcp`` connection as the JSON of an ``AIRFLOW_CONN_PLAN_DEMO_MCP`` variable: the
    stdio server started with this interpreter (with the demo's package, and its data at ``database``,
    default ``$PLAN_DEMO_DB``), or the HTTP one on ``port``."""
    if transport == "http":
        return json.dumps({"conn_type": "mcp", "host": f"http://127.0.0.1:{port}/mcp"})
    dags = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    database = database or os.environ.get("PLAN_DEMO_DB")
    env = {"PYTHONPATH": dags, **({"PLAN_DEMO_DB": database} if database else {})}
    extra = {
        "transport": "stdio",
        "command": sys.executable,
        "args": ["-m", "plan_demo.mcp_server"],
        "env": env,
    }
    return json.dumps({"conn_type": "mcp", "extra": extra})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on 127.0.0.1:PORT")
    args = parser.parse_args()
    if args.http:
        server.run("streamable-http", host="127.0.0.1", port=args.http)
    else:
        server.run()


if __name__ == "__main__":
    main()
