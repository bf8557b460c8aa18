"""``plan_and_execute_llm`` on a real Airflow, its LLM planner pointed at a scripted OpenAI-compatible
server (in the test process; the workers reach it over HTTP on 127.0.0.1) through an
``AIRFLOW_CONN_PLAN_LLM_DEFAULT`` connection.

The server answers in the planner's wire format (strict structured output: ``params`` as a
JSON-encoded string). The API key is distinctive so it can be looked for everywhere the run leaves
text behind: task logs, XComs and the SessionResult's events.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from airflow_plan_provider.contract import (
    FINALIZE_TASK,
    NODES_TASK,
    PLAN_KEY,
    PLAN_TASK,
    SESSION_KEY,
    select_task_id,
)
from airflow_plan_provider.planners.template import fill_template
from airflow_plan_provider.testing.openai_server import OpenAITestServer, count_tokens
from harness.cluster import AirflowCluster
from tests.e2e.conftest import SharedCluster, serve
from tests.e2e.keys import LLM_API_KEY

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "dags" / "plan_demo" / "templates"
DAG_ID = "plan_and_execute_llm"
GOAL = "find why the payment API got slow yesterday and write a report"
API_KEY = LLM_API_KEY
VALUES = {"goal": GOAL, "service": "payment-api", "day": "yesterday"}
RUN_TIMEOUT = 180.0


# ------------------------------------------------------------------------------------ scripted replies


def wire(plan: dict[str, Any]) -> dict[str, Any]:
    """A plan as the model writes it under the strict wire schema: every field present, params as text."""
    nodes = [
        {
            "id": node["id"],
            "action": node["action"],
            "tool": node["tool"],
            "params": json.dumps(node.get("params", {})),
            "expected_outcome": node.get("expected_outcome"),
            "dependencies": node.get("dependencies"),
        }
        for node in plan["nodes"]
    ]
    edges = [
        {"from": e["from"], "to": e["to"], "optional": bool(e.get("optional", False))}
        for e in plan.get("edges", [])
    ]
    return {"goal": plan.get("goal") or GOAL, "nodes": nodes, "edges": edges}


def template(name: str) -> dict[str, Any]:
    return wire(fill_template(json.loads((TEMPLATES / name).read_text()), VALUES))


def cyclic_plan() -> dict[str, Any]:
    args = {"service": "payment-api", "day": "yesterday"}
    return wire(
        {
            "goal": GOAL,
            "nodes": [
                {"id": "alpha", "action": "metrics", "tool": "query_metrics", "params": args,
                 "dependencies": ["gamma"]},
                {"id": "beta", "action": "health", "tool": "query_service_health", "params": args,
                 "dependencies": ["alpha"]},
                {"id": "gamma", "action": "deploys", "tool": "query_deploys", "params": args,
                 "dependencies": ["beta"]},
            ],
        }
    )  # fmt: skip


# ------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def server(example_cluster: SharedCluster) -> OpenAITestServer:
    """The server the shared cluster's ``plan_llm_default`` connection points at (``API_KEY`` its key)."""
    return example_cluster.llm


@pytest.fixture(scope="module")
def cluster(example_cluster: SharedCluster) -> AirflowCluster:
    serve(example_cluster.cluster, [DAG_ID])
    return example_cluster.cluster


# -------------------------------------------------------------------------------------------- helpers


def _q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def all_xcoms(cluster: AirflowCluster, run_id: str) -> list[tuple[str, str, int, Any]]:
    """``(task_id, key, map_index, value)`` of every XCom of a run, listed through ``/xcomEntries``."""
    entries: list[dict[str, Any]] = []
    while True:
        page = cluster.api(
            "GET",
            f"/dags/{_q(DAG_ID)}/dagRuns/{_q(run_id)}/taskInstances/~/xcomEntries",
            params={"limit": 100, "offset": len(entries)},
        )
        entries += page["xcom_entries"]
        if not page["xcom_entries"] or len(entries) >= page["total_entries"]:
            break
    values = []
    for e in entries:
        value = cluster.xcom(DAG_ID, run_id, e["task_id"], e["key"], e["map_index"])
        values.append((e["task_id"], e["key"], e["map_index"], value))
    return values


def all_logs(cluster: AirflowCluster, run_id: str) -> dict[tuple[str, int, int], str]:
    """Every try's log of every task instance of a run."""
    logs = {}
    for ti in cluster.task_instances(DAG_ID, run_id):
        for attempt in range(1, (ti.get("try_number") or 0) + 1):
            key = (ti["task_id"], ti["map_index"], attempt)
            logs[key] = cluster.task_log(DAG_ID, run_id, ti["task_id"], attempt, ti["map_index"])
    return logs


# ---------------------------------------------------------------------------------------------- tests


