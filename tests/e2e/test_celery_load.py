"""Load on the CeleryExecutor, with a tool limited by an Airflow pool.

One cluster for the module: a fresh PostgreSQL metadata database, the local Redis as broker,
scheduler / dag-processor / api-server / triggerer and two ``airflow celery worker`` processes. Ten plan
sessions of 20 nodes run at once; 60 of the nodes call ``limited_api``, whose tool declares the pool
``rate_limited_api`` (3 slots, created through the REST API). The tool counts its calls in progress in
Redis, across every worker process: the count never exceeds 3, and reaches it. Every node's output is
in its session's result afterwards, and every node left its checkpoint in the shared artifact store
(``PLAN_ARTIFACT_STORE``).

PostgreSQL (127.0.0.1:5432) and Redis (127.0.0.1:6379) must be running; ``.ci/run`` starts them.
Outside CI the module is skipped when either is down.
"""

from __future__ import annotations

import importlib.util
import secrets
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_plan_provider.contract import NODES_TASK, lane_task_id
from harness.cluster import AirflowCluster
from tests.e2e.conftest import CELERY_WORKERS, celery_cluster, require_postgres_and_redis

# slow tier: the only test of a pool holding across worker processes under load (ten sessions, 112 s)
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DAG_FILE = Path(__file__).parent / "dags" / "pool_dags.py"
GAUGE = "redis://127.0.0.1:6379/6"
SESSIONS = 10
POOL_SLOTS = 3


def _dags_module() -> Any:
    """tests/e2e/dags/pool_dags.py, for its plan and expected outputs (it is not a package)."""
    spec = importlib.util.spec_from_file_location("pool_dags_for_test", DAG_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


dags = _dags_module()


class Cluster:
    def __init__(self, cluster: AirflowCluster, gauge: Any, keys: dict[str, str], store: Path) -> None:
        self.cluster = cluster
        self.gauge = gauge
        self.keys = keys
        self.store = store


@pytest.fixture(scope="module")
def celery(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    require_postgres_and_redis()
    import redis

    base = tmp_path_factory.mktemp("celery-load")
    store = base / "artifacts"
    prefix = f"plan-e2e-gauge-{secrets.token_hex(4)}"
    keys = dags.gauge_keys(prefix)
    gauge = redis.Redis.from_url(GAUGE, socket_timeout=10)
    env = {
        dags.GAUGE_URL_ENV: GAUGE,
        dags.GAUGE_PREFIX_ENV: prefix,
        "PLAN_ARTIFACT_STORE": f"file://{store}",
    }
    try:
        with celery_cluster(
            base,
            [DAG_FILE],
            ("e2e_pool_load", "e2e_pool_cross_lanes"),
            env=env,
            worker_concurrency=8,
            parallelism=32,
        ) as (running, _db):
            running.api(
                "POST",
                "/pools",
                {"name": dags.POOL, "slots": POOL_SLOTS, "description": "e2e", "include_deferred": False},
            )
            yield Cluster(running, gauge, keys, store)
    finally:
        gauge.delete(*keys.values())
        gauge.close()


def test_ten_sessions_of_twenty_nodes_with_a_pool_of_three(celery: Cluster) -> None:
    cluster = celery.cluster
    t0 = time.monotonic()
    runs = {s: cluster.trigger("e2e_pool_load", {"goal": f"load session {s}"}) for s in range(SESSIONS)}
    states = {s: cluster.wait_for_run("e2e_pool_load", run_id, timeout=600) for s, run_id in runs.items()}
    elapsed = time.monotonic() - t0
    peak = int(celery.gauge.get(celery.keys["max"]) or 0)
    calls = int(celery.gauge.get(celery.keys["calls"]) or 0)
    print(f"\n[e2e] {SESSIONS} sessions in {elapsed:.1f}s; limited_api: {calls} calls, max {peak} at once")
    assert set(states.values()) == {"success"}, (states, cluster.diagnostics())

    # the pool held: never more than 3 calls at once across both workers, and 3 were reached
    assert peak == POOL_SLOTS
    assert int(celery.gauge.get(celery.keys["current"]) or 0) == 0
    assert calls == SESSIONS * dags.API_NODES  # each call once: no retry, no duplicate

    api_hosts: set[str] = set()
    for session, run_id in runs.items():
        # nothing lost: every node's output is in the session's result, as the tools computed it
        result = cluster.session_result("e2e_pool_load", run_id)
        assert result is not None, run_id
        assert (result.status, result.reason) == ("completed", "goal_met"), result.message
        assert result.outputs == dags.expected_outputs(session)
        records = {r.node_id: r for r in result.history}
        assert len(records) == 20 and {r.status for r in records.values()} == {"success"}
        assert {r.hostname for r in records.values()} <= set(CELERY_WORKERS)

        tis = [ti for ti in cluster.task_instances("e2e_pool_load", run_id) if ti["map_index"] >= 0]
        by_node = {ti["rendered_map_index"].split(" · ")[0]: ti for ti in tis}
        assert sorted(by_node) == sorted(records)
        for node, ti in by_node.items():
            pooled = node.startswith("api")
            assert ti["pool"] == (dags.POOL if pooled else "default_pool"), (node, ti["task_id"], ti["pool"])
            assert ti["task_id"] == (lane_task_id("rate_limited_api") if pooled else NODES_TASK)
            assert ti["hostname"] == records[node].hostname
            if pooled:
                api_hosts.add(ti["hostname"])
    # the limit held across processes on both workers, not within one
    assert api_hosts == set(CELERY_WORKERS)
    # every node saved its checkpoint in the store every worker was given
    assert len(list((celery.store / "checkpoints").glob("*.json"))) == SESSIONS * 20


def test_a_plan_waits_across_lanes(celery: Cluster) -> None:
    cluster = celery.cluster
    t0 = time.monotonic()
    run_id = cluster.trigger("e2e_pool_cross_lanes", {"goal": "cross lanes"})
    state = cluster.wait_for_run("e2e_pool_cross_lanes", run_id, timeout=300)
    print(f"\n[e2e] plan with pooled nodes across lanes: {state} in {time.monotonic() - t0:.1f}s")
    assert state == "success", cluster.diagnostics()
    result = cluster.session_result("e2e_pool_cross_lanes", run_id)
    assert result is not None
    assert result.outputs == {
        "api0": {"session": 7, "n": 0, "value": 700},
        "local0": {"session": 7, "n": 0, "value": 7000},
        "api1": {"session": 7, "n": 7000, "value": 7700},
        "local1": {"session": 7, "n": 1, "value": 7001},
        "sum0": 14701,
    }
    tis = {
        ti["rendered_map_index"].split(" · ")[0]: (ti["task_id"], ti["map_index"], ti["pool"])
        for ti in cluster.task_instances("e2e_pool_cross_lanes", run_id)
        if ti["map_index"] >= 0
    }
    assert tis == {
        "api0": (lane_task_id("rate_limited_api"), 0, dags.POOL),
        "api1": (lane_task_id("rate_limited_api"), 1, dags.POOL),
        "local0": (NODES_TASK, 1, "default_pool"),
        "local1": (NODES_TASK, 0, "default_pool"),
        "sum0": (NODES_TASK, 2, "default_pool"),
    }
