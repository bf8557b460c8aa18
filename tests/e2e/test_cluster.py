"""End-to-end tests of ``AirflowCluster``: a real scheduler/dag-processor/api-server/triggerer deployment.

One cluster is shared by the whole module (start-up dominates the cost). The tests run in file order;
``test_stop_terminates_every_process`` stops the shared cluster and must stay last.
"""

from __future__ import annotations

import os
import textwrap
import time
from collections.abc import Iterator

import pytest

from airflow_plan_provider.testing.cluster import AirflowCluster, ClusterError, pid_alive

pytestmark = pytest.mark.e2e

DAG_ID = "e2e_cluster_smoke"

DAG_SOURCE = textwrap.dedent(
    f"""
    from airflow.sdk import dag, task


    @dag(dag_id="{DAG_ID}", schedule=None, catchup=False)
    def e2e_cluster_smoke():
        @task
        def produce(**context):
            return {{"answer": 42, "items": [1, 2, 3], "conf": context["dag_run"].conf}}

        @task
        def square(x):
            print(f"squaring {{x}}")
            return x * x

        produce()
        square.expand(x=[1, 2, 3])


    e2e_cluster_smoke()
    """
)


def _wait_dead(pids: set[int], timeout: float = 10.0) -> set[int]:
    deadline = time.monotonic() + timeout
    alive = {p for p in pids if pid_alive(p)}
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = {p for p in alive if pid_alive(p)}
    return alive


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowCluster]:
    dags = tmp_path_factory.mktemp("e2e_dags")
    (dags / f"{DAG_ID}.py").write_text(DAG_SOURCE)
    t0 = time.monotonic()
    with AirflowCluster(dags, parallelism=4) as c:
        print(f"\n[e2e] cluster start-up: {time.monotonic() - t0:.1f}s (home={c.home})")
        c.wait_for_dag(DAG_ID, timeout=60)
        c.unpause(DAG_ID)
        yield c


def _run_once(cluster: AirflowCluster, conf: dict) -> str:
    t0 = time.monotonic()
    run_id = cluster.trigger(DAG_ID, conf)
    state = cluster.wait_for_run(DAG_ID, run_id, timeout=120)
    print(f"\n[e2e] one run: {time.monotonic() - t0:.1f}s -> {state}")
    assert state == "success", cluster.diagnostics()
    return run_id


def test_run_mapped_tasks_and_xcom(cluster: AirflowCluster) -> None:
    run_id = _run_once(cluster, {"who": "e2e"})

    tis = cluster.task_instances(DAG_ID, run_id)
    by_task: dict[str, list[dict]] = {}
    for ti in tis:
        by_task.setdefault(ti["task_id"], []).append(ti)

    assert [(ti["map_index"], ti["state"]) for ti in by_task["produce"]] == [(-1, "success")]
    mapped = sorted(by_task["square"], key=lambda ti: ti["map_index"])
    assert [ti["map_index"] for ti in mapped] == [0, 1, 2]
    assert {ti["state"] for ti in mapped} == {"success"}

    assert cluster.xcom(DAG_ID, run_id, "produce") == {
        "answer": 42,
        "items": [1, 2, 3],
        "conf": {"who": "e2e"},
    }
    assert [cluster.xcom(DAG_ID, run_id, "square", map_index=i) for i in range(3)] == [1, 4, 9]

    log = cluster.task_log(DAG_ID, run_id, "square", try_number=1, map_index=2)
    assert "squaring 3" in log

    assert run_id in {r["dag_run_id"] for r in cluster.list_runs(DAG_ID)}


def test_failed_wait_reports_component_logs(cluster: AirflowCluster) -> None:
    with pytest.raises(ClusterError) as exc:
        cluster.wait_for_dag("no_such_dag", timeout=1)
    message = str(exc.value)
    for component in ("scheduler", "dag-processor", "api-server", "triggerer"):
        assert f"----- {component} pid=" in message


def test_kill_and_restart_scheduler(cluster: AirflowCluster) -> None:
    old = cluster.pids["scheduler"]
    family = cluster.all_pids()
    cluster.kill("scheduler")
    assert not cluster.is_running("scheduler")
    assert not pid_alive(old)
    # The other components are untouched.
    assert all(cluster.is_running(c) for c in ("api-server", "dag-processor", "triggerer"))
    assert cluster.pids.keys() == {"api-server", "dag-processor", "triggerer"}
    assert family - cluster.all_pids()  # the scheduler's workers went with it

    cluster.restart("scheduler")
    assert cluster.pids["scheduler"] != old
    _run_once(cluster, {"after": "restart"})


def test_stop_terminates_every_process(cluster: AirflowCluster) -> None:
    """Must run last: stops the shared cluster (the fixture's own stop is then a no-op)."""
    _run_once(cluster, {})  # make sure LocalExecutor workers / task supervisors exist
    family = cluster.all_pids()
    started = set(cluster.started_pids)
    assert set(cluster.pids.values()) <= family
    assert len(family) > len(cluster.pids)  # workers & children beyond the 4 roots

    home = cluster.home
    cluster.stop()

    assert not _wait_dead(started, timeout=0.5), "a component root survived stop()"
    assert not _wait_dead(family, timeout=5), "a cluster process survived stop()"
    for pid in started:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not home.exists()
    cluster.stop()  # idempotent