def test_llm_plan_replans_and_never_leaks_the_key(cluster: AirflowCluster, server: OpenAITestServer) -> None:
    plan, replacement = template("payment_latency.json"), template("payment_latency_replan_deploys.json")
    server.reply(plan).reply(replacement)

    t0 = time.monotonic()
    root = cluster.trigger(DAG_ID, {"goal": GOAL})
    state = cluster.wait_for_run(DAG_ID, root, timeout=RUN_TIMEOUT)
    print(f"\n[e2e] {DAG_ID} {root}: {state} in {time.monotonic() - t0:.1f}s")
    child = f"{root}__replan_1"
    assert state == "success", cluster.diagnostics()
    assert cluster.get_run(DAG_ID, child)["state"] == "success"
    assert cluster.node_states(DAG_ID, child) == dict.fromkeys("123456", "success")

    result = cluster.session_result(DAG_ID, root)
    assert result is not None
    assert (result.status, result.reason) == ("completed", "goal_met")
    assert result.run_ids == [root, child]
    assert result.revisions[0].diff.model_dump() == {"removed": [], "added": [], "revised": ["5"]}

    # what the model was asked
    requests = server.chat_requests
    assert len(requests) == 2 and server.remaining_steps == 0
    first, second = requests
    assert GOAL in first.text and "This is a replan" not in first.text
    assert first.body["response_format"]["type"] == "json_schema"
    assert "This is a replan (revision 1)" in second.text
    locked = {r.node_id: r for r in result.history if r.revision == 0 and r.status == "success"}
    assert sorted(locked) == ["1", "2", "3", "4"]
    for node_id, record in locked.items():
        assert f"- {node_id}: {record.action} (tool {record.tool}); output summary: " in second.text
        assert record.output_summary and record.output_summary in second.text
    error = result.revisions[0].reason
    assert "node 3 requested a replan: no deploys of payment-api on " in error
    assert "Failed node: 3" in second.text and f"Error: {error}" in second.text

    # token usage as the server counted it, summed over both planning calls
    usage = result.usage
    prompt = sum(count_tokens(r.text) for r in requests)
    completion = sum(count_tokens(json.dumps(reply)) for reply in (plan, replacement))
    assert usage.prompt_tokens == prompt > 0
    assert usage.completion_tokens == completion > 0

    # the key went where it belongs, and nowhere else
    assert all(r.headers.get("authorization") == f"Bearer {API_KEY}" for r in requests)
    assert API_KEY not in result.model_dump_json()  # its events included
    for run_id in (root, child):
        logs = all_logs(cluster, run_id)
        assert (PLAN_TASK, -1, 1) in logs and "Asking" in logs[
            (PLAN_TASK, -1, 1)
        ]  # the planner's own log lines
        leaked = [key for key, text in logs.items() if API_KEY in text]
        assert not leaked, f"API key in the logs of {leaked}"
        xcoms = all_xcoms(cluster, run_id)
        assert {PLAN_KEY, SESSION_KEY} <= {key for _task, key, _index, _value in xcoms}
        leaked_x = [(t, k, i) for t, k, i, value in xcoms if API_KEY in json.dumps(value, default=str)]
        assert not leaked_x, f"API key in the XComs {leaked_x}"
    assert API_KEY not in json.dumps(cluster.get_run(DAG_ID, child)["conf"])


def test_cyclic_plan_fails_planning_after_the_repairs(
    cluster: AirflowCluster, server: OpenAITestServer
) -> None:
    seen = len(server.chat_requests)
    for _ in range(3):  # the first answer and both repairs
        server.reply(cyclic_plan())

    root = cluster.trigger(DAG_ID, {"goal": GOAL})
    assert cluster.wait_for_run(DAG_ID, root, timeout=RUN_TIMEOUT) == "failed"
    asked = server.chat_requests[seen:]
    assert len(asked) == 3 and server.remaining_steps == 0
    assert all("cycle" in r.text for r in asked[1:])  # each repair request names the problem

    tis = cluster.task_instances(DAG_ID, root)
    states = {(ti["task_id"], ti["map_index"]): ti["state"] for ti in tis}
    assert states[(PLAN_TASK, -1)] == "failed"
    assert states[(FINALIZE_TASK, -1)] == "failed"
    node_tasks = {
        k: s for k, s in states.items() if k[0].startswith((NODES_TASK, select_task_id(NODES_TASK)))
    }
    assert node_tasks and set(node_tasks.values()) <= {"upstream_failed", "skipped"}, node_tasks
    assert all(ti["try_number"] == 0 for ti in tis if ti["task_id"].startswith(NODES_TASK))
    assert [r["dag_run_id"] for r in cluster.list_runs(DAG_ID) if r["dag_run_id"].startswith(root)] == [root]

    result = cluster.xcom(DAG_ID, root, FINALIZE_TASK)
    assert (result["status"], result["reason"]) == ("failed", "invalid_plan")
    assert "cycle" in result["message"]
    for node_id in ("alpha", "beta", "gamma"):
        assert node_id in result["message"]
    assert result["history"] == [] and result["outputs"] == {}
