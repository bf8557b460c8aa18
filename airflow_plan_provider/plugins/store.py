"""Reading a plan session's runs from Airflow's metadata database (in the API server), as :class:`RunData`.

Three small queries per run set: the runs, their XComs (only the keys the view reads) and their task
instances. Values are decoded as the public REST API decodes them (``XComModel.deserialize_value``).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from airflow_plan_provider.contract import NODE_KEY, PLAN_TASK, SESSION_KEY
from airflow_plan_provider.plugins.data import XCOM_KEYS, RunData, chain_candidates, root_of, session_chain


def load_chain(session: Session, dag_id: str, run_id: str, group: str | None = None) -> list[RunData] | None:
    """The runs of the session run ``run_id`` belongs to (root first), or None when there is no such run.

    A plan in a task group (``plan_task_group``) is found by its planning task ``<group>.plan``:
    ``group`` names it, else the run's first plan (by task id) is shown.
    """
    prefix = _plan_prefix(session, dag_id, run_id, group)
    keys = ((prefix + PLAN_TASK, SESSION_KEY),)
    opened = load_runs(session, dag_id, [run_id], keys=keys, with_tis=False, prefix=prefix)
    if run_id not in opened:
        return None
    root, max_replans = root_of(opened[run_id])
    candidates = chain_candidates(root, max_replans)
    runs = load_runs(session, dag_id, sorted({run_id, *candidates}), prefix=prefix)
    return session_chain(run_id, runs)


def load_node_record(
    session: Session, dag_id: str, run_id: str, node_id: str, group: str | None = None
) -> dict[str, Any] | None:
    """The record node ``node_id`` of run ``run_id`` pushed (its ``node`` XCom), or None."""
    prefix = _plan_prefix(session, dag_id, run_id, group)
    runs = load_runs(session, dag_id, [run_id], keys=(), with_tis=True, prefix=prefix)
    run = runs.get(run_id)
    return run.records.get(node_id) if run is not None else None


def _plan_prefix(session: Session, dag_id: str, run_id: str, group: str | None) -> str:
    """The task id prefix of the plan to show: ``""`` for a plan DAG, ``"<group>."`` for a task group."""
    if group:
        return f"{group}."
    from airflow.models.xcom import XComModel

    planning = session.scalars(
        select(XComModel.task_id)
        .where(XComModel.dag_id == dag_id, XComModel.run_id == run_id, XComModel.key == SESSION_KEY)
        .where(or_(XComModel.task_id == PLAN_TASK, XComModel.task_id.like(f"%.{PLAN_TASK}")))
        .order_by(XComModel.task_id)
    ).first()
    return planning.removesuffix(PLAN_TASK) if planning else ""


def load_runs(
    session: Session,
    dag_id: str,
    run_ids: Iterable[str],
    *,
    keys: Iterable[tuple[str, str]] | None = None,
    with_tis: bool = True,
    prefix: str = "",
) -> dict[str, RunData]:
    """Run id → :class:`RunData`, for the runs of ``dag_id`` among ``run_ids`` that exist.

    Reads the XComs named in ``keys`` (full task id, key; default :data:`XCOM_KEYS` of the plan whose
    task ids start with ``prefix``) and, with ``with_tis``, every node record and task instance.
    """
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel

    wanted = list(run_ids)
    runs: dict[str, RunData] = {}
    for dag_run in session.scalars(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id.in_(wanted))):
        runs[dag_run.run_id] = RunData(
            run_id=dag_run.run_id,
            prefix=prefix,
            state=_state(dag_run.state),
            start_date=_iso(dag_run.start_date),
            end_date=_iso(dag_run.end_date),
            note=dag_run.note,
        )
    if not runs:
        return runs
    keys = list(keys) if keys is not None else [(prefix + task, key) for task, key in XCOM_KEYS]
    which: list[Any] = [(XComModel.task_id == task_id) & (XComModel.key == key) for task_id, key in keys]
    if with_tis:
        which.append(XComModel.key == NODE_KEY)
    rows = session.scalars(
        select(XComModel).where(XComModel.dag_id == dag_id, XComModel.run_id.in_(list(runs)), or_(*which))
    )
    for row in rows:
        runs[row.run_id].xcoms[(row.task_id, row.map_index, row.key)] = XComModel.deserialize_value(row)
    if with_tis:
        tis = session.execute(
            select(
                TaskInstance.run_id,
                TaskInstance.task_id,
                TaskInstance.map_index,
                TaskInstance.state,
                TaskInstance.try_number,
                TaskInstance.start_date,
                TaskInstance.end_date,
                TaskInstance.duration,
                TaskInstance.hostname,
                TaskInstance.next_method,
            ).where(TaskInstance.dag_id == dag_id, TaskInstance.run_id.in_(list(runs)))
        )
        for ti in tis:
            runs[ti.run_id].tis[(ti.task_id, ti.map_index)] = {
                "state": _state(ti.state),
                "try_number": ti.try_number,
                "start_date": _iso(ti.start_date),
                "end_date": _iso(ti.end_date),
                "duration": ti.duration,
                "hostname": ti.hostname or None,
                "next_method": ti.next_method or None,  # a deferred node's: what it waits for
            }
    return runs


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _state(value: Any) -> str | None:
    return None if value is None else str(getattr(value, "value", value))
