"""Plan DAGs on a real Airflow (scheduler, dag-processor, api-server, triggerer as processes), driven
through the REST API: the example DAG's replan chain, failure containment, a scripted replan, the
per-run and pool concurrency caps, and Airflow retries of a transient tool error.

The module runs on the test session's shared cluster (``example_cluster``). Tool calls are counted by
``ScriptedTool`` in a ``CallLog`` folder per DAG that every worker process writes to
(``$PLAN_E2E_CALL_LOG/<dag_id>``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_plan_provider.contract import (
    FINALIZE_TASK,
    NODE_KEY,
    NODES_TASK,
    PLAN_KEY,
    PLAN_TASK,
    REPLAN_TASK,
)
from airflow_plan_provider.plan.calls import idempotency_key
from airflow_plan_provider.plan.model import ValidatedPlan
from airflow_plan_provider.testing.scripted import CallLog
from harness.cluster import AirflowCluster
from harness.seed import seed_plan
from tests.e2e.conftest import SharedCluster, serve

pytestmark = pytest.mark.e2e

EXAMPLE = "plan_and_execute"
GOAL = "find why the payment API got slow yesterday and write a report"
POOL = "plan_e2e_pool"  # as in dags/scripted_plan_dags.py
DAG_IDS = (
    EXAMPLE,
    "e2e_seed_failure",
    "e2e_seed_replan",
    "e2e_cap_two",
    "e2e_pool_three",
    "e2e_transient",
    "e2e_team_triage",
    "e2e_preloaded",
)
RUN_TIMEOUT = 180.0


@dataclass
class Env:
    cluster: AirflowCluster
    calls: Path
    reports: Path

    def log(self, dag_id: str) -> CallLog:
        return CallLog(self.calls / dag_id)


@pytest.fixture(scope="module")
def env(example_cluster: SharedCluster) -> Iterator[Env]:
    cluster = example_cluster.cluster
    serve(cluster, DAG_IDS)
    cluster.api("POST", "/pools", {"name": POOL, "slots": 3, "include_deferred": False})
    yield Env(cluster, example_cluster.calls, example_cluster.reports)


# --------------------------------------------------------------------------------------------- helpers


def run_to_end(cluster: AirflowCluster, dag_id: str, conf: dict[str, Any]) -> tuple[str, str]:
    t0 = time.monotonic()
    run_id = cluster.trigger(dag_id, conf)
    state = cluster.wait_for_run(dag_id, run_id, timeout=RUN_TIMEOUT)
    print(f"\n[e2e] {dag_id} {run_id}: {state} in {time.monotonic() - t0:.1f}s")
    return run_id, state


def states_by_node(cluster: AirflowCluster, dag_id: str, run_id: str) -> dict[str, str]:
    """Plan node id → task state, from the published plan (the i-th node in run order is ``nodes[i]``)."""
    plan = cluster.xcom(dag_id, run_id, PLAN_TASK, key=PLAN_KEY)
    tis = {(ti["task_id"], ti["map_index"]): ti for ti in cluster.task_instances(dag_id, run_id)}
    states = {}
    for i, node_id in enumerate(ValidatedPlan.model_validate(plan).run_order):
        ti = tis[(NODES_TASK, i)]
        label = ti.get("rendered_map_index")
        if label:  # the grid label names the same node
            assert label.split(" · ")[0] == node_id, (label, node_id)
        states[node_id] = ti["state"]
    return states


def task_instance(
    cluster: AirflowCluster, dag_id: str, run_id: str, task_id: str, map_index: int = -1
) -> dict[str, Any]:
    [ti] = [
        t
        for t in cluster.task_instances(dag_id, run_id)
        if t["task_id"] == task_id and t["map_index"] == map_index
    ]
    return ti


def run_ids(cluster: AirflowCluster, dag_id: str) -> list[str]:
    """Every run of the DAG (a session's root run and its replan runs sort together)."""
    return sorted(r["dag_run_id"] for r in cluster.list_runs(dag_id))


# ----------------------------------------------------------------------------------------------- tests


def test_example_dag_replans_node_5_and_reuses_the_queries(env: Env) -> None:
    cluster = env.cluster
    root, state = run_to_end(cluster, EXAMPLE, {"goal": GOAL})
    child = f"{root}__replan_1"
    assert state == "success", cluster.diagnostics()
    assert run_ids(cluster, EXAMPLE) == [root, child]
    assert cluster.get_run(EXAMPLE, child)["state"] == "success"

    first = states_by_node(cluster, EXAMPLE, root)
    assert first == {"1": "success", "2": "success", "3": "success", "4": "success"} | {
        "5": "skipped",
        "6": "skipped",
    }
    assert cluster.node_states(EXAMPLE, root) == first  # the grid labels say the same
    assert states_by_node(cluster, EXAMPLE, child) == dict.fromkeys("123456", "success")

    session = cluster.get_run(EXAMPLE, child)["conf"]["session"]
    assert session["root_run_id"] == root and session["parent_run_id"] == root
    assert session["revision"] == 1
    assert set(session) == {"root_run_id", "parent_run_id", "revision"}  # named: its state stays in XCom

    result = cluster.session_result(EXAMPLE, root)
    assert result is not None
    assert (result.status, result.reason) == ("completed", "goal_met")
    assert result.run_ids == [root, child]
    assert result.revisions[0].diff.model_dump() == {"removed": [], "added": [], "revised": ["5"]}
    assert "no deploys of payment-api" in result.revisions[0].reason
    reused = sorted(r.node_id for r in result.history if r.revision == 1 and r.reused)
    assert reused == ["1", "2", "3", "4"]
    executed = sorted(r.node_id for r in result.history if r.revision == 1 and not r.reused)
    assert executed == ["5", "6"]

    report = Path(result.outputs["6"]["path"])
    assert report.is_file() and report.parent == env.reports
    assert "fraud-check" in report.read_text()


def test_permanent_failure_is_contained_and_fails_the_run(env: Env) -> None:
    cluster, dag_id = env.cluster, "e2e_seed_failure"
    from_conf = {
        "goal": "find why the payment API got slow yesterday",
        "plan": seed_plan(),
        "max_replans": 0,
    }
    run_id, state = run_to_end(cluster, dag_id, from_conf)
    assert state == "failed"
    assert run_ids(cluster, dag_id) == [run_id]  # no replan run
    assert states_by_node(cluster, dag_id, run_id) == {
        "1": "success",
        "2": "success",
        "3": "failed",
        "4": "success",
        "5": "skipped",
        "6": "skipped",
    }
    assert task_instance(cluster, dag_id, run_id, FINALIZE_TASK)["state"] == "failed"

    result = cluster.session_result(dag_id, run_id)
    assert result is not None
    assert (result.status, result.reason) == ("failed", "node_failed")
    failed = next(r for r in result.history if r.node_id == "3")
    assert failed.status == "failed" and failed.error is not None and "403" in failed.error

    log = env.log(dag_id)
    tools = ["query_metrics", "query_service_health", "query_deploys", "query_error_logs"]
    assert {t: log.count(t) for t in tools} == dict.fromkeys(tools, 1)  # permanent error: no retry
    assert log.count("analyze") == log.count("report") == 0


def test_scripted_replan_chain_reuses_finished_nodes(env: Env) -> None:
    cluster, dag_id = env.cluster, "e2e_seed_replan"
    root, state = run_to_end(cluster, dag_id, {"goal": "find why the payment API got slow yesterday"})
    child = f"{root}__replan_1"
    assert state == "success", cluster.diagnostics()
    assert run_ids(cluster, dag_id) == [root, child]
    assert cluster.get_run(dag_id, child)["state"] == "success"
    assert task_instance(cluster, dag_id, root, REPLAN_TASK)["state"] == "success"
    assert task_instance(cluster, dag_id, child, REPLAN_TASK)["state"] == "skipped"
    assert states_by_node(cluster, dag_id, root)["5"] == "skipped"

    log = env.log(dag_id)
    for tool in ("query_metrics", "query_service_health", "query_deploys", "query_error_logs"):
        assert log.count(tool) == 1, (tool, log.calls(tool))
    # node 5 ran only in revision 1 (moot in revision 0), revised, so under a new key; so did the report
    first = next(n for n in seed_plan()["nodes"] if n["id"] == "5")
    keys = [c["key"] for c in log.calls("analyze")]
    assert len(keys) == 1 and keys[0].startswith(f"{dag_id}/{root}/5/"), keys
    assert keys[0] != idempotency_key(dag_id, root, "5", first["tool"], first["params"])
    assert log.count("report") == 1

    result = cluster.session_result(dag_id, root)
    assert result is not None
    assert (result.status, result.reason) == ("completed", "goal_met")
    assert result.outputs["6"] == {"report": {"inputs": ["health", "latency"]}}
    assert result.revisions[0].diff.model_dump() == {"removed": [], "added": [], "revised": ["5"]}


def test_max_active_nodes_caps_a_run(env: Env) -> None:
    cluster, dag_id = env.cluster, "e2e_cap_two"
    run_id, state = run_to_end(cluster, dag_id, {"goal": "nap"})
    assert state == "success"
    states = states_by_node(cluster, dag_id, run_id)
    assert states == {f"n{i}": "success" for i in range(8)}
    log = env.log(dag_id)
    assert log.count("nap") == 8
    assert log.max_concurrency() == 2


def test_pool_caps_nodes_across_runs(env: Env) -> None:
    cluster, dag_id = env.cluster, "e2e_pool_three"
    runs = [cluster.trigger(dag_id, {"goal": f"nap {n}"}) for n in range(2)]
    for run_id in runs:
        assert cluster.wait_for_run(dag_id, run_id, timeout=RUN_TIMEOUT) == "success"
        assert set(states_by_node(cluster, dag_id, run_id).values()) == {"success"}
    log = env.log(dag_id)
    assert log.count("nap") == 16
    assert 1 < log.max_concurrency() <= 3


def test_transient_failure_is_retried_by_airflow(env: Env) -> None:
    cluster, dag_id = env.cluster, "e2e_transient"
    run_id, state = run_to_end(cluster, dag_id, {"goal": "retry"})
    assert state == "success"
    flaky = task_instance(cluster, dag_id, run_id, NODES_TASK, 0)
    assert (flaky["state"], flaky["try_number"]) == ("success", 2)
    assert task_instance(cluster, dag_id, run_id, NODES_TASK, 1)["try_number"] == 1
    assert env.log(dag_id).count("flaky") == 2
    record = cluster.xcom(dag_id, run_id, NODES_TASK, key=NODE_KEY, map_index=0)
    assert (record["status"], record["attempts"]) == ("success", 2)
    assert "transient failure 1" in cluster.task_log(dag_id, run_id, NODES_TASK, try_number=1, map_index=0)


def test_a_plan_group_runs_between_the_teams_own_tasks(env: Env) -> None:
    cluster, dag_id = env.cluster, "e2e_team_triage"
    run_id, state = run_to_end(cluster, dag_id, {})
    assert state == "success", cluster.diagnostics()
    states = {
        ti["task_id"]: ti["state"] for ti in cluster.task_instances(dag_id, run_id) if ti["map_index"] < 0
    }
    team_and_control = ["extract", "triage.plan", "triage.finalize", "publish"]
    assert {t: states[t] for t in team_and_control} == dict.fromkeys(team_and_control, "success")
    assert cluster.node_states(dag_id, run_id, group="triage") == dict.fromkeys("123456", "success")
    result = cluster.session_result(dag_id, run_id, group="triage")
    assert result is not None and (result.status, result.reason) == ("completed", "goal_met")
    published = cluster.xcom(dag_id, run_id, "publish")
    assert published == {"status": "completed", "goal": "why is payments slow?", "outputs": result.outputs}
    assert {n: env.log(dag_id).count(node=n) for n in "123456"} == dict.fromkeys("123456", 1)


def test_a_node_task_starts_with_the_provider_the_scheduler_imported(env: Env) -> None:
    """With the LocalExecutor a task process is a fork of a worker the scheduler forked: the provider's
    modules and validators the scheduler imported and built when it loaded the plugin are there before
    the task parses its DAG file (airflow_plan_provider/preload.py)."""
    cluster, dag_id = env.cluster, "e2e_preloaded"
    run_id, state = run_to_end(cluster, dag_id, {})
    assert state == "success", cluster.diagnostics()
    record = cluster.xcom(dag_id, run_id, NODES_TASK, key=NODE_KEY, map_index=0)
    where = record["output"]
    assert where["preloaded_by"] == cluster.pids["scheduler"], where
    assert where["pid"] != where["preloaded_by"]
