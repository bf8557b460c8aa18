"""Lost Celery workers: SIGKILLed while ``plan``, a node, or ``finalize`` runs, each session completes.

One CeleryExecutor cluster (a fresh PostgreSQL database, the local Redis as broker, two named workers)
with a 20 s task heartbeat timeout. Three sessions of ``e2e_lost_worker`` (tests/e2e/dags/
lost_worker_dags.py) start together; each parks the first try of one task (its planner call, node
``a``'s tool call, finalize) until the test has SIGKILLed the worker running it — the worker's whole
process family, found by the hostname Airflow recorded for the task instance — and started it again.
Airflow notices each lost task by its missing heartbeat and retries it; the sessions must complete
with every side effect performed once (one per idempotency key).

PostgreSQL (127.0.0.1:5432) and Redis (127.0.0.1:6379) must be running; ``.ci/run`` starts them.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_plan_provider.contract import FINALIZE_TASK, NODES_TASK, PLAN_TASK
from airflow_plan_provider.testing.scripted import CallLog
from harness.cluster import AirflowCluster
from harness.logs import error_lines
from tests.e2e.conftest import CELERY_WORKERS, celery_cluster, demo_env, wait_for

# slow tier: the only test of lost Celery workers (a Celery cluster of its own and 20 s heartbeat timeouts)
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DAG_FILE = Path(__file__).resolve().parent / "dags" / "lost_worker_dags.py"
DAG_ID = "e2e_lost_worker"  # as in dags/lost_worker_dags.py
HEARTBEAT_TIMEOUT = 20
# A task whose worker died stops heartbeating; the scheduler fails (and so retries) it once its last
# heartbeat is older than the timeout, checking every detection interval (defaults 300 s and 10 s).
LOST_TASK_SETTINGS = {
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT),
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "2",
}
# the task each session's conf holds, and where that task runs
TARGETS = {"plan": (PLAN_TASK, -1), "node": (NODES_TASK, 0), "finalize": (FINALIZE_TASK, -1)}


@pytest.fixture(scope="module")
def celery(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AirflowCluster, CallLog]]:
    base = tmp_path_factory.mktemp("lost-worker")
    env = {**demo_env(base), **LOST_TASK_SETTINGS}
    with celery_cluster(base, [DAG_FILE], [DAG_ID], env=env, worker_concurrency=2) as (running, _db):
        yield running, CallLog(base / "calls" / DAG_ID)


def task_instance(cluster: AirflowCluster, run_id: str, task_id: str, map_index: int) -> dict[str, Any]:
    [ti] = [
        t
        for t in cluster.task_instances(DAG_ID, run_id)
        if t["task_id"] == task_id and t["map_index"] == map_index
    ]
    return ti


def timestamp(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def test_sessions_complete_after_their_worker_is_killed_in_plan_node_and_finalize(
    celery: tuple[AirflowCluster, CallLog],
) -> None:
    cluster, log = celery
    runs = {
        hold: cluster.trigger(DAG_ID, {"goal": f"survive a lost worker in {hold}", "hold": hold, "tag": hold})
        for hold in TARGETS
    }
    # every held task is running its first try, parked on the marker it wrote
    wait_for(
        lambda: all((log.folder / f"held-{hold}").exists() for hold in TARGETS),
        180,
        "the three held tasks did not start",
        cluster,
    )
    hosts = {hold: task_instance(cluster, runs[hold], *TARGETS[hold]) for hold in TARGETS}
    assert {hold: (ti["state"], ti["try_number"]) for hold, ti in hosts.items()} == dict.fromkeys(
        TARGETS, ("running", 1)
    )
    victims = sorted({ti["hostname"] for ti in hosts.values()})
    assert set(victims) <= set(CELERY_WORKERS), victims
    print(f"\n[e2e] held tasks run on {[(h, ti['hostname']) for h, ti in hosts.items()]}")
    killed_at = time.time()
    for worker in victims:
        cluster.kill(worker)  # SIGKILL of the worker, its pool processes and the tasks they run
    for worker in victims:
        cluster.restart(worker)

    for hold, run_id in runs.items():
        state = cluster.wait_for_run(DAG_ID, run_id, timeout=240)
        assert state == "success", (hold, cluster.diagnostics())
        result = cluster.session_result(DAG_ID, run_id)
        assert result is not None and (result.status, result.reason) == ("completed", "goal_met"), hold
        assert result.outputs["b"] == {"node": "b", "performed": True}, hold

        task_id, map_index = TARGETS[hold]
        ti = task_instance(cluster, run_id, task_id, map_index)
        assert ti["try_number"] == 2 and ti["state"] == "success", (hold, ti)
        assert ti["hostname"] in CELERY_WORKERS
        run = cluster.get_run(DAG_ID, run_id)
        print(
            f"[e2e] {hold}: killed on {hosts[hold]['hostname']}; try 2 started "
            f"{timestamp(ti['start_date']) - killed_at:.1f}s after the kill on {ti['hostname']}; session "
            f"completed {timestamp(run['end_date']) - killed_at:.1f}s after the kill"
        )

    # each lost task was noticed by its missing heartbeat (then retried as any failed try)
    lost = [line for line in error_lines(cluster.log_dir) if "task instance without a heartbeat" in line]
    for hold, run_id in runs.items():
        assert any(f"'Task Id': '{TARGETS[hold][0]}'" in x and run_id in x for x in lost), (hold, lost)

    # every side effect happened once: one per idempotency key, and each node of each session has one
    effects = log.side_effects()
    assert len({e["key"] for e in effects}) == len(effects), effects
    assert sorted((e["tag"], e["node"]) for e in effects) == sorted(
        (hold, n) for hold in TARGETS for n in "ab"
    )
    # the killed node was called again with the same key (no second effect); nothing else ran twice
    keys = {e["key"]: (e["tag"], e["node"]) for e in effects}
    calls = Counter(keys[c["key"]] for c in log.calls())
    assert calls == Counter({(hold, n): 1 for hold in TARGETS for n in "ab"} | {("node", "a"): 2})
    # planning killed mid-call asked its planner again; the other sessions asked once
    asked = [
        json.loads(line)["tag"] for line in (log.folder / "planner_calls.jsonl").read_text().splitlines()
    ]
    assert sorted(asked) == ["finalize", "node", "plan", "plan"]
