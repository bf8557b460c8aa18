"""The API server and the triggerer away in the middle of a session: the API server killed and started
again while nodes wait in their slots and deferred, and away for 30 s while ``plan``, ``finalize`` and
``replan`` run; the triggerer killed while nodes and a replan wait deferred, started again 10 s later.
Each costs a delay only: the session completes, no node's tool is called twice for one idempotency key
(nothing redone, no node failed because a service was away), every side effect is done once, and the time
from the fault to the recovery is printed (tests/e2e/faults.py has the deployment and the checks).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from airflow_plan_provider.contract import FINALIZE_TASK, PLAN_TASK, REPLAN_TASK
from harness.logs import error_lines
from tests.e2e.conftest import wait_for
from tests.e2e.faults import (
    CONTROL_PAUSE_SECONDS,
    LONG_API_OUTAGE_SECONDS,
    OUTAGE_SECONDS,
    RUN_TIMEOUT,
    WORK_SECONDS,
    Deployment,
    check_once_each,
    deployment_fixture,
    first_finish_after,
    node_states,
    report,
    run_waits_through,
    timestamp,
)

# slow tier: a Celery cluster of its own, on servers of its own, and sessions that wait out faults; the
# slow tier's longest modules
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.early]


deployment = deployment_fixture("api_server", "api_server_long", "triggerer")


def test_api_server_killed_while_nodes_wait_in_their_slots_and_deferred(deployment: Deployment) -> None:
    cluster = deployment.cluster

    def outage() -> None:
        cluster.kill("api-server")
        time.sleep(OUTAGE_SECONDS)
        cluster.restart("api-server")  # returns once it answers

    run_waits_through(deployment, "api_server", outage)
    lines = [line for line in error_lines(cluster.log_dir) if "Too many failed heartbeats" in line]
    assert lines == []


def test_triggerer_killed_while_nodes_and_a_replan_wait_deferred(deployment: Deployment) -> None:
    cluster = deployment.cluster
    dag_id = "e2e_fault_triggerer"
    log = deployment.log(dag_id)
    root = cluster.trigger(
        dag_id, {"goal": "survive the triggerer", "scenario": "replan", "seconds": WORK_SECONDS}
    )

    def in_position() -> tuple[str, dict[str, str]] | None:
        runs = [r["dag_run_id"] for r in cluster.list_runs(dag_id) if r["dag_run_id"] != root]
        if len(runs) != 1:
            return None
        replan = [ti for ti in cluster.task_instances(dag_id, root) if ti["task_id"] == REPLAN_TASK]
        states = node_states(cluster, dag_id, runs[0])
        wanted = {"j1": "deferred", "j2": "deferred", "after_j1": "deferred"}
        if replan and replan[0]["state"] == "deferred" and all(states.get(n) == s for n, s in wanted.items()):
            return runs[0], states
        return None

    child, states = wait_for(in_position, 180, "the jobs, a node and the replan deferred", cluster)
    print(f"\n[e2e] triggerer: fault while the replan waits deferred and {states}")
    t_fault = time.time()
    cluster.kill("triggerer")
    time.sleep(10)
    cluster.restart("triggerer")
    t_back = time.time()
    assert cluster.wait_for_run(dag_id, root, timeout=RUN_TIMEOUT) == "success", cluster.diagnostics()
    assert cluster.get_run(dag_id, child)["state"] == "success"
    t_done = timestamp(cluster.get_run(dag_id, root)["end_date"])
    report("triggerer", t_fault, t_back, first_finish_after(cluster, dag_id, [root, child], t_back), t_done)
    result = cluster.session_result(dag_id, root)
    assert result is not None and (result.status, result.reason) == ("completed", "goal_met"), result
    assert node_states(cluster, dag_id, child) == dict.fromkeys(
        ("ask", "j1", "j2", "after_j1", "later"), "success"
    )
    calls = check_once_each(log)
    assert sorted(c["node"] for c in log.calls()) == ["after_j1", "ask", "j1", "j2", "later"]
    assert len(calls) == 5


def test_api_server_away_30s_while_plan_finalize_and_replan_run(deployment: Deployment) -> None:
    """Three outages in one replanning session: while ``plan`` asks the planner, while ``finalize``
    prepares the replan, and while ``replan`` waits deferred for the revision's run whose jobs and node
    wait deferred too."""
    cluster = deployment.cluster
    dag_id = "e2e_fault_api_server_long"
    log = deployment.log(dag_id)
    pause = CONTROL_PAUSE_SECONDS
    conf = {"goal": "survive the API server", "scenario": "replan", "seconds": WORK_SECONDS}
    root = cluster.trigger(dag_id, conf | {"plan_seconds": pause, "finalize_seconds": pause})

    def running(task_id: str) -> Callable[[], dict[str, str] | None]:
        def position() -> dict[str, str] | None:
            states = {ti["task_id"]: ti["state"] for ti in cluster.task_instances(dag_id, root)}
            return states if states.get(task_id) == "running" else None

        return position

    def replan_waits() -> dict[str, str] | None:
        runs = [r["dag_run_id"] for r in cluster.list_runs(dag_id) if r["dag_run_id"] != root]
        replan = [ti for ti in cluster.task_instances(dag_id, root) if ti["task_id"] == REPLAN_TASK]
        if len(runs) != 1 or not replan or replan[0]["state"] != "deferred":
            return None
        states = node_states(cluster, dag_id, runs[0])
        return states if states.get("j1") == states.get("j2") == "deferred" else None

    positions = {"plan": running(PLAN_TASK), "finalize": running(FINALIZE_TASK), "replan": replan_waits}
    outages: list[tuple[str, float, float]] = []
    for task, position in positions.items():
        states = wait_for(position, 180, f"{task} running", cluster)
        print(f"\n[e2e] api_server_long: away {LONG_API_OUTAGE_SECONDS}s while {task} runs: {states}")
        t_fault = time.time()
        cluster.kill("api-server")
        time.sleep(LONG_API_OUTAGE_SECONDS)
        cluster.restart("api-server")
        outages.append((task, t_fault, time.time()))
    assert cluster.wait_for_run(dag_id, root, timeout=RUN_TIMEOUT) == "success", cluster.diagnostics()
    child = next(r["dag_run_id"] for r in cluster.list_runs(dag_id) if r["dag_run_id"] != root)
    assert cluster.get_run(dag_id, child)["state"] == "success"
    t_done = timestamp(cluster.get_run(dag_id, root)["end_date"])
    for task, t_fault, t_back in outages:
        t_first = first_finish_after(cluster, dag_id, [root, child], t_back)
        report(f"api_server_long ({task})", t_fault, t_back, t_first, t_done)
    result = cluster.session_result(dag_id, root)
    assert result is not None and (result.status, result.reason) == ("completed", "goal_met"), result
    tries = {
        f"{run}:{ti['rendered_map_index'] or ti['task_id']}": ti["try_number"]
        for run, run_id in (("root", root), ("revision", child))
        for ti in cluster.task_instances(dag_id, run_id)
    }
    print(f"[e2e] api_server_long: tries {tries}")
    assert all(n <= 1 for n in tries.values()), tries  # no task failed because the API server was away
    calls = check_once_each(log)
    assert sorted(c["node"] for c in log.calls()) == ["after_j1", "ask", "j1", "j2", "later"]
    assert len(calls) == 5
    lines = [line for line in error_lines(cluster.log_dir) if "Too many failed heartbeats" in line]
    assert lines == []
