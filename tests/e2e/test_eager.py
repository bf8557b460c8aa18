"""Eager mode on a real scheduler: nodes start when their own parents finish; failures stay contained."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_plan_provider.testing import CallLog
from airflow_plan_provider.testing.cluster import AirflowCluster
from tests.e2e.conftest import demo_env, plan_cluster

pytestmark = pytest.mark.e2e

DAG_FILE = Path(__file__).parent / "dags" / "eager_dags.py"
DAGS = ("e2e_eager_unbalanced", "e2e_eager_seed_failure")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AirflowCluster, Path]]:
    base = tmp_path_factory.mktemp("eager")
    with plan_cluster(base, [DAG_FILE], DAGS, env=demo_env(base)) as running:
        yield running, base / "calls"


def times(log: CallLog, node: str) -> dict[str, float]:
    entries = [e for e in log._read(log.path) if e["node"] == node]
    return {e["event"]: e["t"] for e in entries}


def test_a_node_starts_when_its_own_parents_finish(cluster: tuple[AirflowCluster, Path]) -> None:
    airflow, calls = cluster
    run_id = airflow.trigger("e2e_eager_unbalanced", {"goal": "unbalanced"})
    assert airflow.wait_for_run("e2e_eager_unbalanced", run_id, timeout=300) == "success"
    log = CallLog(calls / "e2e_eager_unbalanced")
    a, c, d = times(log, "a"), times(log, "c"), times(log, "d")
    # c (layer 1) did not wait for a (layer 0, 20 s): no barrier; the margin covers a deferred resume
    assert c["start"] < a["end"]
    assert d["start"] >= a["end"] and d["start"] >= c["end"]  # d waited for both of its parents
    assert {n: log.count(node=n) for n in "abcd"} == dict.fromkeys("abcd", 1)
    result = airflow.session_result("e2e_eager_unbalanced", run_id)
    assert result is not None and result.status == "completed"
    assert result.outputs == {"a": "slow", "b": "q", "c": "q", "d": "q"}


def test_failures_stay_contained_in_eager_mode(cluster: tuple[AirflowCluster, Path]) -> None:
    airflow, calls = cluster
    run_id = airflow.trigger("e2e_eager_seed_failure", {"goal": "seed"})
    assert airflow.wait_for_run("e2e_eager_seed_failure", run_id, timeout=300) == "failed"
    assert airflow.node_states("e2e_eager_seed_failure", run_id) == {
        "1": "success",
        "2": "success",
        "3": "failed",
        "4": "success",
        "5": "skipped",
        "6": "skipped",
    }
    task_ids = {ti["task_id"] for ti in airflow.task_instances("e2e_eager_seed_failure", run_id)}
    assert not any(t.startswith("layer_") for t in task_ids)  # no layer tasks in eager mode
    result = airflow.session_result("e2e_eager_seed_failure", run_id)
    assert result is not None and (result.status, result.reason) == ("failed", "node_failed")
    log = CallLog(calls / "e2e_eager_seed_failure")
    assert log.count("analyze") == 0 and log.count("query_deploys") == 1
