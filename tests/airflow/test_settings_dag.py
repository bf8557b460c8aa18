"""Settings objects on the DAG: every task gets operator_args, a keyword of neither the factory nor the
DAG (or TaskGroup) is Python's TypeError, and a setting of the wrong type names the object to use."""

from __future__ import annotations

from datetime import timedelta

import pytest

from airflow_plan_provider import ArtifactStore, Budgets, ControlRetries, Limits, NodeExecution
from airflow_plan_provider.contract import FINALIZE_TASK, NODES_TASK, PLAN_TASK, REPLAN_TASK
from airflow_plan_provider.testing import CallLog, ScriptedTool, scripted_registry

pytestmark = pytest.mark.airflow


def registry(tmp_path):
    return scripted_registry(ScriptedTool("a", log=CallLog(tmp_path)))


def test_settings_reach_the_tasks_and_operator_args_reach_every_task(tmp_path) -> None:
    from airflow_plan_provider import build_plan_dag

    dag = build_plan_dag(
        "settings_shape",
        planner=None,
        tools=registry(tmp_path),
        limits=Limits(max_nodes=7),
        budgets=Budgets(max_steps=4, max_replans=1),
        execution=NodeExecution(retries=1, timeout=timedelta(minutes=1), max_active_nodes=2, pool="p"),
        artifacts=ArtifactStore(url="file:///tmp/store", threshold=10, checkpoints=False),
        control_retries=ControlRetries(retries=0),
        operator_args={"owner": "data-team", "queue": "plans"},
    )
    assert sorted(dag.task_ids) == [FINALIZE_TASK, NODES_TASK, PLAN_TASK, REPLAN_TASK]
    assert {(t.owner, t.queue) for t in dag.tasks} == {("data-team", "plans")}
    plan = dag.get_task(PLAN_TASK)
    assert plan.limits == Limits(max_nodes=7) and plan.budgets == Budgets(max_steps=4, max_replans=1)
    assert dag.params["max_steps"] == 4 and dag.params["max_replans"] == 1  # the trigger form's defaults
    node = dag.get_task(NODES_TASK)
    assert (node.retries, node.execution_timeout, node.max_active_tis_per_dagrun, node.pool) == (
        1,
        timedelta(minutes=1),
        2,
        "p",
    )
    partial = node.partial_kwargs
    assert (partial["artifact_store"], partial["artifact_threshold"], partial["checkpoints"]) == (
        "file:///tmp/store",
        10,
        False,
    )
    assert {t.retries for t in dag.tasks if t.task_id != NODES_TASK} == {0}


def test_an_unknown_keyword_or_a_setting_of_the_wrong_type_is_a_clear_error(tmp_path) -> None:
    from airflow.sdk import DAG

    from airflow_plan_provider import build_plan_dag, plan_task_group

    # the factories pass what they do not take to the DAG or the TaskGroup, whose own error names it
    with pytest.raises(TypeError, match=r"DAG.__init__\(\) got an unexpected keyword argument 'max_layers'"):
        build_plan_dag("unknown_keyword", planner=None, tools=registry(tmp_path), max_layers=3)
    with (
        DAG("unknown_group_keyword"),
        pytest.raises(
            TypeError, match=r"TaskGroup.__init__\(\) got an unexpected keyword argument 'node_retries'"
        ),
    ):
        plan_task_group("unknown", planner=None, tools=registry(tmp_path), node_retries=1)
    with pytest.raises(ValueError, match=r"approval must be ApprovalPolicy\(\.\.\.\)"):
        build_plan_dag("old_approval", planner=None, tools=registry(tmp_path), approval="always")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"operator_args may not set 'execution_timeout'"):
        build_plan_dag(
            "owned", planner=None, tools=registry(tmp_path), operator_args={"execution_timeout": timedelta(1)}
        )
