"""The example plan DAG on Airflow's CeleryExecutor: a fresh PostgreSQL metadata database, the local Redis
as broker, scheduler / dag-processor / api-server / triggerer and two ``airflow celery worker`` processes
with distinct hostnames, all driven through the REST API.

PostgreSQL (127.0.0.1:5432, trust auth for ``postgres``) and Redis (127.0.0.1:6379) must be running;
``.ci/run`` starts them. Outside CI the module is skipped when either is down.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_plan_provider.contract import NODES_TASK
from harness.cluster import AirflowCluster
from harness.logs import error_lines
from harness.postgres import PostgresDatabase
from harness.processes import pid_alive
from tests.e2e.conftest import CELERY_WORKERS, EXAMPLE_FILES, celery_cluster, demo_env

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = "plan_and_execute"
GOAL = "find why the payment API got slow yesterday and write a report"


@pytest.fixture(scope="module")
def celery(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AirflowCluster, PostgresDatabase]]:
    base = tmp_path_factory.mktemp("celery")
    extra = {
        **demo_env(base),
        # The triggerer's supervisor builds its in-process execution API on the first request of a
        # trigger (the replan's wait), and reads nothing from its trigger runner meanwhile: on a starved
        # 2-core machine that took over 30 s, tripping the runner watchdog (an error-level line).
        "AIRFLOW__TRIGGERER__RUNNER_HEALTH_CHECK_THRESHOLD": "120",
    }
    # Two slots per worker: the four independent queries of the first layer cannot all fit on one.
    with celery_cluster(
        base,
        EXAMPLE_FILES,
        [EXAMPLE],
        env=extra,
        worker_concurrency=2,
    ) as (running, db):
        yield running, db


def test_seed_session_runs_on_both_celery_workers(celery: tuple[AirflowCluster, PostgresDatabase]) -> None:
    cluster, _db = celery
    t0 = time.monotonic()
    root = cluster.trigger(EXAMPLE, {"goal": GOAL})
    state = cluster.wait_for_run(EXAMPLE, root, timeout=300)
    print(f"\n[e2e] {EXAMPLE} {root}: {state} in {time.monotonic() - t0:.1f}s")
    assert state == "success", cluster.diagnostics()
    child = f"{root}__replan_1"
    runs = sorted(r["dag_run_id"] for r in cluster.list_runs(EXAMPLE))
    assert runs == [root, child]

    result = cluster.session_result(EXAMPLE, root)
    assert result is not None
    assert (result.status, result.reason) == ("completed", "goal_met")
    assert result.run_ids == [root, child]
    assert result.revisions[0].diff.model_dump() == {"removed": [], "added": [], "revised": ["5"]}

    # Every task instance that ran went through this cluster's Celery queue to one of its workers, and
    # Airflow recorded the worker's own name as its hostname.
    tis = [(run_id, ti) for run_id in (root, child) for ti in cluster.task_instances(EXAMPLE, run_id)]
    ran = [(run_id, ti) for run_id, ti in tis if ti["hostname"]]
    assert {ti["state"] for _, ti in ran} == {"success", "skipped"}  # nodes 5 and 6 of the first plan
    assert {ti["queue"] for _, ti in ran} == {cluster.queue}
    assert {ti["hostname"] for _, ti in ran} <= set(CELERY_WORKERS)

    node_hosts = {
        (run_id, ti["rendered_map_index"].split(" · ")[0]): ti["hostname"]
        for run_id, ti in ran
        if ti["task_id"].startswith(NODES_TASK) and ti["map_index"] >= 0 and ti["state"] == "success"
    }
    print(f"[e2e] node hosts: {sorted(node_hosts.items())}")
    assert len(node_hosts) == 4 + 6  # the root run's queries, then the whole revised plan
    assert set(node_hosts.values()) == set(CELERY_WORKERS), node_hosts

    # A node's record names the worker that ran it, where records carry a hostname.
    for record in result.history:
        key = (result.run_ids[record.revision], record.node_id)
        if record.hostname and key in node_hosts and not record.reused:
            assert record.hostname == node_hosts[key], record

    # Each worker imported the provider's task modules once, before forking its pool (Celery's
    # ``imports`` as docker-compose.yml sets them), so its task processes started with them
    # (airflow_plan_provider/preload.py).
    for worker in CELERY_WORKERS:
        log = (cluster.log_dir / f"{worker}.log").read_text()
        assert "for the task processes this Celery worker starts" in log, worker

    # Nothing logged at error level in a normal session: no task log, no component log (workers included).
    assert error_lines(cluster.log_dir) == []


def test_stop_ends_every_process_and_the_database_is_dropped(
    celery: tuple[AirflowCluster, PostgresDatabase],
) -> None:
    """Runs last: stops the module's cluster."""
    cluster, db = celery
    pids = cluster.all_pids()
    roots = cluster.pids
    assert set(roots) == {"api-server", "dag-processor", "scheduler", "triggerer", *CELERY_WORKERS}
    worker_children = {p for p in pids if p not in roots.values()}
    assert worker_children  # Celery's pool processes, the API server's workers, ...
    cluster.stop()
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not {p for p in pids if pid_alive(p)}
    db.drop()
    import psycopg2

    conn = psycopg2.connect(db.server)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_database WHERE datname = %s", (db.name,))
            assert cur.fetchone() == (0,)
    finally:
        conn.close()
