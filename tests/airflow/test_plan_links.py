"""Links between the runs of a plan session: the root's ``replan`` task to the run it started, and the
replan run's ``plan`` task back to its parent (in-process; the end-to-end browser test follows them)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from airflow_plan_provider import NodeExecution
from airflow_plan_provider.contract import PLAN_TASK, REPLAN_TASK
from airflow_plan_provider.testing import CallLog, scripted_registry
from airflow_plan_provider.testing.in_process import run_session
from harness.seed import seed_replan_story
from tests.airflow.support import xcom

pytestmark = pytest.mark.airflow


def build(dag_id: str, log: CallLog):
    from airflow_plan_provider.dag_factory import build_plan_dag

    planner, tools = seed_replan_story(log)
    return build_plan_dag(
        dag_id,
        planner=planner,
        tools=scripted_registry(*tools),
        execution=NodeExecution(retries=0, retry_delay=timedelta(seconds=0)),
    )


def test_replan_task_triggers_its_own_dag_as_parsed_and_as_serialized(tmp_path):
    """The "Triggered DAG" link reads ``trigger_dag_id`` from the task as parsed: after the deferral the
    task resumes in a new process, where nothing ``execute`` set survives."""
    from airflow.serialization.serialized_objects import DagSerialization

    dag = build("links_replan_target", CallLog(tmp_path))
    assert dag.get_task(REPLAN_TASK).trigger_dag_id == "links_replan_target"

    data = DagSerialization.to_dict(dag)
    [replan] = [t for t in data["dag"]["tasks"] if t["__var"]["task_id"] == REPLAN_TASK]
    assert replan["__var"]["trigger_dag_id"] == "links_replan_target"
    assert replan["__var"]["_operator_extra_links"] == {"Triggered DAG": "_link_TriggerDagRunLink"}
    restored = DagSerialization.from_dict(data)
    assert restored.get_task(REPLAN_TASK).trigger_dag_id == "links_replan_target"


def test_replan_operator_needs_the_dag_id():
    from airflow_plan_provider.operators.replan import ReplanOperator

    with pytest.raises(TypeError, match="trigger_dag_id"):
        ReplanOperator(task_id=REPLAN_TASK)  # type: ignore[call-arg]


def test_replan_run_links_back_to_its_parent(tmp_path):
    session = run_session(
        build("links_parent", CallLog(tmp_path)), {"goal": "find why the payment API got slow"}
    )
    root, child = session.runs
    assert xcom(root, PLAN_TASK, key="_link_ParentRunLink") is None  # a root run has no parent to link
    link = xcom(child, PLAN_TASK, key="_link_ParentRunLink")
    assert link.endswith(f"/dags/links_parent/runs/{root.run_id}"), link
