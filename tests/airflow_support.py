"""Running a DAG built inside a test with ``dag.test()`` on the test's SQLite database."""

from __future__ import annotations

import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any


@cache
def migrate_db() -> None:
    airflow = Path(sys.executable).with_name("airflow")
    subprocess.run([str(airflow), "db", "migrate"], check=True, capture_output=True)


def run_dag(dag: Any, conf: dict[str, Any] | None = None, **test_kwargs: Any) -> Any:
    """Serialise ``dag`` to the database, run it with ``dag.test()``, and return the DagRun."""
    migrate_db()
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db

    DagBundlesManager().sync_bundles_to_db()
    bag = DagBag(dag_folder="/nonexistent", collect_dags=False)
    bag.bag_dag(dag)
    sync_bag_to_db(bag, "dags-folder", None)
    # the replan task waits for a run dag.test never starts; the end-to-end tests run it for real
    test_kwargs.setdefault("mark_success_pattern", "^replan$")
    return dag.test(run_conf=conf or {}, **test_kwargs)


def task_states(dag_run: Any) -> dict[str, str]:
    """``task_id`` (or ``task_id[map_index]``) → state, for every task instance of the run."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        tis = session.query(TaskInstance).filter_by(dag_id=dag_run.dag_id, run_id=dag_run.run_id).all()
        return {
            (ti.task_id if ti.map_index < 0 else f"{ti.task_id}[{ti.map_index}]"): str(ti.state) for ti in tis
        }


def xcom(dag_run: Any, task_id: str, key: str = "return_value", map_index: int = -1) -> Any:
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


def run_chain(dag: Any, conf: dict[str, Any] | None = None, max_runs: int = 6) -> list[Any]:
    """Run a plan session in-process: each run with ``dag.test()``, and each replan run it prepares after it.

    The ``replan`` task itself (which triggers and waits for the next run on a real scheduler) is
    marked success instead of running; the end-to-end tests cover it.
    """
    runs = [run_dag(dag, conf, mark_success_pattern="^replan$")]
    while len(runs) < max_runs:
        replan_conf = xcom(runs[-1], "finalize", key="replan_conf")
        if not replan_conf:
            break
        runs.append(run_dag(dag, replan_conf, mark_success_pattern="^replan$"))
    return runs
