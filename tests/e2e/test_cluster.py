"""End-to-end tests of ``AirflowCluster``: a real scheduler/dag-processor/api-server/triggerer deployment.

One cluster is shared by the whole module (start-up dominates the cost). The tests run in file order;
``test_stop_terminates_every_process`` stops the shared cluster and must stay the last test using it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import pytest

from harness.cluster import (
    COMPONENTS,
    AirflowCluster,
    ClusterError,
    ClusterTimeout,
    ComponentCrashed,
    python_path,
)
from harness.processes import pid_alive
from tests.e2e.conftest import plan_cluster

# slow tier: the launcher's own behaviour (crash diagnostics, stop, orphans reaped after its starter dies);
# every other e2e module exercises its ordinary path
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

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
    base = tmp_path_factory.mktemp("e2e_cluster")
    source = base / f"{DAG_ID}.py"
    source.write_text(DAG_SOURCE)
    with plan_cluster(base, [source], [DAG_ID], parallelism=4) as c:
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
    with pytest.raises(ClusterTimeout) as exc:
        cluster.wait_for_dag("no_such_dag", timeout=1)
    message = str(exc.value)
    assert exc.value.reason.startswith("DAG 'no_such_dag' not parsed within 1s")
    for component in ("scheduler", "dag-processor", "api-server", "triggerer"):
        assert f"----- {component} pid=" in message
        assert f"----- {component} pid=" in exc.value.diagnostics


def test_a_component_that_died_is_a_crash_not_a_timeout(cluster: AirflowCluster) -> None:
    run_id = cluster.trigger(DAG_ID, {})
    os.kill(cluster.pids["triggerer"], signal.SIGKILL)  # from outside, as the OOM killer would
    with pytest.raises(ComponentCrashed) as exc:
        cluster.wait_for_run(DAG_ID, run_id, timeout=120)
    assert exc.value.exit_codes == {"triggerer": -signal.SIGKILL}
    assert isinstance(exc.value, ClusterError) and "----- triggerer pid=" in exc.value.diagnostics
    cluster.restart("triggerer")
    assert cluster.wait_for_run(DAG_ID, run_id, timeout=120) == "success"


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


STARTER = textwrap.dedent(
    """
    import json, sys, time
    from harness.cluster import AirflowCluster

    cluster = AirflowCluster(sys.argv[1], parallelism=2).start()
    cluster.wait_for_dag(sys.argv[2], timeout=180)
    cluster.unpause(sys.argv[2])
    run_id = cluster.trigger(sys.argv[2], {})
    cluster.wait_for_run(sys.argv[2], run_id, timeout=180)  # LocalExecutor workers exist by now
    print(json.dumps({"pids": sorted(cluster.all_pids()), "home": str(cluster.home)}), flush=True)
    time.sleep(600)
    """
)


def test_components_die_with_the_process_that_started_them(tmp_path) -> None:
    """A test process killed with SIGKILL runs no ``finally``: the watchdog stops what it started."""
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / f"{DAG_ID}.py").write_text(DAG_SOURCE)
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER, str(dags), DAG_ID],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=os.environ | {"PYTHONPATH": python_path(os.environ.get("PYTHONPATH"))},  # harness.cluster
    )
    started: dict = {}
    try:
        line = starter.stdout.readline() if starter.stdout else ""
        assert line, f"the starter exited {starter.wait()} before its cluster was up"
        started = json.loads(line)
        assert len(started["pids"]) > len(COMPONENTS) and all(pid_alive(p) for p in started["pids"])
        starter.kill()
        starter.wait()
        assert not _wait_dead(set(started["pids"]), timeout=60), "a component survived its starter"
        deadline = time.monotonic() + 30
        while os.path.exists(started["home"]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not os.path.exists(started["home"])  # its temporary home went with it
    finally:
        starter.kill()
        for pid in started.get("pids", []):  # on failure, leave nothing behind
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
