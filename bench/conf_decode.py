"""What a run's conf costs each load of the run's task instances: the query the scheduler (``DagRun.
fetch_task_instances``, every loop) and the execution API's state read (``GET task-instances/states``)
make, ``select(TaskInstance)`` of one run, timed for runs of N instances whose conf is small (a goal)
and holds an N-node plan (as the bench plans are written), side by side.

Airflow maps ``TaskInstance.dag_run`` as a joined load, and SQLAlchemy decodes a JSON column once per
result row: the run's conf is decoded once per instance. No cluster: one SQLite metadata database in a
temporary ``AIRFLOW_HOME``, a DAG of N ``EmptyOperator`` tasks written to it, two runs created per N.

Run::

    .venv/bin/python bench/conf_decode.py [--nodes 60 500 1000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

LAYER_WIDTH, SLEEP, SEED = 25, 0.5, 3


def plan_conf(n: int) -> dict[str, Any]:
    """The conf the bench gave its plan DAG for an n-node plan (goal and plan)."""
    from _planbench import random_layered_plan, work_plan

    widths = [LAYER_WIDTH] * (n // LAYER_WIDTH) + ([n % LAYER_WIDTH] if n % LAYER_WIDTH else [])
    plan, seconds = random_layered_plan(widths, lambda rng: SLEEP, SEED, f"a {n}-node plan")
    return {"goal": plan["goal"], "plan": work_plan(plan, seconds)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", nargs="+", type=int, default=[60, 500, 1000])
    parser.add_argument("--repeat", type=int, default=5, help="loads per figure (medians are printed)")
    args = parser.parse_args()

    home = tempfile.mkdtemp(prefix="conf-decode-")
    os.environ["AIRFLOW_HOME"] = home
    os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{home}/airflow.db"
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    from airflow.models.dagrun import DagRun
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.models.taskinstance import TaskInstance
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG
    from airflow.utils.db import resetdb
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunTriggeredByType, DagRunType
    from sqlalchemy import select

    from airflow_plan_provider.testing.in_process import _write_to_db

    resetdb(skip_init=False)
    rows = []
    for n in args.nodes:
        dag_id = f"conf_decode_{n}"
        with DAG(dag_id, schedule=None) as dag:
            for i in range(n):
                EmptyOperator(task_id=f"t{i}")
        _write_to_db(dag)
        with create_session() as session:
            scheduler_dag = SerializedDagModel.get_dag(dag_id, session=session)
        confs = {"goal only": {"goal": "a goal"}, "plan in conf": plan_conf(n)}
        timings: dict[str, float] = {}
        for label, conf in confs.items():
            run_id = f"{label.replace(' ', '_')}_{n}"
            scheduler_dag.create_dagrun(
                run_id=run_id,
                run_after=datetime.now(UTC),
                conf=conf,
                run_type=DagRunType.MANUAL,
                triggered_by=DagRunTriggeredByType.TEST,
                state=DagRunState.RUNNING,
            )
            loads = []
            for _ in range(args.repeat):
                with create_session() as session:
                    t0 = time.perf_counter()
                    tis = session.scalars(
                        select(TaskInstance).where(
                            TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id
                        )
                    ).all()
                    loads.append(time.perf_counter() - t0)
                    assert len(tis) == n, (len(tis), n)
                    session.expunge_all()
            timings[label] = statistics.median(loads)
            with create_session() as session:
                run = session.scalars(select(DagRun).where(DagRun.run_id == run_id)).one()
                timings[f"{label} bytes"] = len(json.dumps(run.conf))
        rows.append((n, timings))
    print(
        f"\nOne load of a run's task instances (select(TaskInstance), SQLite), median of {args.repeat};"
        f" {time.strftime('%Y-%m-%d %H:%M %Z')}, load average {os.getloadavg()[0]:.1f}"
    )
    print(
        f"  {'instances':>9} {'conf':>8} {'goal only ms':>13} {'plan conf':>10} {'plan in conf ms':>16} ratio"
    )
    for n, t in rows:
        print(
            f"  {n:>9} {t['goal only bytes']:>7}B {t['goal only'] * 1000:>13.1f}"
            f" {t['plan in conf bytes'] / 1000:>8.0f}kB {t['plan in conf'] * 1000:>16.1f}"
            f" {t['plan in conf'] / t['goal only']:>5.1f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
