"""One plan, the same tools and inputs, run by both hosts of the node step: the node operator (a real
plan DAG run in-process with dag.test) and the local runner (run_plan). Every node ends in the same
record, with the same key in its started event and the same events of the try that counted.

The plan covers every way a node ends: success (ok), a transient failure then success (flaky), a
permanent failure (bad), a replan request (moot), a missing optional input (partial), a failed hard
parent (after_bad, skipped), the step budget (last, skipped) and a checkpoint of its key (saved, not
called). Both runs use the local runner's DAG id and the same root run id, so their keys are equal byte
for byte when they are made by the same rule.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_plan_provider import ArtifactStore, Budgets, NodeExecution
from airflow_plan_provider.contract import NODE_KEY, NODES_TASK
from airflow_plan_provider.local_runner import LOCAL_DAG_ID, run_plan
from airflow_plan_provider.plan.calls import key_scope, node_key
from airflow_plan_provider.plan.model import Node
from airflow_plan_provider.plan.result import NodeRecord
from airflow_plan_provider.plan.validate import validate_plan
from airflow_plan_provider.testing import CallLog, ScriptedTool, scripted_registry
from airflow_plan_provider.testing.in_process import run_plan_dag
from tests.airflow.support import run_xcoms

pytestmark = pytest.mark.airflow

PLAN: dict[str, Any] = {
    "goal": "every way a node ends",
    "nodes": [
        {"id": "ok", "action": "fetch", "tool": "fetch", "params": {}},
        {"id": "flaky", "action": "fetch, once failing", "tool": "flaky", "params": {}},
        {"id": "bad", "action": "fetch, refused", "tool": "broken", "params": {}},
        {"id": "moot", "action": "find nothing to do", "tool": "asks", "params": {}},
        {"id": "saved", "action": "fetch, done before", "tool": "fetch_saved", "params": {}},
        {"id": "after_bad", "action": "use the refused", "tool": "fetch", "params": {}},
        {
            "id": "partial",
            "action": "combine",
            "tool": "combine",
            "params": {"got": "${ok.v}", "lost": "${bad}"},
        },
        {"id": "last", "action": "over budget", "tool": "fetch", "params": {}},
    ],
    "edges": [
        {"from": "bad", "to": "after_bad"},
        {"from": "ok", "to": "partial"},
        {"from": "bad", "to": "partial", "optional": True},
        {"from": "partial", "to": "last"},
    ],
}
BUDGETS = Budgets(max_steps=7)  # 8 nodes: the last in execution order ("last") is refused
EXECUTION = NodeExecution(retries=1, retry_delay=timedelta(0))
SAVED_OUTPUT = {"v": "from its checkpoint"}


def tools(log: CallLog) -> Any:
    return scripted_registry(
        ScriptedTool("fetch", log=log, returns={"v": 1}),
        ScriptedTool("flaky", log=log, returns={"v": 2}, transient_failures=1),
        ScriptedTool("broken", log=log, permanent="deploy API says 403"),
        ScriptedTool("asks", log=log, returns={"v": 3}, replan="nothing changed"),
        ScriptedTool("fetch_saved", log=log, returns={"v": "called again"}),
        ScriptedTool("combine", log=log, returns=lambda params: {"combined": params}),
    )


def checkpoint(run_id: str) -> tuple[str, dict[str, Any]]:
    """The key of node ``saved`` in a local-DAG run ``run_id``, and a checkpoint of its call."""
    key = node_key(key_scope(LOCAL_DAG_ID), run_id, Node.model_validate(PLAN["nodes"][4]))
    saved = {"output": SAVED_OUTPUT, "artifact": None, "output_summary": '{"v": "from its checkpoint"}'}
    return key, {**saved, "attempts": 1, "run_id": run_id}


def comparable(record: NodeRecord, events: list[dict[str, Any]]) -> dict[str, Any]:
    """What both hosts must agree on: the record (but the timing and the worker), its output and
    checkpoint flag, and the events of the try that counted (but when and how long)."""
    last_try = max((i for i, e in enumerate(events) if e["type"] == "node.started"), default=0)
    return {
        "record": record.in_history().model_dump(mode="json", exclude={"duration_s", "hostname"}),
        "output": record.output,
        "events": [
            {**{k: v for k, v in e.items() if k != "at"}, "data": {**e["data"], "duration_s": None}}
            for e in events[last_try:]
        ],
    }


def by_local_runner(run_id: str, tmp_path: Path) -> tuple[dict[str, Any], CallLog]:
    log = CallLog(tmp_path / "local")
    registry = tools(log)
    key, saved = checkpoint(run_id)
    result = run_plan(
        validate_plan(PLAN, registry),
        registry,
        budgets=BUDGETS,
        execution=EXECUTION,
        run_id=run_id,
        checkpoints={key: saved},
    )
    nodes = {}
    for record in result.history:
        full = record.model_copy(update={"output": result.outputs.get(record.node_id)})
        events = [e.model_dump(mode="json") for e in result.events if e.node_id == record.node_id]
        nodes[record.node_id] = comparable(full, events)
    return nodes, log


def by_node_operator(run_id: str, tmp_path: Path) -> tuple[dict[str, Any], CallLog]:
    from airflow_plan_provider import artifacts
    from airflow_plan_provider.dag_factory import build_plan_dag

    log = CallLog(tmp_path / "airflow")
    store = (tmp_path / "store").as_uri()
    artifacts.save_checkpoint(*checkpoint(run_id), store)
    dag = build_plan_dag(
        LOCAL_DAG_ID,
        planner=None,
        plan=PLAN,
        tools=tools(log),
        budgets=BUDGETS,
        execution=EXECUTION,
        artifacts=ArtifactStore(url=store),
        replan=False,
    )
    run = run_plan_dag(dag, run_id=run_id)
    nodes = {}
    for (task_id, _, key), pushed in run_xcoms(run).items():
        if task_id == NODES_TASK and key == NODE_KEY:
            record = NodeRecord.model_validate(pushed)
            record.output = pushed["output"]
            nodes[record.node_id] = comparable(record, pushed["events"])
    return nodes, log


def test_both_hosts_end_every_node_in_the_same_record(tmp_path: Path) -> None:
    run_id = f"equivalence__{uuid.uuid4().hex[:12]}"
    local, local_log = by_local_runner(run_id, tmp_path)
    operator, operator_log = by_node_operator(run_id, tmp_path)

    assert sorted(operator) == sorted(local) == sorted(n["id"] for n in PLAN["nodes"])
    for node_id in local:
        assert operator[node_id] == local[node_id], node_id

    # what the records say, once (the comparison above holds them for both hosts)
    records = {n: local[n]["record"] for n in local}
    ends = {n: (r["status"], r["attempts"]) for n, r in records.items()}
    assert ends == {
        "ok": ("success", 1),
        "flaky": ("success", 2),
        "bad": ("failed", 1),
        "moot": ("success", 1),
        "saved": ("success", 1),
        "after_bad": ("skipped", 1),
        "partial": ("success", 1),
        "last": ("skipped", 1),
    }
    assert records["bad"]["error"] == "broken: deploy API says 403"
    assert records["moot"]["replan_requested"] and local["moot"]["output"] == {"v": 3}
    assert records["partial"]["missing_inputs"] == ["bad"]
    assert local["partial"]["output"] == {"combined": {"got": 1, "lost": None}}
    assert records["after_bad"]["error"] == "parent bad failed"
    assert records["last"]["budget_exhausted"] and "would be step 8 of 7" in records["last"]["error"]
    assert records["saved"]["reused"] and local["saved"]["output"] == SAVED_OUTPUT
    reused = local["saved"]["events"][-1]
    assert (reused["type"], reused["data"]["checkpoint"]) == ("node.reused", True)

    started = {n: [e for e in local[n]["events"] if e["type"] == "node.started"] for n in local}
    keys = {n: s[0]["data"]["key"] for n, s in started.items() if s}
    assert sorted(keys) == ["bad", "flaky", "moot", "ok", "partial"]  # the others called no tool
    plan = validate_plan(PLAN, tools(local_log))
    for node_id, key in keys.items():
        assert key == node_key(key_scope(LOCAL_DAG_ID), run_id, plan.node(node_id))
    for log in (local_log, operator_log):
        assert log.count("fetch_saved") == 0  # its checkpoint stood for the call
        assert log.count("flaky") == 2 and log.count("broken") == 1
