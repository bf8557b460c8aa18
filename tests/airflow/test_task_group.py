"""A plan as a task group inside a team's own DAG (``plan_task_group``), run with dag.test on SQLite."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from airflow_plan_provider import Limits, NodeExecution
from airflow_plan_provider.testing import CallLog, ScriptedPlanner, ScriptedTool, scripted_registry
from airflow_plan_provider.testing.in_process import run_plan_dag
from tests.airflow.support import task_states, xcom

pytestmark = pytest.mark.airflow

PLAN = {
    "nodes": [
        {"id": "a", "action": "count rows", "tool": "count", "params": {}},
        {"id": "b", "action": "count errors", "tool": "count", "params": {}},
        {"id": "c", "action": "compare", "tool": "compare", "params": {"left": "${a}", "right": "${b}"}},
    ],
    "edges": [{"from": "a", "to": "c"}, {"from": "b", "to": "c"}],
}


def team_dag(dag_id: str, log: CallLog, **tools: Any) -> Any:
    """``extract >> plan_task_group("triage") >> publish``; publish returns what it received."""
    from airflow.sdk import DAG, task

    from airflow_plan_provider import plan_task_group

    registry = scripted_registry(
        ScriptedTool("count", log=log, returns=3, **tools.get("count", {})),
        ScriptedTool("compare", log=log, returns=lambda params: params, **tools.get("compare", {})),
    )

    @task
    def extract() -> str:
        return "payments"

    @task
    def publish(result: dict[str, Any]) -> dict[str, Any]:
        return {"status": result["status"], "outputs": result["outputs"], "goal": result["goal"]}

    with DAG(dag_id, schedule=None) as dag:
        triage = plan_task_group(
            "triage",
            planner=ScriptedPlanner(PLAN),
            tools=registry,
            goal="why is {{ ti.xcom_pull(task_ids='extract') }} slow",
            limits=Limits(),
            execution=NodeExecution(retries=0, retry_delay=timedelta(0)),
        )
        extract() >> triage
        publish(triage.result)
    return dag


def test_a_plan_runs_between_the_teams_own_tasks(tmp_path) -> None:
    log = CallLog(tmp_path)
    dag = team_dag("team_triage", log)
    assert "triage.replan" not in dag.task_ids  # a group never replans
    assert dag.get_task("triage.plan").upstream_task_ids == {"extract"}
    assert dag.get_task("publish").upstream_task_ids == {"triage.finalize"}

    run = run_plan_dag(dag)
    states = task_states(run)
    assert str(run.state) == "success"
    assert states["extract"] == states["triage.plan"] == states["triage.finalize"] == "success"
    assert [states[f"triage.nodes[{i}]"] for i in range(3)] == ["success"] * 3
    assert {n: log.count(node=n) for n in "abc"} == dict.fromkeys("abc", 1)
    result = xcom(run, "triage.finalize")
    assert (result["status"], result["reason"]) == ("completed", "goal_met")
    published = xcom(run, "publish")
    assert published == {
        "status": "completed",
        "outputs": {"a": 3, "b": 3, "c": {"left": 3, "right": 3}},
        "goal": "why is payments slow",  # the group's goal, rendered with the run's context
    }


def test_a_failed_session_fails_the_group_and_the_tasks_after_it_do_not_run(tmp_path) -> None:
    log = CallLog(tmp_path)
    dag = team_dag("team_triage_fails", log, compare={"permanent": "comparison service says 403"})
    run = run_plan_dag(dag, {"goal": "not the group's", "max_steps": 1})  # the conf belongs to the team's DAG
    states = task_states(run)
    assert str(run.state) == "failed"
    assert states["triage.nodes[2]"] == "failed" and states["triage.finalize"] == "failed"
    assert states["publish"] == "upstream_failed"
    result = xcom(run, "triage.finalize")
    assert (result["status"], result["reason"]) == ("failed", "node_failed")  # never replanned
    assert result["goal"] == "why is payments slow"
    assert result["usage"]["steps"] == 3  # the conf's max_steps was not read: the group's budgets hold


def test_two_groups_in_one_dag_are_two_sessions(tmp_path) -> None:
    from airflow.sdk import DAG

    from airflow_plan_provider import plan_task_group

    log = CallLog(tmp_path)
    registry = scripted_registry(
        ScriptedTool("count", log=log, returns=3),
        ScriptedTool("compare", log=log, returns=lambda params: params),
    )
    settings: dict[str, Any] = {
        "planner": ScriptedPlanner(PLAN),
        "tools": registry,
        "limits": Limits(),
        "execution": NodeExecution(retries=0, retry_delay=timedelta(0)),
    }
    with DAG("two_groups", schedule=None) as dag:
        first = plan_task_group("first", goal="first", **settings)
        second = plan_task_group("second", goal="second", **settings)
        first >> second
    run = run_plan_dag(dag)
    assert str(run.state) == "success"
    # the same node calls in two sessions: each calls its tools (no shared idempotency key or checkpoint)
    assert {n: log.count(node=n) for n in "abc"} == dict.fromkeys("abc", 2)
    assert len({call["key"] for call in log.calls()}) == 6
    assert [xcom(run, f"{group}.finalize")["goal"] for group in ("first", "second")] == ["first", "second"]

    # the plan view shows one group's plan: the first by default, another when named
    from airflow.utils.session import create_session

    from airflow_plan_provider.plugins.data import plan_view
    from airflow_plan_provider.plugins.store import load_chain

    with create_session() as session:
        shown = {group: load_chain(session, "two_groups", run.run_id, group) for group in (None, "second")}
    for group, goal in ((None, "first"), ("second", "second")):
        chain = shown[group]
        assert chain is not None and [r.run_id for r in chain] == [run.run_id]
        view = plan_view("two_groups", run.run_id, chain)
        assert view["goal"] == goal and view["outcome"]["status"] == "completed"
        nodes = {node["id"]: node for node in view["runs"][0]["nodes"]}
        assert {n: (nodes[n]["task_id"], nodes[n]["state"]) for n in "abc"} == {
            "a": (f"{goal}.nodes", "success"),
            "b": (f"{goal}.nodes", "success"),
            "c": (f"{goal}.nodes", "success"),
        }
        assert view["runs"][0]["plan_state"] == "planned"
