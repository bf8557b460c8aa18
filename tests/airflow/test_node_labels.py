"""Each node instance's label (its rendered map index, ``id · action``) comes from the value its node task
maps over (the node's brief, or in a task of more than 32 nodes its label), so the label Airflow sets
when the instance starts is already its last; the action is shown as written, never rendered as a
template (it is the planner's text), and so are the params."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_plan_provider import NodeExecution
from airflow_plan_provider.contract import BRIEFS_PER_XCOM, NODES_TASK, PLAN_TASK, briefs_key, mapped_label
from airflow_plan_provider.testing import CallLog, ScriptedTool, scripted_registry
from airflow_plan_provider.testing.in_process import _task_instances, run_plan_dag
from airflow_plan_provider.tools.registry import ToolRegistry
from airflow_plan_provider.tools.tool import ToolContext
from tests.airflow.support import xcom

pytestmark = pytest.mark.airflow

PLAN = {
    "nodes": [
        {
            "id": "b",
            "action": "second, after a",
            "tool": "emit",
            "params": {"value": 2, "note": "{{ 6 * 7 }}"},
            "dependencies": ["a"],
        },
        {"id": "a", "action": "sum {{ 7 * 7 }} and {% raw %}", "tool": "emit", "params": {"value": 1}},
    ]
}


def test_a_node_task_maps_over_its_nodes_briefs_and_each_instance_shows_its_label(tmp_path: Path) -> None:
    from airflow_plan_provider.dag_factory import build_plan_dag

    log = CallLog(tmp_path)
    tools = scripted_registry(ScriptedTool("emit", log=log, returns=lambda params: params["value"]))
    dag = build_plan_dag(
        "node_labels", planner=None, tools=tools, execution=NodeExecution(retries=0, retry_delay=timedelta(0))
    )
    run = run_plan_dag(dag, {"goal": "label", "plan": PLAN})
    assert str(run.state) == "success" and log.count("emit") == 2
    labels = ["a · sum {{ 7 * 7 }} and {% raw %}", "b · second, after a"]  # run order: a parent first
    briefs = xcom(run, PLAN_TASK)  # what the node task maps over: its nodes' briefs
    assert [mapped_label(brief) for brief in briefs] == labels
    assert xcom(run, PLAN_TASK, key=briefs_key(NODES_TASK, 0)) is None  # no group besides
    # b's brief: b, its parent a (what keys a's output) and where a's instance is; nothing else
    assert briefs[1]["parents"] == [{"id": "a", "tool": "emit", "params": {"value": 1}}]
    assert briefs[1]["at"] == {NODES_TASK: {"a": 0, "b": 1}}
    shown = {
        ti.map_index: ti.rendered_map_index
        for ti in _task_instances(run.dag_id, run.run_id)
        if ti.task_id == NODES_TASK
    }
    assert shown == dict(enumerate(labels))
    from tests.airflow.support import rendered_fields

    rendered = {
        index: fields for (task_id, index), fields in rendered_fields(run).items() if task_id == NODES_TASK
    }
    assert rendered[1] == {"resolved_params": {"value": 2, "note": "{{ 6 * 7 }}"}}


@pytest.mark.parametrize("width", [2, BRIEFS_PER_XCOM + 1], ids=["briefs mapped", "labels mapped"])
def test_a_node_reads_its_brief_and_not_the_plan(tmp_path: Path, monkeypatch, width: int) -> None:
    """What a node reads to start does not grow with the plan beyond the labels: no plan, no run
    context. Every XCom read of each node instance (``xcom_pull``: Airflow's own read of the mapped
    value, and the node's), in order: in a node task of up to 32 nodes only the mapped value (its
    brief); in a larger one the labels, then its group of briefs."""
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    from airflow_plan_provider.dag_factory import build_plan_dag

    reads: dict[int, list[tuple[str, str]]] = {}
    pull = RuntimeTaskInstance.xcom_pull

    def counted(self: Any, task_ids: Any = None, *args: Any, **kwargs: Any) -> Any:
        if self.task_id == NODES_TASK:
            key = kwargs.get("key", args[1] if len(args) > 1 else "return_value")
            reads.setdefault(self.map_index, []).append((task_ids, key))
        return pull(self, task_ids, *args, **kwargs)

    monkeypatch.setattr(RuntimeTaskInstance, "xcom_pull", counted)
    log = CallLog(tmp_path)
    tools = scripted_registry(ScriptedTool("emit", log=log, returns=lambda params: params["value"]))
    plan = {
        "nodes": [PLAN["nodes"][1]]
        + [
            {"id": f"n{i}", "action": "next", "tool": "emit", "params": {"value": i}, "dependencies": ["a"]}
            for i in range(width - 1)
        ]
    }
    run = run_plan_dag(build_plan_dag("node_reads", planner=None, tools=tools), {"goal": "r", "plan": plan})
    assert str(run.state) == "success" and log.count("emit") == width
    mapped = (PLAN_TASK, "return_value")
    if width <= BRIEFS_PER_XCOM:
        assert reads == {index: [mapped] for index in range(width)}
        return
    groups = [(PLAN_TASK, briefs_key(NODES_TASK, index)) for index in range(width)]
    assert reads == {index: [mapped, groups[index]] for index in range(width)}
    assert groups[0] != groups[-1]  # the last node's brief is in a group of its own
    first, *rest = xcom(run, PLAN_TASK)  # the labels, in run order: a first
    assert first == "a · sum {{ 7 * 7 }} and {% raw %}"
    assert sorted(rest) == sorted(f"n{i} · next" for i in range(width - 1))


def test_a_node_sends_its_label_from_its_own_thread_as_it_calls_its_tool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every try of a node sends its label as it calls its tool, so the tool runs labelled in the grid
    however soon it started (a retry's new try too). Each tool looks at its own instance's label in the
    metadata database as it ends; every label sent while a node runs is sent from the thread that runs
    it, once a try."""
    import threading
    import time

    from airflow_plan_provider import compat
    from airflow_plan_provider.dag_factory import build_plan_dag
    from airflow_plan_provider.exceptions import TransientToolError
    from airflow_plan_provider.operators import node as node_operator

    node_threads: set[int] = set()
    sent: list[tuple[str, int]] = []  # (label, thread) of every label sent while a node ran
    execute, send = node_operator.PlanNodeOperator.execute, compat.send_rendered_map_index

    def executed(self: Any, context: Any) -> Any:
        node_threads.add(threading.get_ident())
        return execute(self, context)

    def sent_from(label: str) -> bool:
        sent.append((label, threading.get_ident()))
        return send(label)

    monkeypatch.setattr(node_operator.PlanNodeOperator, "execute", executed)
    monkeypatch.setattr(compat, "send_rendered_map_index", sent_from)
    dag_id = "node_labels_at_the_call"
    seen: dict[tuple[str, int], str | None] = {}  # (node, try) → its instance's label as its tool ended
    registry = ToolRegistry()

    @registry.tool(description="sleep, then look at this instance's label in the metadata database")
    def nap(seconds: float, fail_first: bool = False, *, ctx: ToolContext) -> float:
        time.sleep(seconds)
        (ti,) = [
            ti
            for ti in _task_instances(dag_id, ctx.run_id)
            if ti.task_id == NODES_TASK and str(ti.rendered_map_index or "").startswith(ctx.node_id)
        ] or [None]
        seen[ctx.node_id, ctx.attempt] = None if ti is None else ti.rendered_map_index
        if fail_first and ctx.attempt == 1:
            raise TransientToolError("first try")
        return seconds

    plan = {
        "nodes": [
            {"id": "quick", "action": "nap briefly", "tool": "nap", "params": {"seconds": 0.0}},
            {"id": "long", "action": "nap a while", "tool": "nap", "params": {"seconds": 1.0}},
            {
                "id": "again",
                "action": "nap twice",
                "tool": "nap",
                "params": {"seconds": 0.0, "fail_first": True},
            },
        ]
    }
    execution = NodeExecution(retries=1, retry_delay=timedelta(0))
    dag = build_plan_dag(dag_id, planner=None, tools=registry, execution=execution)
    run = run_plan_dag(dag, {"goal": "labels", "plan": plan})
    assert str(run.state) == "success"
    labels = {"quick": "quick · nap briefly", "long": "long · nap a while", "again": "again · nap twice"}
    tries = [("quick", 1), ("long", 1), ("again", 1), ("again", 2)]
    assert seen == {(node, attempt): labels[node] for node, attempt in tries}
    assert sorted(label for label, _thread in sent) == sorted(labels[node] for node, _try in tries)
    assert {thread for _label, thread in sent} <= node_threads
    shown = {ti.rendered_map_index for ti in _task_instances(dag_id, run.run_id) if ti.task_id == NODES_TASK}
    assert shown == set(labels.values())  # every label, once its node ended


def test_a_node_waiting_in_its_slot_sends_its_label_when_it_falls_due(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pauses of a node's wait for its parents (:class:`~.node_wait.SlotWait` sleeps through the
    node) send its label once, at the time it falls due, and sleep as long as asked all the same."""
    import time

    from airflow_plan_provider import compat
    from airflow_plan_provider.operators import node as node_operator

    monkeypatch.setattr(node_operator, "LABEL_AFTER", 0.2)
    sent: list[tuple[str, float]] = []
    monkeypatch.setattr(
        compat, "send_rendered_map_index", lambda label: bool(sent.append((label, time.monotonic())))
    )
    operator = node_operator.PlanNodeOperator(task_id=NODES_TASK, plan_node={})
    operator._label = "a · wait"
    with operator._labelled_when_seen():
        began = time.monotonic()
        operator.sleep_sending_label(0.1)
        assert sent == []  # not due yet
        operator.sleep_sending_label(0.3)
        slept = time.monotonic() - began
        operator.sleep_sending_label(0.01)
    assert [label for label, _at in sent] == ["a · wait"]  # once
    assert 0.18 <= sent[0][1] - began < 0.3  # when it fell due, in the middle of the second pause
    assert slept >= 0.4
