"""Run the example plan DAG end to end on a local Airflow (SQLite, LocalExecutor, offline planner).

Starts the scheduler, dag-processor, api-server and triggerer as separate processes on a temporary
AIRFLOW_HOME, triggers ``plan_over_mcp`` through the REST API (its queries are the tools of the demo's MCP
server, ``dags/plan_demo/mcp_server.py``, started over stdio through the connection ``plan_demo_mcp``),
waits for the whole session (including its replan run) and prints where each tool came from, the
SessionResult and the report.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: its harness package

from airflow_plan_provider.contract import PLAN_TASK, TOOLS_KEY
from airflow_plan_provider.tools.tool import ToolOrigin
from harness.cluster import AirflowCluster

ROOT = Path(__file__).resolve().parents[1]
DAG_ID = "plan_over_mcp"


def main() -> int:
    out = Path(os.environ.get("PLAN_DEMO_OUTPUT", ROOT / "output"))
    out.mkdir(parents=True, exist_ok=True)
    env = {"PLAN_REPORT_DIR": str(out / "reports"), "PLAN_DEMO_DB": str(out / "demo.sqlite")}
    sys.path.insert(0, str(ROOT / "dags"))
    from plan_demo.mcp_server import connection

    env["AIRFLOW_CONN_PLAN_DEMO_MCP"] = connection(database=env["PLAN_DEMO_DB"])
    started = time.monotonic()
    print(
        f"starting Airflow (scheduler, dag-processor, api-server, triggerer) with dags from {ROOT / 'dags'}"
    )
    with AirflowCluster(ROOT / "dags", home=tempfile.mkdtemp(prefix="plan-demo-"), env=env) as cluster:
        cluster.wait_for_dag(DAG_ID, timeout=120)
        cluster.unpause(DAG_ID)
        goal = "find why the payment API got slow yesterday and write a report"
        run_id = cluster.trigger(DAG_ID, {"goal": goal})
        print(f"triggered {DAG_ID} run {run_id}: {goal!r}")
        state = cluster.wait_for_run(DAG_ID, run_id, timeout=600)
        runs = sorted(cluster.list_runs(DAG_ID), key=lambda r: r["dag_run_id"])
        for run in runs:
            nodes = cluster.node_states(DAG_ID, run["dag_run_id"])
            print(f"  run {run['dag_run_id']}: {run['state']}  nodes {dict(sorted(nodes.items()))}")
        result = cluster.session_result(DAG_ID, run_id)
        if result is None:
            print(f"run {run_id} ended {state} without a SessionResult", file=sys.stderr)
            print(cluster.diagnostics(), file=sys.stderr)
            return 1
        print()
        listing = cluster.xcom(DAG_ID, run_id, PLAN_TASK, TOOLS_KEY) or {}
        for source in listing.get("sources", []):
            names = ", ".join(tool["name"] for tool in source.get("tools", []))
            print(f"tool source {source['source']}: {names or source.get('error')}")
        for tool, origin in sorted(listing.get("origins", {}).items()):
            print(f"  {tool:<22} <- {ToolOrigin.from_dict(origin).label()}")
        print()
        print(result.summary_text())
        report = (
            (result.outputs.get("6") or {}).get("path") if isinstance(result.outputs.get("6"), dict) else None
        )
        print()
        print(f"DAG run {run_id}: {state} in {time.monotonic() - started:.0f} s (Airflow start-up included)")
        if report:
            print(f"report: {report}")
            print("-" * 72)
            text = Path(report).read_text()
            # the inline SVG chart is for a Markdown viewer, not for the terminal
            chart = "[chart: p99 latency by hour, inline SVG in the file]"
            print(re.sub(r"<svg .*?</svg>", chart, text, flags=re.S))
        return 0 if result.status == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())
