"""Names and helpers shared by the plan operators: task ids, XCom keys, and reading node records."""

from __future__ import annotations

from typing import Any

from airflow_plan_provider.plan.model import ValidatedPlan
from airflow_plan_provider.plan.session import SessionState

PLAN_TASK = "plan"
FINALIZE_TASK = "finalize"
REPLAN_TASK = "replan"
PLAN_KEY = "plan"
SESSION_KEY = "session"
PLANNING_ERROR_KEY = "planning_error"
NODE_KEY = "node"
RESULT_KEY = "return_value"
REPLAN_CONF_KEY = "replan_conf"
EAGER_TASK = "nodes"


def layer_task_id(index: int) -> str:
    return f"layer_{index}"


def select_task_id(index: int) -> str:
    return f"select_layer_{index}"


def pull_plan(ti: Any) -> ValidatedPlan | None:
    raw = ti.xcom_pull(task_ids=PLAN_TASK, key=PLAN_KEY)
    return ValidatedPlan.model_validate(raw) if raw else None


def pull_session(ti: Any) -> SessionState:
    raw = ti.xcom_pull(task_ids=PLAN_TASK, key=SESSION_KEY)
    return SessionState.model_validate(raw or {})


def eager_order(plan: ValidatedPlan) -> list[str]:
    """Node ids in the order the eager ``nodes`` task maps them (layer by layer)."""
    return [node for layer in plan.layers for node in layer]


def node_location(plan: ValidatedPlan, node_id: str, eager: bool = False) -> tuple[str, int]:
    """The task id and map index of a node's task instance."""
    if eager:
        return EAGER_TASK, eager_order(plan).index(node_id)
    layer = plan.layer_of(node_id)
    return layer_task_id(layer), plan.layers[layer].index(node_id)


def pull_node_record(
    ti: Any, plan: ValidatedPlan, node_id: str, eager: bool = False
) -> dict[str, Any] | None:
    """The record a node pushed (status, output, ...), or None if its task never reported."""
    task_id, index = node_location(plan, node_id, eager)
    record = ti.xcom_pull(task_ids=task_id, key=NODE_KEY, map_indexes=index)
    return record if isinstance(record, dict) else None


def pull_layer_records(ti: Any, plan: ValidatedPlan, eager: bool = False) -> dict[str, dict[str, Any]]:
    """Every node record of the run, node id → record: one XCom request per layer task."""
    records: dict[str, dict[str, Any]] = {}
    task_ids = [EAGER_TASK] if eager else [layer_task_id(index) for index in range(len(plan.layers))]
    for task_id in task_ids:
        values = ti.xcom_pull(task_ids=task_id, key=NODE_KEY)  # all map indexes
        for value in values if isinstance(values, list) else [values]:
            if isinstance(value, dict) and "node_id" in value:
                records[value["node_id"]] = value
    return records
