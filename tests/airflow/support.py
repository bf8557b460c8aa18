"""Reading what a run left in the test's SQLite database (runs are made with
:mod:`airflow_plan_provider.testing.in_process`)."""

from __future__ import annotations

import os
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

from airflow_plan_provider.contract import RESULT_KEY
from harness.sqlite import migrate_or_copy_template


@cache
def migrate_db() -> None:
    """The test process's database (tests/conftest.py names it), migrated: a SQLite file not there yet
    starts as a copy of the one this environment's Airflow migrated last, as the clusters' do
    (:func:`harness.sqlite.migrate_or_copy_template`; ``airflow db migrate`` costs about 6 s of CPU)."""
    airflow = Path(sys.executable).with_name("airflow")
    migrate_or_copy_template(
        os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"],
        lambda: subprocess.run([str(airflow), "db", "migrate"], check=True, capture_output=True),
    )


def task_states(dag_run: Any) -> dict[str, str]:
    """``task_id`` (or ``task_id[map_index]``) → state, for every task instance of the run."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        tis = session.query(TaskInstance).filter_by(dag_id=dag_run.dag_id, run_id=dag_run.run_id).all()
        return {
            (ti.task_id if ti.map_index < 0 else f"{ti.task_id}[{ti.map_index}]"): str(ti.state) for ti in tis
        }


def xcom(dag_run: Any, task_id: str, key: str = RESULT_KEY, map_index: int = -1) -> Any:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = (
            session.query(XComModel)
            .filter_by(
                dag_id=dag_run.dag_id, run_id=dag_run.run_id, task_id=task_id, key=key, map_index=map_index
            )
            .one_or_none()
        )
        return None if row is None else XComModel.deserialize_value(row)


def run_xcoms(dag_run: Any) -> dict[tuple[str, int, str], Any]:
    """Every XCom of the run: (task_id, map_index, key) → value."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(XComModel).filter_by(dag_id=dag_run.dag_id, run_id=dag_run.run_id).all()
        return {(row.task_id, row.map_index, row.key): XComModel.deserialize_value(row) for row in rows}


def rendered_fields(dag_run: Any) -> dict[tuple[str, int], Any]:
    """(task id, map index) → the rendered fields Airflow kept for each task instance of ``dag_run``: by
    run and map index up to Airflow 3.3, by task instance (one row per try) from 3.4."""
    from airflow.models.renderedtifields import RenderedTaskInstanceFields as Rendered
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        if hasattr(Rendered, "dag_id"):
            rows = session.query(Rendered).filter_by(dag_id=dag_run.dag_id, run_id=dag_run.run_id)
            return {(row.task_id, row.map_index): row.rendered_fields for row in rows}
        joined = (
            session.query(TaskInstance.task_id, TaskInstance.map_index, Rendered.rendered_fields)
            .join(Rendered, Rendered.task_instance_id == TaskInstance.id)
            .filter(TaskInstance.dag_id == dag_run.dag_id, TaskInstance.run_id == dag_run.run_id)
        )
        return {(task_id, map_index): fields for task_id, map_index, fields in joined}
