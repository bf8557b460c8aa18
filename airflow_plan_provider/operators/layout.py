"""Names and helpers shared by the plan operators: task ids, XCom keys, and where node records are.

Where a node runs is decided in one place, :func:`node_tasks`: the node tasks of a run and the node ids
each one maps, in map-index order. Nodes run in the mapped task ``nodes``, except nodes whose tool
declares an Airflow pool: Airflow gives every instance of a mapped task the task's pool, so those run in
a lane of their own, ``nodes__<lane>``, built with that pool. In every task the map-index order is the
plan's run order (topological: layer by layer, more descendants first within a layer): among instances
of equal priority weight Airflow's scheduler hands out slots in map-index order, so a node's parents in
its task get slots before it, and among the nodes of a layer those that hold up most of the plan. The
planning task records each pooled node's lane in the run's context (``RunContext.lanes``); every reader —
the tasks that return a lane's node ids to map over, the nodes reading their parents' records, finalize —
locates nodes through :func:`node_location` / :func:`node_tasks` with that context.

Inside a task group (:func:`~airflow_plan_provider.dag_factory.plan_task_group`) every task id carries
the group's prefix (``triage.plan``, ``triage.nodes``). The ids here are the unprefixed ones; every read
of another task's XCom goes through :func:`task_id_in` with the reading task instance, which adds the
prefix of the reader's own group: the tasks of one plan are always in the same group.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from airflow_plan_provider.plan.model import ValidatedPlan
from airflow_plan_provider.plan.result import NodeRecord
from airflow_plan_provider.plan.session import LockedOutput, RunContext, SessionState
from airflow_plan_provider.tools.registry import Tool

PLAN_TASK = "plan"
FINALIZE_TASK = "finalize"
REPLAN_TASK = "replan"
PLAN_KEY = "plan"
SESSION_KEY = "session"
RUN_CONTEXT_KEY = "run"  # what the node tasks need of the session (a RunContext)
PLANNING_ERROR_KEY = "planning_error"
NODE_KEY = "node"
RESULT_KEY = "return_value"
REPLAN_CONF_KEY = "replan_conf"
NODES_TASK = "nodes"
LANE_SEPARATOR = "__"
APPROVE_TASK = "approve"
APPROVAL_KEY = "approval"


def group_prefix(task: Any) -> str:
    """The prefix Airflow gives the ids of the tasks in ``task``'s group: ``""`` at the top of a DAG,
    ``"triage."`` in group ``triage`` (``"outer.triage."`` in a nested group)."""
    group = getattr(task, "task_group", None)
    return str(group.child_id("")) if group is not None else ""


def task_id_in(ti: Any, task_id: str) -> str:
    """The full id of the plan's task ``task_id`` (say ``plan``) in the run of task instance ``ti``."""
    return group_prefix(getattr(ti, "task", None)) + task_id


def select_task_id(node_task: str) -> str:
    """The task returning the node ids a pool lane's task maps (``select_nodes__api``)."""
    return f"select_{node_task}"


def lane_task_id(lane: str | None) -> str:
    """The node task of ``lane``: ``nodes`` for the default lane, ``nodes__<lane>`` for a pool's."""
    return f"{NODES_TASK}{LANE_SEPARATOR}{lane}" if lane else NODES_TASK


def lane_of(tool: Tool) -> str | None:
    """The lane of the nodes calling ``tool``: its pool, with the slot count when it takes more than one;
    None (the default lane) for a tool without a pool."""
    if not tool.pool:
        return None
    return tool.pool if tool.pool_slots == 1 else f"{tool.pool}{LANE_SEPARATOR}x{tool.pool_slots}"


def dag_lanes(tools: Iterable[Tool]) -> dict[str, Tool]:
    """Lane → a tool that runs in it (its pool and slots), for every pooled tool; sorted by lane.

    Raises ``ValueError`` when two different (pool, slots) pairs would share a lane name.
    """
    lanes: dict[str, Tool] = {}
    for tool in sorted(tools, key=lambda t: t.name):
        lane = lane_of(tool)
        if lane is None:
            continue
        other = lanes.setdefault(lane, tool)
        if (other.pool, other.pool_slots) != (tool.pool, tool.pool_slots):
            raise ValueError(
                f"tools {other.name!r} (pool {other.pool!r}, {other.pool_slots} slot(s)) and {tool.name!r} "
                f"(pool {tool.pool!r}, {tool.pool_slots} slot(s)) would share the node tasks "
                f"{lane_task_id(lane)!r}: rename one of the pools"
            )
    return dict(sorted(lanes.items()))


