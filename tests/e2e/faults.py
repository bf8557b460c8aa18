"""What the fault tests share (test_faults_api_e2e.py: the API server and the triggerer;
test_faults_services_e2e.py: the metadata database and the broker): a deployment, the sessions that wait
through a fault, and the checks that a fault cost a delay only.

Each fault module runs on a deployment of its own: one CeleryExecutor cluster (two workers) on a
PostgreSQL server and a Redis server of its own (free ports, temporary folders: restarting them touches
nothing else on the machine), so the two modules run side by side. In a module the faults run one after
the other, each on a DAG of its own (tests/e2e/dags/fault_dags.py), so each counts its own calls; each
fault ends with every component and service up again, so the next starts from a whole deployment.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_plan_provider.contract import PLAN_TASK
from airflow_plan_provider.testing.scripted import CallLog
from harness.cluster import AirflowCluster
from harness.deploy import fault_settings
from harness.postgres import PostgresDatabase
from harness.servers import PostgresServer, RedisServer
from tests.e2e.conftest import CELERY_WORKERS, demo_env, plan_cluster, wait_for

DAG_FILE = Path(__file__).resolve().parent / "dags" / "fault_dags.py"
FAULTS = ("api_server", "api_server_long", "triggerer", "database", "broker")  # as in dags/fault_dags.py
RUN_TIMEOUT = 300.0
#: how long the slow node works and the jobs run (seconds): long enough for a fault to land while nodes
#: wait in their slots and on the triggerer
WORK_SECONDS = 30
#: how long the API server (killed and started again) and the broker stay away (the API server also takes
#: its start-up)
OUTAGE_SECONDS = 10
#: how long the API server stays away while a control task runs, and the metadata database mid-session
LONG_API_OUTAGE_SECONDS = 30
DATABASE_OUTAGE_SECONDS = 20
#: how long the planner and finalize pause in the control-task case (seconds): seen running by a poll
CONTROL_PAUSE_SECONDS = 6
#: how long the planner takes in the broker case (seconds)
PLANNING_SECONDS = 4
#: The deployment's settings these faults need, as docker-compose.yml sets them (docs/deploy.md, Faults).
DEPLOY_SETTINGS = fault_settings()


@dataclass
class Deployment:
    cluster: AirflowCluster
    postgres: PostgresServer
    redis: RedisServer
    calls: Path

    def log(self, dag_id: str) -> CallLog:
        return CallLog(self.calls / dag_id)


def deployment_fixture(*faults: str) -> Any:
    """A test module's ``deployment`` fixture: a deployment of its own serving the DAGs of ``faults``
    (names as in :data:`FAULTS`), for the module's tests."""

    @pytest.fixture(scope="module")
    def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
        base = tmp_path_factory.mktemp("faults")
        with (
            PostgresServer() as postgres,
            RedisServer() as redis,
            PostgresDatabase(postgres.url) as db,
            plan_cluster(
                base,
                [DAG_FILE],
                [f"e2e_fault_{fault}" for fault in faults],
                env={**demo_env(base), **DEPLOY_SETTINGS},
                database_url=db.url,
                broker_url=redis.url,
                celery_workers=CELERY_WORKERS,
                worker_concurrency=4,
            ) as cluster,
        ):
            yield Deployment(cluster, postgres, redis, base / "calls")

    return deployment


# --------------------------------------------------------------------------------------------- helpers


def timestamp(value: str | None) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() if value else 0.0


def node_states(cluster: AirflowCluster, dag_id: str, run_id: str) -> dict[str, str]:
    return cluster.node_states(dag_id, run_id)


def started(log: CallLog, node: str) -> bool:
    return bool(log.calls(node=node))


def first_finish_after(cluster: AirflowCluster, dag_id: str, run_ids: list[str], moment: float) -> float:
    """The end of the first task instance (of these runs) that finished after ``moment``."""
    ends = [
        timestamp(ti.get("end_date"))
        for run_id in run_ids
        for ti in cluster.task_instances(dag_id, run_id)
        if ti["state"] == "success" and timestamp(ti.get("end_date")) > moment
    ]
    return min(ends, default=float("nan"))


