"""common-ai's ``AirflowTool`` objects as plan tools: a ``HookToolset`` over a real PostgreSQL table."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_plan_provider import NodeExecution, build_plan_dag
from airflow_plan_provider.exceptions import PermanentToolError, TransientToolError
from airflow_plan_provider.testing import ScriptedPlanner
from airflow_plan_provider.testing.in_process import run_session
from airflow_plan_provider.tools.common_ai import common_ai_tools
from airflow_plan_provider.tools.registry import ToolRegistry
from airflow_plan_provider.tools.tool import ToolContext
from harness.postgres import PostgresDatabase

pytestmark = pytest.mark.airflow
CTX = ToolContext(node_id="n", idempotency_key="k")


@pytest.fixture(scope="module")
def warehouse() -> Iterator[PostgresDatabase]:
    with PostgresDatabase(prefix="plan_cai") as database:
        database.run(
            "CREATE TABLE invoices (id int PRIMARY KEY, customer text)",
            "INSERT INTO invoices VALUES (1, 'acme'), (2, 'globex')",
        )
        yield database


@pytest.fixture
def toolset(warehouse: PostgresDatabase, monkeypatch: pytest.MonkeyPatch) -> Any:
    from airflow.providers.common.ai.toolsets.hook import HookToolset
    from airflow.providers.postgres.hooks.postgres import PostgresHook

    monkeypatch.setenv("AIRFLOW_CONN_CAI_WAREHOUSE", json.dumps(warehouse.connection()))
    return HookToolset(PostgresHook(postgres_conn_id="cai_warehouse"), allowed_methods=["get_records"])


def test_a_toolsets_tools_keep_their_schema_and_answer_from_the_database(toolset):
    (tool,) = common_ai_tools(toolset, prefix="wh.")
    assert tool.name == "wh.get_records" and tool.args_schema["required"] == ["sql"]
    assert tool.origin.label() == "common-ai · conn cai_warehouse · get_records"
    assert tool.call({"sql": "SELECT id, customer FROM invoices ORDER BY id"}, CTX) == [
        [1, "acme"],
        [2, "globex"],
    ]
    assert "CommonAiCall('get_records')" in repr(tool.func)


def test_an_error_result_is_permanent_and_a_failed_call_transient(toolset):
    (tool,) = common_ai_tools(toolset)
    with pytest.raises(PermanentToolError, match="common-ai tool 'get_records' answered with an error"):
        tool.call({"sql": 12}, CTX)  # common-ai's own argument check: an error result
    with pytest.raises(TransientToolError, match='column "nope" does not exist'):
        tool.call({"sql": "SELECT nope FROM invoices"}, CTX)


def test_a_plan_dag_calls_a_common_ai_tool(toolset):
    plan = {
        "goal": "list the invoices",
        "nodes": [
            {
                "id": "1",
                "action": "read the invoices",
                "tool": "wh.get_records",
                "params": {"sql": "SELECT customer FROM invoices ORDER BY id"},
            }
        ],
        "edges": [],
    }
    registry = ToolRegistry(common_ai_tools(toolset, prefix="wh."))
    dag = build_plan_dag(
        "cai_invoices", planner=ScriptedPlanner(plan), tools=registry, execution=NodeExecution(retries=0)
    )

    session = run_session(dag, {"goal": "list the invoices"})

    assert session.result.status == "completed"
    assert session.result.outputs["1"] == [["acme"], ["globex"]]
