"""Large outputs as artifacts, asynchronous tools waiting on the triggerer (dag.test on SQLite)."""

from __future__ import annotations

import hashlib
import json
import random
import string
from datetime import timedelta

import pytest

from airflow_plan_provider import ArtifactStore, NodeExecution
from airflow_plan_provider.contract import FINALIZE_TASK, NODE_KEY, NODES_TASK, POLLING_KEY, PollingRecord
from airflow_plan_provider.planners.llm_prompt import build_messages
from airflow_plan_provider.testing import CallLog, ScriptedPlanner, ScriptedTool, scripted_registry
from airflow_plan_provider.testing.in_process import run_plan_dag, run_session
from tests.airflow.support import xcom

pytestmark = pytest.mark.airflow


def build(dag_id, planner, tools, **options):
    from airflow_plan_provider.dag_factory import build_plan_dag

    options.setdefault("execution", NodeExecution(retries=0, retry_delay=timedelta(0)))
    return build_plan_dag(dag_id, planner=planner, tools=scripted_registry(*tools), **options)


def big_output() -> dict:
    rng = random.Random(7)
    return {"rows": "".join(rng.choices(string.ascii_letters, k=5 * 1024 * 1024))}


def digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def test_large_output_goes_to_the_artifact_store_and_arrives_intact(tmp_path):
    log = CallLog(tmp_path / "calls")
    blob = big_output()
    tools = [
        ScriptedTool("extract", log=log, returns=blob),
        ScriptedTool("checksum", log=log, returns=lambda params: digest(params["data"])),
    ]
    plan = {
        "nodes": [
            {"id": "1", "action": "extract", "tool": "extract"},
            {"id": "2", "action": "checksum", "tool": "checksum", "params": {"data": "${1}"}},
        ]
    }
    dag = build(
        "artifact_roundtrip",
        ScriptedPlanner(plan),
        tools,
        artifacts=ArtifactStore(url=f"file://{tmp_path}/store"),
    )
    run = run_plan_dag(dag, {"goal": "g"})
    assert str(run.state) == "success"
    record = xcom(run, NODES_TASK, key=NODE_KEY, map_index=0)
    assert len(json.dumps(record)) < 4096  # the XCom row holds a reference, not 5 MB
    ref = record["artifact"]
    assert record["output"] is None and ref["size"] > 5 * 1024 * 1024
    assert (tmp_path / "store").exists() and ref["uri"].startswith(f"file://{tmp_path}/store/")
    assert xcom(run, NODES_TASK, key=NODE_KEY, map_index=1)["output"] == digest(blob)


def test_replan_prompt_gets_only_the_summary_of_a_large_output(tmp_path):
    log = CallLog(tmp_path / "calls")
    tools = [
        ScriptedTool("extract", log=log, returns=big_output()),
        ScriptedTool("load", log=log, permanent="warehouse rejected the load"),
        ScriptedTool("load2", log=log, returns="ok"),
    ]
    plan = {
        "nodes": [
            {"id": "1", "action": "extract", "tool": "extract"},
            {"id": "2", "action": "load", "tool": "load", "params": {"data": "${1}"}},
        ]
    }
    replacement = {
        "nodes": [{"id": "3", "action": "load elsewhere", "tool": "load2", "params": {"d": "${1}"}}]
    }
    planner = ScriptedPlanner(plan, on_error=[("rejected", replacement)])
    dag = build("artifact_replan", planner, tools, artifacts=ArtifactStore(url=f"file://{tmp_path}/store"))
    runs = run_session(dag, {"goal": "move the data"}).runs
    assert xcom(runs[-1], FINALIZE_TASK)["status"] == "completed"
    replan_request = planner.requests[-1]
    assert replan_request.is_replan
    summary = {n.id: n.summary for n in replan_request.locked}["1"]
    assert len(summary) <= 400
    prompt = json.dumps(build_messages(replan_request))
    assert len(prompt) < 20_000  # the 5 MB output is not in the prompt
    assert log.count("extract") == 1


def test_asynchronous_tool_defers_and_succeeds_with_the_jobs_result(tmp_path):
    log = CallLog(tmp_path)
    tools = [
        ScriptedTool("export", log=log, returns={"rows": 42}, job_seconds=3, poll_interval=0.5),
        ScriptedTool("report", log=log, returns=lambda params: params["n"]),
    ]
    plan = {
        "nodes": [
            {"id": "1", "action": "export", "tool": "export"},
            {"id": "2", "action": "report", "tool": "report", "params": {"n": "${1.rows}"}},
        ]
    }
    run = run_plan_dag(build("async_ok", ScriptedPlanner(plan), tools), {"goal": "g"})
    assert str(run.state) == "success"
    record = xcom(run, NODES_TASK, key=NODE_KEY, map_index=0)
    assert record["output"] == {"rows": 42}
    done = PollingRecord.model_validate(record["polling"])
    assert done.outcome == "done" and done.handle["result"] == {"rows": 42}
    assert done.since is not None and done.until is not None and done.key
    waiting = PollingRecord.model_validate(xcom(run, NODES_TASK, key=POLLING_KEY, map_index=0))
    assert (waiting.handle, waiting.since, waiting.key) == (done.handle, done.since, done.key)
    assert waiting.started is not None and waiting.outcome is None
    assert xcom(run, NODES_TASK, key=NODE_KEY, map_index=1)["output"] == 42
    events = [e["type"] for e in xcom(run, FINALIZE_TASK)["events"]]
    assert "node.polling" in events
    assert log.count("export") == 1  # the job was started once; waiting is polling, not calling


@pytest.mark.parametrize(
    ("options", "expected"),
    [({"job_fails": "export quota exceeded"}, "export quota exceeded"), ({"job_timeout": 1.5}, "timeout")],
)
def test_asynchronous_job_failure_or_timeout_fails_the_node(tmp_path, options, expected):
    log = CallLog(tmp_path)
    tools = [ScriptedTool("export", log=log, returns=1, job_seconds=4, poll_interval=0.5, **options)]
    plan = {"nodes": [{"id": "1", "action": "export", "tool": "export"}]}
    run = run_plan_dag(
        build(f"async_bad_{expected.split()[0]}", ScriptedPlanner(plan), tools, replan=False), {"goal": "g"}
    )
    assert str(run.state) == "failed"
    record = xcom(run, NODES_TASK, key=NODE_KEY, map_index=0)
    assert record["status"] == "failed" and expected in record["error"]