def check_once_each(log: CallLog) -> Counter[str]:
    """Every idempotency key was called once and its side effect done once; returns calls per key."""
    calls = Counter(c["key"] for c in log.calls())
    effects = Counter(e["key"] for e in log.side_effects())
    redone = {key: n for key, n in calls.items() if n > 1}
    duplicates = {key: n for key, n in effects.items() if n > 1}
    print(f"[e2e] {len(calls)} keys called, redone {redone or 0}, duplicate side effects {duplicates or 0}")
    assert redone == {}, redone
    assert duplicates == {}, duplicates
    assert set(effects) == set(calls)
    return calls


def report(fault: str, t_fault: float, t_back: float, t_first: float, t_done: float) -> None:
    print(
        f"[e2e] {fault}: out {t_back - t_fault:.1f}s; first task finished {t_first - t_fault:.1f}s and the "
        f"session completed {t_done - t_fault:.1f}s after the fault"
    )


def in_waits_position(deployment: Deployment, dag_id: str, run_id: str) -> dict[str, str] | None:
    """The ``waits`` plan where a fault should hit it: ``slow`` working, ``s1``/``s2`` waiting in their
    slots (running, no call yet), ``job`` and ``after_job`` deferred."""
    log = deployment.log(dag_id)
    states = node_states(deployment.cluster, dag_id, run_id)
    if not started(log, "slow") or started(log, "s1") or started(log, "s2"):
        return None
    wanted = {"slow": "running", "s1": "running", "s2": "running", "job": "deferred", "after_job": "deferred"}
    if all(states.get(node) == state for node, state in wanted.items()):
        return states
    return None


def planning(deployment: Deployment, dag_id: str, run_id: str) -> dict[str, str] | None:
    """The run's ``plan`` task running: its nodes are queued (sent to the broker) in a moment."""
    tis = deployment.cluster.task_instances(dag_id, run_id)
    states = {ti["task_id"]: ti["state"] for ti in tis if ti["map_index"] == -1}
    return states if states.get(PLAN_TASK) == "running" else None


def run_waits_through(
    deployment: Deployment,
    fault: str,
    outage: Callable[[], None],
    position: Callable[[Deployment, str, str], dict[str, str] | None] = in_waits_position,
    plan_seconds: float = 0,
) -> None:
    """Trigger the ``waits`` plan on fault's DAG, call ``outage`` (the fault and the service's return)
    once the run is in ``position`` (by default: nodes wait in their slots and on the triggerer), and
    check the session. The planner answers ``plan_seconds`` after it is asked."""
    cluster = deployment.cluster
    dag_id = f"e2e_fault_{fault}"
    log = deployment.log(dag_id)
    conf = {"goal": f"survive {fault}", "scenario": "waits", "seconds": WORK_SECONDS}
    run_id = cluster.trigger(dag_id, conf | {"plan_seconds": plan_seconds})
    states = wait_for(
        lambda: position(deployment, dag_id, run_id), 180, f"the run in {position.__name__}", cluster
    )
    print(f"\n[e2e] {fault}: fault while {states}")
    t_fault = time.time()
    outage()
    t_back = time.time()
    # a component that exits meanwhile is started again, as the deployment's restart policy does
    state = cluster.wait_for_run(dag_id, run_id, timeout=RUN_TIMEOUT, revive=True)
    print(f"[e2e] {fault}: components that exited and were started again: {cluster.revived}")
    cluster.revived.clear()
    assert state == "success", cluster.diagnostics()
    t_done = timestamp(cluster.get_run(dag_id, run_id)["end_date"])
    report(fault, t_fault, t_back, first_finish_after(cluster, dag_id, [run_id], t_back), t_done)
    result = cluster.session_result(dag_id, run_id)
    assert result is not None and (result.status, result.reason) == ("completed", "goal_met")
    nodes = ("slow", "s1", "s2", "job", "after_job", "end")
    assert node_states(cluster, dag_id, run_id) == dict.fromkeys(nodes, "success")
    tries = {
        ti["rendered_map_index"] or ti["task_id"]: ti["try_number"]
        for ti in cluster.task_instances(dag_id, run_id)
    }
    print(f"[e2e] {fault}: tries {tries}")
    assert all(n <= 1 for n in tries.values()), tries  # no task failed because a service was away
    calls = check_once_each(log)
    assert sorted(c["node"] for c in log.calls()) == sorted(nodes)
    assert len(calls) == len(nodes)
