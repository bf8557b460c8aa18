"""The in-process session runner: every revision of a session under ``dag.test()``, with its outcome."""

from __future__ import annotations

from datetime import timedelta
from itertools import pairwise

import pytest

from airflow_plan_provider import Budgets, NodeExecution
from airflow_plan_provider.contract import FINALIZE_TASK, PLAN_TASK, REPLAN_TASK
from airflow_plan_provider.plan.session import replan_run_id
from airflow_plan_provider.testing import CallLog, ScriptedPlanner, ScriptedTool, scripted_registry
from airflow_plan_provider.testing.in_process import SessionError, run_session
from tests.airflow.support import task_states, xcom

pytestmark = pytest.mark.airflow

PLAN = {
    "goal": "load the export",
    "nodes": [
        {"id": "fetch", "action": "fetch the export", "tool": "fetch", "params": {}},
        {"id": "load", "action": "load it", "tool": "load", "params": {"rows": "${fetch.rows}"}},
        {"id": "report", "action": "report", "tool": "report", "params": {"loaded": "${load}"}},
    ],
    "edges": [{"from": "fetch", "to": "load"}, {"from": "load", "to": "report"}],
}
# the revision: node "load" in batches, with another tool; "report" as before
REVISED_LOAD = {
    "nodes": [
        {"id": "load", "action": "load it in batches", "tool": "load_batches", "params": {"rows": 3}},
        PLAN["nodes"][2],
    ],
    "edges": [PLAN["edges"][1]],
}


def build(dag_id, log, **options):
    from airflow_plan_provider.dag_factory import build_plan_dag

    tools = scripted_registry(
        ScriptedTool("fetch", log=log, returns={"rows": 3}),
        ScriptedTool("load", log=log, permanent="quota exceeded"),
        ScriptedTool("load_batches", log=log, returns=lambda params: f"{params['rows']} rows in batches"),
        ScriptedTool("report", log=log, returns=lambda params: {"report": params["loaded"]}),
    )
    planner = ScriptedPlanner(PLAN, on_error=[("quota exceeded", REVISED_LOAD)])
    execution = NodeExecution(retries=0, retry_delay=timedelta(0))
    return build_plan_dag(dag_id, planner=planner, tools=tools, execution=execution, **options)


def test_a_session_that_replans_once_completes_in_two_runs(tmp_path):
    log = CallLog(tmp_path)
    session = run_session(build("inproc_replans_once", log), {"goal": "load the export"})

    root, child = session.runs
    assert session.run_ids == [root.run_id, replan_run_id(root.run_id, 1)] == session.result.run_ids
    assert [(run.revision, run.state) for run in session.runs] == [(0, "success"), (1, "success")]
    assert root.node_states == {"fetch": "success", "load": "failed", "report": "skipped"}
    assert child.node_states == {"fetch": "success", "load": "success", "report": "success"}

    result = session.result
    assert (result.status, result.reason) == ("completed", "goal_met")
    assert result.revisions[0].diff.revised == ["load"]
    assert result.outputs == {
        "fetch": {"rows": 3},
        "load": "3 rows in batches",
        "report": {"report": "3 rows in batches"},
    }
    assert [(r.revision, r.node_id, r.status, r.reused) for r in result.history if r.node_id == "fetch"] == [
        (0, "fetch", "success", False),
        (1, "fetch", "success", True),
    ]
    assert (log.count("fetch"), log.count("load"), log.count("load_batches")) == (1, 1, 1)
    # the root run's replan task really ran: it reports the session, as on a scheduler
    assert task_states(root)[REPLAN_TASK] == "success"
    assert xcom(root, REPLAN_TASK) == result.model_dump(mode="json")


def test_without_replans_a_failed_node_fails_the_session(tmp_path):
    log = CallLog(tmp_path)
    session = run_session(
        build("inproc_no_replans", log, budgets=Budgets(max_replans=0)), {"goal": "load the export"}
    )

    [run] = session.runs
    assert (run.revision, run.state) == (0, "failed")
    assert run.node_states == {"fetch": "success", "load": "failed", "report": "skipped"}
    result = session.result
    assert (result.status, result.reason) == ("failed", "node_failed")
    assert result.run_ids == [run.run_id]
    assert result.outputs == {"fetch": {"rows": 3}}
    [load] = [r for r in result.history if r.node_id == "load"]
    assert (load.status, load.error) == ("failed", "load: quota exceeded")
    assert log.count("load_batches") == 0


def test_a_session_longer_than_max_runs_is_an_error_not_a_hang(tmp_path):
    log = CallLog(tmp_path)
    with pytest.raises(SessionError, match="more than max_runs=1 runs"):
        run_session(build("inproc_max_runs", log), {"goal": "load the export"}, max_runs=1)
    assert log.count("load_batches") == 0  # the second revision never ran


def test_a_dag_that_is_not_a_plan_dag_is_refused():
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG

    with DAG("inproc_not_a_plan", schedule=None) as dag:
        EmptyOperator(task_id=PLAN_TASK)
    with pytest.raises(
        ValueError,
        match=rf"'inproc_not_a_plan' has no plan \(built by build_plan_dag\): no task '{FINALIZE_TASK}'",
    ):
        run_session(dag, {"goal": "g"})


def test_a_plan_in_a_task_group_is_read_by_its_group(tmp_path):
    from airflow.sdk import DAG

    from airflow_plan_provider import plan_task_group

    log = CallLog(tmp_path)
    tools = scripted_registry(ScriptedTool("fetch", log=log, returns={"rows": 3}))
    plan = {"nodes": [{"id": "fetch", "action": "fetch the export", "tool": "fetch", "params": {}}]}
    with DAG("inproc_group", schedule=None) as dag:
        plan_task_group("load", planner=ScriptedPlanner(plan), tools=tools, goal="load")

    session = run_session(dag, group="load")
    [run] = session.runs
    assert (session.result.status, session.result.outputs) == ("completed", {"fetch": {"rows": 3}})
    assert (run.state, run.node_states) == ("success", {"fetch": "success"})
    with pytest.raises(ValueError, match=r"'inproc_group' has no plan in group 'other'"):
        run_session(dag, group="other")


def test_the_node_instances_of_a_chain_run_in_map_index_order_and_none_gives_its_slot_back(tmp_path):
    """``dag.test()`` runs a pass's scheduled instances in a set's order; the runner runs a mapped task's
    in map-index order (the plan's run order), as the scheduler hands out their slots: no node finds a
    parent not started and reschedules itself (seconds that ``dag.test()`` would sleep out)."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.taskreschedule import TaskReschedule
    from airflow.utils.session import create_session

    from airflow_plan_provider.dag_factory import build_plan_dag

    log = CallLog(tmp_path)
    ids = [f"n{i}" for i in range(6)]
    plan = {
        "goal": "a chain",
        "nodes": [{"id": node, "action": f"step {node}", "tool": "step", "params": {}} for node in ids],
        "edges": [{"from": a, "to": b} for a, b in pairwise(ids)],
    }
    tools = scripted_registry(ScriptedTool("step", log=log, returns="done"))
    dag = build_plan_dag("inproc_chain_order", planner=ScriptedPlanner(plan), tools=tools)
    session = run_session(dag, {"goal": "a chain"})

    assert session.runs[0].node_states == dict.fromkeys(ids, "success")
    assert [call["node"] for call in log.calls()] == ids
    with create_session() as db:
        reschedules = (
            db.query(TaskReschedule)
            .join(TaskInstance, TaskReschedule.ti_id == TaskInstance.id)
            .filter(TaskInstance.dag_id == "inproc_chain_order")
            .count()
        )
    assert reschedules == 0
