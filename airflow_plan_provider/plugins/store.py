"""Reading a plan session's runs from Airflow's metadata database (in the API server), as :class:`RunData`.

Three small queries per run set (:mod:`airflow_plan_provider.compat` holds them): the runs, their XComs
(only the keys the view reads) and their task instances.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from airflow_plan_provider import compat
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
    planning = compat.first_task_with_xcom(session, dag_id, run_id, SESSION_KEY, [PLAN_TASK], f".{PLAN_TASK}")
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
    runs = {
        run["run_id"]: RunData(
            run_id=run["run_id"],
            prefix=prefix,
            state=_state(run["state"]),
            start_date=_iso(run["start_date"]),
            end_date=_iso(run["end_date"]),
            note=run["note"],
        )
        for run in compat.read_runs(session, dag_id, run_ids)
    }
    if not runs:
        return runs
    keys = list(keys) if keys is not None else [(prefix + task, key) for task, key in XCOM_KEYS]
    records = NODE_KEY if with_tis else None
    for run_id, task_id, map_index, key, value in compat.read_xcoms(
        session, dag_id, runs, keys, every_instance_key=records
    ):
        runs[run_id].xcoms[(task_id, map_index, key)] = value
    if with_tis:
        for ti in compat.read_task_instances(session, dag_id, runs):
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
