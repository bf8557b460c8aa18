"""Plans over MCP servers and a PostgreSQL table, on a real Airflow (scheduler, dag-processor, triggerer
and API server as processes), triggered through the REST API.

- ``e2e_mcp_stdio``: the test MCP server over stdio (started by each call, inside the task), a read-only
  SQL tool over a ``postgres`` connection, and a Python tool. The server's ``broken`` tool answers an
  error result: its node fails for good (no retry), and the replan revises around it; the session
  completes with the table's rows.
- ``e2e_mcp_http``: the same server over streamable HTTP on 127.0.0.1, started by the test. While node 1's
  call is in flight (its side effect done, its answer not sent), the server is killed and started again:
  the node's try fails as transient, Airflow retries it with the same idempotency key, the server does not
  perform the effect again, and the session completes.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_plan_provider.contract import NODE_KEY, NODES_TASK, PLAN_TASK, TOOLS_KEY
from harness.cluster import AirflowCluster
from harness.postgres import PostgresDatabase
from harness.servers import free_port
from tests.e2e.conftest import E2E_DAGS, demo_env, plan_cluster, require_postgres_and_redis
from tests.mcp_server import start_http

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "tests" / "mcp_server.py"
DAGS = ("e2e_mcp_stdio", "e2e_mcp_http")
TOKEN = "mcp-e2e-token-5c1f0a77d3"  # the HTTP server's bearer token: must never show in a log or XCom


class HttpServer:
    """``tests/mcp_server.py`` over streamable HTTP on 127.0.0.1:``port``, which a test can kill and start
    again on the same port and ledger."""

    def __init__(self, port: int, ledger: Path) -> None:
        self.port, self.ledger = port, ledger
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = start_http(self.ledger, self.port)

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


@pytest.fixture(scope="module")
def orders_db() -> Iterator[PostgresDatabase]:
    require_postgres_and_redis()
    with PostgresDatabase(prefix="plan_mcp") as database:
        database.run(
            "CREATE TABLE orders (id int PRIMARY KEY, amount numeric(10, 2))",
            "INSERT INTO orders VALUES (1, 12.50), (2, 7.25), (3, 30.00)",
        )
        yield database


@pytest.fixture(scope="module")
def mcp_cluster(
    tmp_path_factory: pytest.TempPathFactory, orders_db: PostgresDatabase
) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("mcp_sources")
    http = HttpServer(free_port(), base / "http-ledger.jsonl")
    http.start()
    stdio = {
        "transport": "stdio",
        "command": sys.executable,
        "args": [str(SERVER), "--ledger", str(base / "stdio-ledger.jsonl")],
        "timeout": 60,
    }
    env = {
        **demo_env(base),
        "AIRFLOW_CONN_E2E_MCP_STDIO": json.dumps({"conn_type": "mcp", "extra": stdio}),
        "AIRFLOW_CONN_E2E_MCP_HTTP": json.dumps(
            {"conn_type": "mcp", "host": f"http://127.0.0.1:{http.port}/mcp", "password": TOKEN}
        ),
        "AIRFLOW_CONN_E2E_PG": json.dumps(orders_db.connection()),
    }
    try:
        with plan_cluster(base, [E2E_DAGS / "mcp_source_dags.py"], DAGS, env=env) as cluster:
            yield {"cluster": cluster, "http": http, "base": base}
    finally:
        http.stop()


def records(cluster: AirflowCluster, dag_id: str, run_id: str) -> dict[str, dict[str, Any]]:
    """Node id → the record its instance pushed."""
    found = {}
    for ti in cluster.task_instances(dag_id, run_id):
        if ti["task_id"] == NODES_TASK and ti["map_index"] >= 0:
            record = cluster.xcom(dag_id, run_id, NODES_TASK, NODE_KEY, map_index=ti["map_index"])
            if isinstance(record, dict):
                found[record["node_id"]] = record
    return found


def test_a_session_over_an_stdio_mcp_server_and_a_postgres_table_replans_around_an_error_result(mcp_cluster):
    cluster: AirflowCluster = mcp_cluster["cluster"]
    run_id = cluster.trigger("e2e_mcp_stdio", {"goal": "summarize the orders"})
    assert cluster.wait_for_run("e2e_mcp_stdio", run_id, timeout=300) == "success", cluster.failure_report(
        "e2e_mcp_stdio", run_id
    )
    result = cluster.session_result("e2e_mcp_stdio", run_id)
    assert result is not None and result.status == "completed", result
    root, revised = result.run_ids
    first = records(cluster, "e2e_mcp_stdio", root)
    assert first["3"]["status"] == "failed" and first["3"]["attempts"] == 1  # an error result: no retry
    assert "tool 'broken' of MCP server 'e2e_mcp_stdio' answered with an error" in first["3"]["error"]
    assert "broken on purpose: index offline" in first["3"]["error"]
    second = records(cluster, "e2e_mcp_stdio", revised)
    assert second["1"]["reused"] and second["2"]["reused"]  # finished nodes are not redone
    assert result.outputs["4"] == {
        "looked_up": {"key": "orders", "value": 6},
        "orders": [[1, 12.5], [2, 7.25], [3, 30]],
        "index": {"key": "index", "value": 5},
    }
    listing = cluster.xcom("e2e_mcp_stdio", root, PLAN_TASK, TOOLS_KEY)
    assert listing["origins"]["orders_sql"] == {"kind": "sql", "conn_id": "e2e_pg"}
    assert listing["origins"]["mcp.broken"] == {"kind": "mcp", "conn_id": "e2e_mcp_stdio", "name": "broken"}
    (source,) = listing["sources"]
    assert {t["name"] for t in source["tools"]} >= {"mcp.lookup", "mcp.record", "mcp.broken"}
    log = cluster.task_log(
        "e2e_mcp_stdio", root, NODES_TASK, map_index=_index_of(cluster, "e2e_mcp_stdio", root, "1")
    )
    assert "calling mcp.lookup (mcp · conn e2e_mcp_stdio · lookup; try 1" in log


def _index_of(cluster: AirflowCluster, dag_id: str, run_id: str, node_id: str) -> int:
    for ti in cluster.task_instances(dag_id, run_id):
        if ti["task_id"] == NODES_TASK and str(ti.get("rendered_map_index") or "").startswith(f"{node_id} ·"):
            return int(ti["map_index"])
    raise AssertionError(f"no instance of node {node_id}")


def test_an_http_mcp_server_killed_mid_call_and_restarted_does_not_perform_the_effect_twice(mcp_cluster):
    cluster: AirflowCluster = mcp_cluster["cluster"]
    http: HttpServer = mcp_cluster["http"]
    run_id = cluster.trigger("e2e_mcp_http", {"goal": "record the invoice, then look it up"})
    deadline = time.monotonic() + 180
    while not (http.ledger.exists() and http.ledger.read_text().strip()):  # the effect is done ...
        assert time.monotonic() < deadline, cluster.failure_report("e2e_mcp_http", run_id)
        time.sleep(0.2)
    http.kill()  # ... and its answer not sent yet (the tool answers 8 s later)
    time.sleep(3)
    http.start()

    assert cluster.wait_for_run("e2e_mcp_http", run_id, timeout=300) == "success", cluster.failure_report(
        "e2e_mcp_http", run_id
    )
    lines = [json.loads(line) for line in http.ledger.read_text().splitlines()]
    found = records(cluster, "e2e_mcp_http", run_id)
    assert found["1"]["attempts"] >= 2  # the try in flight failed; Airflow retried it
    assert [line["item"] for line in lines] == ["inv-7"]  # the effect once
    assert found["1"]["output"] == {"item": "inv-7", "key": lines[0]["key"], "times": 1}
    assert found["2"]["output"] == {"key": "inv-7", "value": 5}
    index = _index_of(cluster, "e2e_mcp_http", run_id, "1")
    logs = [cluster.task_log("e2e_mcp_http", run_id, PLAN_TASK)] + [
        cluster.task_log("e2e_mcp_http", run_id, NODES_TASK, try_number=n, map_index=index)
        for n in range(1, found["1"]["attempts"] + 1)
    ]
    assert "Airflow retries it" in logs[1]  # the try the kill cut short failed as transient
    assert all(TOKEN not in log for log in logs)
    assert TOKEN not in json.dumps(found) + json.dumps(
        cluster.xcom("e2e_mcp_http", run_id, PLAN_TASK, TOOLS_KEY)
    )
