"""Reading the contract's XComs through a task instance: the plan, the session, node records.

The names and shapes are the contract's (:mod:`airflow_plan_provider.contract`). Inside a task group
(:func:`~airflow_plan_provider.dag_factory.plan_task_group`) every task id carries the group's prefix
(``triage.plan``, ``triage.nodes``); every read of another task's XCom goes through :func:`task_id_in`
with the reading task instance, which adds the prefix of the reader's own group: the tasks of one plan
are always in the same group.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from airflow_plan_provider.contract import (
    BRIEFS_PER_XCOM,
    NODE_KEY,
    PLAN_KEY,
    PLAN_TASK,
    RUN_CONTEXT_KEY,
    SESSION_KEY,
    TOOLS_KEY,
    NodeBrief,
    briefs_key,
    locked_key,
    node_tasks,
)
from airflow_plan_provider.plan.model import ValidatedPlan
from airflow_plan_provider.plan.result import NodeRecord
from airflow_plan_provider.plan.session import LockedOutput, RunContext, SessionState
from airflow_plan_provider.tools.registry import ToolRegistry
from airflow_plan_provider.tools.sources import listing_of


def group_prefix(task: Any) -> str:
    """The prefix Airflow gives the ids of the tasks in ``task``'s group: ``""`` at the top of a DAG,
    ``"triage."`` in group ``triage`` (``"outer.triage."`` in a nested group)."""
    group = getattr(task, "task_group", None)
    return str(group.child_id("")) if group is not None else ""


def task_id_in(ti: Any, task_id: str) -> str:
    """The full id of the plan's task ``task_id`` (say ``plan``) in the run of task instance ``ti``."""
    return group_prefix(getattr(ti, "task", None)) + task_id


def has_task(ti: Any, task_id: str) -> bool:
    """Whether the plan of task instance ``ti`` has its task ``task_id`` (say ``approve``): a DAG built
    without approval has no approve task, and a read of its XCom would be a request for nothing. True
    when the instance does not carry its DAG."""
    dag = getattr(getattr(ti, "task", None), "dag", None)
    return dag is None or bool(dag.has_task(task_id_in(ti, task_id)))


def pull_plan(ti: Any) -> ValidatedPlan | None:
    raw = ti.xcom_pull(task_ids=task_id_in(ti, PLAN_TASK), key=PLAN_KEY)
    return ValidatedPlan.model_validate(raw) if raw else None


def pull_brief(ti: Any) -> NodeBrief | None:
    """The brief of node instance ``ti``, as the planning task published it (None when it did not)."""
    task = getattr(ti, "task", None)
    task_id = ti.task_id.removeprefix(group_prefix(task))
    briefs = ti.xcom_pull(task_ids=task_id_in(ti, PLAN_TASK), key=briefs_key(task_id, ti.map_index))
    position = ti.map_index % BRIEFS_PER_XCOM
    if not isinstance(briefs, list) or position >= len(briefs):
        return None
    return NodeBrief.model_validate(briefs[position])


def pull_tools(ti: Any, tools: ToolRegistry) -> ToolRegistry:
    """``tools`` with the tools its sources listed when this run planned (the planning task's
    ``tools``); ``tools`` itself when it declares no source."""
    if not tools.sources:
        return tools
    listing = listing_of(ti.xcom_pull(task_ids=task_id_in(ti, PLAN_TASK), key=TOOLS_KEY))
    return tools.with_listing(listing)


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


def pull_node_records(
    ti: Any, plan: ValidatedPlan, run: RunContext, node_ids: Iterable[str] | None = None
) -> dict[str, NodeRecord]:
    """Node id → the record it pushed (status, output, ...), for ``node_ids`` (default: every node of
    the run); a node whose task never reported is absent (see :func:`pull_records_at`)."""
    wanted = None if node_ids is None else set(node_ids)
    return pull_records_at(
        ti,
        {
            node: (task_id, index)
            for task_id, nodes in node_tasks(plan, run).items()
            for index, node in enumerate(nodes)
            if wanted is None or node in wanted
        },
    )


def pull_records_at(ti: Any, at: Mapping[str, tuple[str, int]]) -> dict[str, NodeRecord]:
    """Node id → the record it pushed, for the nodes of ``at`` (node id → the task id and map index of
    its instance); a node whose task never reported is absent.

    Per node task: when the wanted nodes are the task's first instances (every node, for finalize), one
    XCom request, the task's records up to the highest wanted map index as one sequence slice (records
    are ordered by map index, and a task has at most one record per index, so the first ``index + 1``
    records hold every record at or below ``index``); otherwise one request per wanted node (its
    instance's record): a slice would carry every record before the last wanted one, so what a node
    reads would grow with the plan, where its parents' records weigh a few KB.
    """
    by_task: dict[str, dict[int, str]] = {}
    for node, (task_id, index) in at.items():
        by_task.setdefault(task_id, {})[index] = node
    records: dict[str, NodeRecord] = {}
    for task_id, nodes in by_task.items():
        indexes = sorted(nodes)
        if indexes[-1] + 1 == len(indexes):
            values = _pull_records(ti, task_id, stop=len(indexes))
        else:
            values = [_pull_record(ti, task_id, index) for index in indexes]
        wanted = set(nodes.values())
        for value in values:
            node_id = value.get("node_id") if isinstance(value, dict) else None
            if node_id in wanted:
                records[node_id] = NodeRecord.model_validate(value)
    return records


def _pull_record(ti: Any, task_id: str, index: int) -> Any:
    """The node record of instance ``index`` of ``task_id`` in this run (None when it pushed none)."""
    return ti.xcom_pull(task_ids=task_id_in(ti, task_id), key=NODE_KEY, map_indexes=index)


def _pull_records(ti: Any, task_id: str, stop: int) -> list[Any]:
    """The first ``stop`` node records of ``task_id`` in this run (by map index), in one request."""
    from airflow_plan_provider.compat import first_mapped_xcoms

    return first_mapped_xcoms(ti, task_id_in(ti, task_id), NODE_KEY, stop)
