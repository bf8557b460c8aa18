"""Reading a plan session's outcome from a running Airflow through the REST API (see ``cluster``)."""

from __future__ import annotations

from typing import Any

from airflow_plan_provider.operators.layout import EAGER_TASK, LANE_SEPARATOR
from airflow_plan_provider.testing.cluster import AirflowApiError, AirflowCluster


def session_result(
    cluster: AirflowCluster, dag_id: str, run_id: str, group: str | None = None
) -> dict[str, Any] | None:
    """The SessionResult a run reports: from its ``replan`` task when it replanned, else ``finalize``
    (``<group>.finalize`` for a plan in task group ``group``)."""
    prefix = f"{group}." if group else ""
    for task_id in ("replan", "finalize"):
        try:
            value = cluster.xcom(dag_id, run_id, prefix + task_id)
        except AirflowApiError as error:
            if error.status == 404:
                continue
            raise
        if isinstance(value, dict) and "status" in value and (task_id == "finalize" or value.get("run_ids")):
            return value
    return None


def node_states(
    cluster: AirflowCluster, dag_id: str, run_id: str, group: str | None = None
) -> dict[str, str]:
    """Plan node id → Airflow task state, for the node tasks of one run (``layer_k``, or ``nodes`` in eager
    mode, and their pool lanes ``layer_k__<pool>``, ``nodes__<pool>``; in task group ``group``, those of
    the group), read from each node's label."""
    prefix = f"{group}." if group else ""
    states: dict[str, str] = {}
    for ti in cluster.task_instances(dag_id, run_id):
        if not ti["task_id"].startswith(prefix):
            continue
        task_id = ti["task_id"][len(prefix) :]
        is_node_task = task_id.startswith("layer_") or task_id.partition(LANE_SEPARATOR)[0] == EAGER_TASK
        if is_node_task and ti["map_index"] >= 0:
            label = ti.get("rendered_map_index") or ""
            states[label.split(" · ")[0]] = ti["state"]
    return states