def locked_key(node_id: str) -> str:
    """The XCom key (of ``plan``) holding a reused node's locked output."""
    return f"locked__{node_id}"


def node_tasks(plan: ValidatedPlan, run: RunContext) -> dict[str, list[str]]:
    """Node task id → the node ids it maps, in map-index order: where every node of the run runs.

    ``nodes`` holds the nodes of the default lane, ``nodes__<lane>`` those of a pool's lane, each in the
    plan's run order (:attr:`~airflow_plan_provider.plan.model.ValidatedPlan.run_order`: a parent before
    its children). A task with no node is absent.
    """
    tasks: dict[str, list[str]] = {}
    for node in plan.run_order:
        tasks.setdefault(lane_task_id(run.lanes.get(node)), []).append(node)
    return tasks


def pull_plan(ti: Any) -> ValidatedPlan | None:
    raw = ti.xcom_pull(task_ids=task_id_in(ti, PLAN_TASK), key=PLAN_KEY)
    return ValidatedPlan.model_validate(raw) if raw else None


def pull_session(ti: Any) -> SessionState:
    raw = ti.xcom_pull(task_ids=task_id_in(ti, PLAN_TASK), key=SESSION_KEY)
    return SessionState.model_validate(raw or {})


def pull_run_context(ti: Any) -> RunContext:
    raw = ti.xcom_pull(task_ids=task_id_in(ti, PLAN_TASK), key=RUN_CONTEXT_KEY)
    return RunContext.model_validate(raw or {})


def pull_locked(ti: Any, node_id: str) -> LockedOutput:
    """A reused node's locked output, as the planning task published it."""
    return LockedOutput.model_validate(
        ti.xcom_pull(task_ids=task_id_in(ti, PLAN_TASK), key=locked_key(node_id))
    )


def node_location(plan: ValidatedPlan, run: RunContext, node_id: str) -> tuple[str, int]:
    """The task id and map index of a node's task instance."""
    task_id = lane_task_id(run.lanes.get(node_id))
    return task_id, node_tasks(plan, run)[task_id].index(node_id)


def locations(plan: ValidatedPlan, run: RunContext, node_ids: Iterable[str]) -> dict[str, list[int]]:
    """Task id → map indexes of the given nodes' task instances."""
    found: dict[str, list[int]] = {}
    for node_id in node_ids:
        task_id, index = node_location(plan, run, node_id)
        found.setdefault(task_id, []).append(index)
    return found


def pull_node_records(
    ti: Any, plan: ValidatedPlan, run: RunContext, node_ids: Iterable[str] | None = None
) -> dict[str, NodeRecord]:
    """Node id → the record it pushed (status, output, ...), for ``node_ids`` (default: every node of
    the run); a node whose task never reported is absent.

    One XCom request per node task holding a wanted node: the task's records up to the highest wanted
    map index, as one sequence slice (records are ordered by map index, and a task has at most one
    record per index, so the first ``index + 1`` records hold every record at or below ``index``).
    """
    wanted = None if node_ids is None else set(node_ids)
    records: dict[str, NodeRecord] = {}
    for task_id, nodes in node_tasks(plan, run).items():
        indexes = [index for index, node in enumerate(nodes) if wanted is None or node in wanted]
        if not indexes:
            continue
        for value in _pull_records(ti, task_id, stop=max(indexes) + 1):
            node_id = value.get("node_id") if isinstance(value, dict) else None
            if node_id in nodes and (wanted is None or node_id in wanted):
                records[node_id] = NodeRecord.model_validate(value)
    return records


def _pull_records(ti: Any, task_id: str, stop: int) -> list[Any]:
    """The first ``stop`` node records of ``task_id`` in this run (by map index), in one request."""
    from airflow.sdk.definitions.xcom_arg import PlainXComArg
    from airflow.sdk.execution_time.lazy_sequence import LazyXComSequence

    source = PlainXComArg(ti.task.dag.get_task(task_id_in(ti, task_id)), key=NODE_KEY)
    return list(LazyXComSequence(xcom_arg=source, ti=ti)[:stop])


def approval_lets_nodes_run(record: Any) -> bool:
    """Whether the approval task's record (XCom ``approval``) lets the run's nodes run: approval was
    granted or not needed. No record (the task never answered) or anything else does not."""
    return isinstance(record, dict) and record.get("status") in ("granted", "not_needed")
