"""Running a DAG built inside a test with ``dag.test()`` on the test's SQLite database."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any


@cache
def migrate_db() -> None:
    airflow = Path(sys.executable).with_name("airflow")
    subprocess.run([str(airflow), "db", "migrate"], check=True, capture_output=True)


@contextmanager
def next_run_id(run_id: str) -> Iterator[None]:
    """Give the next run ``dag.test()`` creates the id ``run_id``.

    ``dag.test()`` (Airflow 3.3) takes no run id: it names its run with ``DagRun.generate_run_id``. A
    replan run must carry the id its parent's replan task gives it (the planning task checks), so that
    one call is answered with ``run_id``; later calls get generated ids as usual.
    """
    from unittest.mock import patch

    from airflow.models.dagrun import DagRun

    generate = DagRun.generate_run_id
    pending = [run_id]

    def generate_run_id(**kwargs: Any) -> str:
        return pending.pop() if pending else generate(**kwargs)

    with patch.object(DagRun, "generate_run_id", staticmethod(generate_run_id)):
        yield


def run_dag(
    dag: Any, conf: dict[str, Any] | None = None, *, run_id: str | None = None, **test_kwargs: Any
) -> Any:
    """Serialise ``dag`` to the database, run it with ``dag.test()``, and return the DagRun.

    ``run_id`` names the run (as a REST API trigger or the replan task may); by default ``dag.test()``
    generates one.
    """
    migrate_db()
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db

    DagBundlesManager().sync_bundles_to_db()
    bag = DagBag(dag_folder="/nonexistent", collect_dags=False)
    bag.bag_dag(dag)
    sync_bag_to_db(bag, "dags-folder", None)
    # the replan task waits for a run dag.test never starts; the end-to-end tests run it for real
    test_kwargs.setdefault("mark_success_pattern", "^replan$")
    if run_id is None:
        return dag.test(run_conf=conf or {}, **test_kwargs)
    with next_run_id(run_id):
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


def run_xcoms(dag_run: Any) -> dict[tuple[str, int, str], Any]:
    """Every XCom of the run: (task_id, map_index, key) → value."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(XComModel).filter_by(dag_id=dag_run.dag_id, run_id=dag_run.run_id).all()
        return {(row.task_id, row.map_index, row.key): XComModel.deserialize_value(row) for row in rows}


def run_chain(dag: Any, conf: dict[str, Any] | None = None, max_runs: int = 6) -> list[Any]:
    """Run a plan session in-process: each run with ``dag.test()``, and each replan run it prepares after it.

    The ``replan`` task itself (which triggers and waits for the next run on a real scheduler) is
    marked success instead of running; the end-to-end tests cover it. Each replan run gets what the
    replan task would give it: finalize's ``replan_conf`` as its conf, and the run id
    :func:`~airflow_plan_provider.operators.replan.replan_run_id` of the session's root and revision.
    """
    from airflow_plan_provider.operators.replan import replan_run_id

    runs = [run_dag(dag, conf, mark_success_pattern="^replan$")]
    while len(runs) < max_runs:
        replan_conf = xcom(runs[-1], "finalize", key="replan_conf")
        if not replan_conf:
            break
        session = replan_conf["session"]
        child = replan_run_id(session["root_run_id"], session["revision"])
        runs.append(run_dag(dag, replan_conf, run_id=child, mark_success_pattern="^replan$"))
    return runs
