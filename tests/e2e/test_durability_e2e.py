"""Durability of plan runs on a real Airflow (scheduler, dag-processor, api-server, triggerer as processes):

- a scheduler crash (SIGKILL of the scheduler, its LocalExecutor workers and their task processes) at
  three points of a run, then a restart: the run completes, finished nodes are not called again, and the
  node killed mid-call is tried again with the same idempotency key, its side effect done once;
- clearing a failed node and its skipped descendants through the REST API re-runs only those;
- an asynchronous node waits on the triggerer without holding a worker slot (one-slot LocalExecutor), and
  a failed asynchronous job fails its node with the job's reason.

DAGs: tests/e2e/dags/durability_dags.py. Each class starts its own cluster (never two at once).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
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
from harness.cluster import AirflowApiError, AirflowCluster
from harness.processes import pid_alive
from tests.e2e.conftest import demo_env, plan_cluster

pytestmark = pytest.mark.e2e

DAG_FILE = Path(__file__).resolve().parent / "dags" / "durability_dags.py"
GATE = "gate"  # as in dags/durability_dags.py
RUN_TIMEOUT = 240.0
HOLD_SECONDS = 120  # the first call of the crash target works this long: it is always killed first

# After a SIGKILL the dead scheduler's SchedulerJob row still says "running". The restarted scheduler
# adopts or resets the task instances queued by a SchedulerJob only once that job's heartbeat is older
# than scheduler_health_check_threshold (default 30 s), and looks every orphaned_tasks_check_interval
# (default 300 s!). The LocalExecutor cannot adopt, so the running task instance is reset (state None,
# the killed try recorded as failed in the try history) and scheduled again as the next try: the
# scheduler logs "Marked 1 SchedulerJob instances as failed" then "Reset the following 1 orphaned
# TaskInstances". The task-instance heartbeat timeout (default 300 s) only applies to task instances
# queued by the *current* scheduler, so it plays no part here; it is shortened as a safety net.
DURABILITY_SETTINGS = {
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "15",
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "2",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "30",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "2",
}


@dataclass
class Env:
    cluster: AirflowCluster
    calls: Path

    def log(self, dag_id: str) -> CallLog:
        return CallLog(self.calls / dag_id)


def start_cluster(
    factory: pytest.TempPathFactory, name: str, dag_ids: tuple[str, ...], parallelism: int
) -> Iterator[Env]:
    base = factory.mktemp(name)
    extra = {**demo_env(base), **DURABILITY_SETTINGS}
    with plan_cluster(base, [DAG_FILE], dag_ids, env=extra, parallelism=parallelism) as cluster:
        yield Env(cluster, base / "calls")


# --------------------------------------------------------------------------------------------- helpers


def node_tis(cluster: AirflowCluster, dag_id: str, run_id: str) -> dict[str, dict[str, Any]]:
    """Plan node id → its task instance (the i-th node of the published plan in run order →
    ``nodes[i]``). Empty before the plan is published and the node task is expanded.
    """
    try:
        plan = cluster.xcom(dag_id, run_id, PLAN_TASK, key=PLAN_KEY)
    except AirflowApiError as error:
        if error.status == 404:
            return {}
        raise
    tis = {(ti["task_id"], ti["map_index"]): ti for ti in cluster.task_instances(dag_id, run_id)}
    order = ValidatedPlan.model_validate(plan).run_order
    return {node: tis[(NODES_TASK, i)] for i, node in enumerate(order) if (NODES_TASK, i) in tis}


def states(cluster: AirflowCluster, dag_id: str, run_id: str) -> dict[str, str]:
    return {node: ti["state"] for node, ti in node_tis(cluster, dag_id, run_id).items()}


def task_instance(
    cluster: AirflowCluster, dag_id: str, run_id: str, task_id: str, map_index: int = -1
) -> dict[str, Any]:
    [ti] = [
        t
        for t in cluster.task_instances(dag_id, run_id)
        if t["task_id"] == task_id and t["map_index"] == map_index
    ]
    return ti


def events(log: CallLog, dag_id: str, run_id: str) -> list[dict[str, Any]]:
    """Every start/end entry of one run's tool calls (its idempotency keys start with dag/run/)."""
    if not log.path.exists():
        return []
    prefix = f"{dag_id}/{run_id}/"
    entries = [json.loads(line) for line in log.path.read_text().splitlines() if line.strip()]
    return [e for e in entries if e["key"].startswith(prefix)]


def starts(log: CallLog, dag_id: str, run_id: str, node: str) -> list[dict[str, Any]]:
    return [e for e in events(log, dag_id, run_id) if e["node"] == node and e["event"] == "start"]


def ends(log: CallLog, dag_id: str, run_id: str, node: str) -> list[dict[str, Any]]:
    return [e for e in events(log, dag_id, run_id) if e["node"] == node and e["event"] == "end"]


def effects(log: CallLog, dag_id: str, run_id: str) -> list[dict[str, Any]]:
    return [e for e in log.side_effects() if e["key"].startswith(f"{dag_id}/{run_id}/")]


def recovery_lines(cluster: AirflowCluster) -> list[str]:
    """The scheduler's log lines about failing the dead SchedulerJob and resetting/failing its tasks."""
    text = cluster.log_path("scheduler").read_text(errors="replace")
    needles = ("SchedulerJob instances as failed", "orphaned TaskInstances", "without a heartbeat")
    return [line.strip()[:300] for line in text.splitlines() if any(n in line for n in needles)]


def executor_workers(cluster: AirflowCluster) -> list[int]:
    """LocalExecutor worker processes (``[core] parallelism`` of them, forked when the scheduler starts)."""
    found = []
    for pid in cluster.all_pids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if cmdline.startswith("airflow worker -- LocalExecutor"):
            found.append(pid)
    return found


def utc(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def wait_until(condition: Any, timeout: float, what: str, cluster: AirflowCluster, poll: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{cluster.diagnostics()}")


# ------------------------------------------------------------------------------------- crash and clear

CRASH_DAG = "e2e_crash"
CLEAR_DAG = "e2e_clear"
LAYER_0 = ("a1", "a2", "a3")


def crash_plan(target: str) -> dict[str, Any]:
    """a1, a2, a3 → b → c; the target node works HOLD_SECONDS on its first call, the others return at once."""
    nodes = [
        {
            "id": node,
            "action": f"step {node}",
            "tool": "step",
            "params": {"seconds": HOLD_SECONDS if node == target else 0},
        }
        for node in (*LAYER_0, "b", "c")
    ]
    edges = [{"from": a, "to": "b"} for a in LAYER_0] + [{"from": "b", "to": "c"}]
    return {"goal": f"survive a crash while {target} works", "nodes": nodes, "edges": edges}


# kill point → (target node, nodes that must have succeeded before the kill)
CRASH_POINTS = {
    "layer_0_node": ("a3", ("a1", "a2")),
    "layer_1_node": ("b", LAYER_0),
    "final_node": ("c", (*LAYER_0, "b")),
}
# `make test` kills the scheduler once, while a layer-1 node works (nodes finished before it, nodes to run
# after it); the kill points in the first layer and in the final node are in the slow tier.
CRASH_TIERS = [pytest.param(p, marks=[] if p == "layer_1_node" else [pytest.mark.slow]) for p in CRASH_POINTS]


class TestCrashAndClear:
    @pytest.fixture(scope="class")
    def env(self, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
        yield from start_cluster(tmp_path_factory, "durability", (CRASH_DAG, CLEAR_DAG), parallelism=8)

    @pytest.mark.parametrize("point", CRASH_TIERS)
    def test_scheduler_crash_then_restart_resumes_the_run(self, env: Env, point: str) -> None:
        cluster, log = env.cluster, env.log(CRASH_DAG)
        target, before = CRASH_POINTS[point]
        assert cluster.api("GET", f"/dags/{CRASH_DAG}/tasks/nodes")["retries"] >= 1
        run_id = cluster.trigger(CRASH_DAG, {"goal": "crash", "plan": crash_plan(target)})

        def at_kill_point() -> tuple[dict[str, Any], dict[str, dict[str, Any]]] | None:
            started = starts(log, CRASH_DAG, run_id, target)
            if not started or not any(e["key"] == started[0]["key"] for e in log.side_effects()):
                return None
            tis = node_tis(cluster, CRASH_DAG, run_id)
            if all(tis.get(n, {}).get("state") == "success" for n in before):
                return started[0], tis
            return None

        call, tis = wait_until(at_kill_point, 180, f"{target} working with {before} done", cluster)
        victim = call["pid"]
        assert ends(log, CRASH_DAG, run_id, target) == []  # mid-call
        assert tis[target]["state"] == "running"
        assert victim in cluster.all_pids() and pid_alive(victim)
        succeeded_before = {n for n, ti in tis.items() if ti["state"] == "success"}
        assert succeeded_before >= set(before)

        cluster.kill("scheduler")
        assert not pid_alive(victim), f"task process {victim} survived the scheduler's SIGKILL"
        assert victim not in cluster.all_pids()
        assert ends(log, CRASH_DAG, run_id, target) == []  # killed before its tool call returned
        t_kill = time.monotonic()
        cluster.restart("scheduler")

        state = cluster.wait_for_run(CRASH_DAG, run_id, timeout=RUN_TIMEOUT)
        print(f"\n[e2e] crash at {point}: run {state} {time.monotonic() - t_kill:.1f}s after the kill")
        assert state == "success", cluster.diagnostics()
        assert states(cluster, CRASH_DAG, run_id) == dict.fromkeys((*LAYER_0, "b", "c"), "success")

        # every node that had succeeded before the kill was called once; so were the ones after it
        for node in (*LAYER_0, "b", "c"):
            if node != target:
                assert len(starts(log, CRASH_DAG, run_id, node)) == 1, (node, events(log, CRASH_DAG, run_id))
        # the killed node started twice, both times with the same idempotency key ...
        calls = starts(log, CRASH_DAG, run_id, target)
        key = idempotency_key(CRASH_DAG, run_id, target, "step", {"seconds": HOLD_SECONDS})
        assert [c["key"] for c in calls] == [key] * 2
        assert calls[1]["pid"] != victim
        # ... and its side effect, done by the killed try, was not done again by the retry
        done = effects(log, CRASH_DAG, run_id)
        assert sorted(e["node"] for e in done) == sorted((*LAYER_0, "b", "c"))  # one per key
        [effect] = [e for e in done if e["node"] == target]
        assert (effect["key"], effect["pid"]) == (calls[0]["key"], victim)
        record = cluster.xcom(
            CRASH_DAG, run_id, tis[target]["task_id"], key=NODE_KEY, map_index=tis[target]["map_index"]
        )
        assert record["status"] == "success"
        assert record["output"]["performed"] is False  # the retry found the effect done
        assert record["attempts"] >= 2
        retried = node_tis(cluster, CRASH_DAG, run_id)[target]
        assert retried["try_number"] >= 2
        tries = cluster.api(
            "GET",
            f"/dags/{CRASH_DAG}/dagRuns/{run_id}/taskInstances/{retried['task_id']}"
            f"/{retried['map_index']}/tries",
        )["task_instances"]
        print(f"[e2e] {target} tries: {[(t['try_number'], t['state']) for t in tries]}")
        print(f"[e2e] scheduler: {recovery_lines(cluster)}")
        result = cluster.session_result(CRASH_DAG, run_id)
        assert result is not None and result.status == "completed"

    def test_clearing_the_node_task_reruns_the_failed_node_and_its_skipped_descendants_only(
        self, env: Env
    ) -> None:
        cluster, log = env.cluster, env.log(CLEAR_DAG)
        (log.folder / GATE).unlink(missing_ok=True)
        run_id = cluster.trigger(CLEAR_DAG, {"goal": "clear"})
        assert cluster.wait_for_run(CLEAR_DAG, run_id, timeout=RUN_TIMEOUT) == "failed"
        tis = node_tis(cluster, CLEAR_DAG, run_id)
        assert {n: ti["state"] for n, ti in tis.items()} == {
            "p1": "success",
            "p2": "failed",
            "q": "skipped",
            "r": "success",
            "s": "skipped",
        }
        assert task_instance(cluster, CLEAR_DAG, run_id, FINALIZE_TASK)["state"] == "failed"
        assert {n: len(starts(log, CLEAR_DAG, run_id, n)) for n in tis} == {
            "p1": 1,
            "p2": 1,
            "q": 0,
            "r": 1,
            "s": 0,
        }
        marker = lambda node: [tis[node]["task_id"], tis[node]["map_index"]]  # noqa: E731
        path = f"/dags/{CLEAR_DAG}/clearTaskInstances"

        def cleared(body: dict[str, Any]) -> set[tuple[str, int, str]]:
            res = cluster.api("POST", path, {"dag_run_id": run_id, **body})
            return {(t["task_id"], t["map_index"], t["state"]) for t in res["task_instances"]}

        # Every node is an instance of the one node task: clearing the failed instance with its
        # downstream (a dry run) clears it, finalize and replan only, and leaves the skipped
        # descendants q and s skipped. What re-runs a failed node and what it skipped is clearing the
        # node task as a whole (every instance) with its downstream.
        p2, q, r, s = (tis[n] for n in ("p2", "q", "r", "s"))
        assert cleared(
            {"dry_run": True, "task_ids": [marker("p2")], "only_failed": False, "include_downstream": True}
        ) == {
            (p2["task_id"], p2["map_index"], "failed"),
            (FINALIZE_TASK, -1, "failed"),
            (REPLAN_TASK, -1, "upstream_failed"),
        }

        # Open the gate, then clear the node task with its downstream. The succeeded nodes p1 and r
        # finish at once from their checkpoints (keyed by their idempotency keys), without calling
        # their tools again.
        (log.folder / GATE).touch()
        body = {
            "dry_run": False,
            "task_ids": [p2["task_id"]],
            "only_failed": False,
            "include_downstream": True,
        }
        cleared_now = {(task_id, index) for task_id, index, _state in cleared(body)}
        assert {
            (p2["task_id"], p2["map_index"]),
            (q["task_id"], q["map_index"]),
            (r["task_id"], r["map_index"]),
            (s["task_id"], s["map_index"]),
            (FINALIZE_TASK, -1),
        } <= cleared_now
        assert cluster.wait_for_run(CLEAR_DAG, run_id, timeout=RUN_TIMEOUT) == "success"
        after = node_tis(cluster, CLEAR_DAG, run_id)
        assert {n: ti["state"] for n, ti in after.items()} == dict.fromkeys(tis, "success")
        # p2 ran again (second try) and q, s ran for the first time; p1 and r were not executed again
        assert {n: len(starts(log, CLEAR_DAG, run_id, n)) for n in tis} == {
            "p1": 1,
            "p2": 2,
            "q": 1,
            "r": 1,
            "s": 1,
        }
        r_record = cluster.xcom(CLEAR_DAG, run_id, r["task_id"], key=NODE_KEY, map_index=r["map_index"])
        assert r_record["checkpoint"] is True and r_record["status"] == "success"
        assert task_instance(cluster, CLEAR_DAG, run_id, FINALIZE_TASK)["state"] == "success"
        record = cluster.xcom(CLEAR_DAG, run_id, p2["task_id"], key=NODE_KEY, map_index=p2["map_index"])
        assert (record["status"], record["output"], record["attempts"]) == ("success", 7, 2)
        result = cluster.session_result(CLEAR_DAG, run_id)
        assert result is not None
        assert (result.status, result.reason) == ("completed", "goal_met")
        assert result.outputs["s"] == {"ok": True}


# ------------------------------------------------------------------------------------ deferred, 1 slot

ASYNC_DAG = "e2e_async_wait"
QUICK_DAG = "e2e_quick_three"
ASYNC_FAILS_DAG = "e2e_async_fails"


class TestDeferredNodeHoldsNoWorkerSlot:
    @pytest.fixture(scope="class")
    def env(self, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
        yield from start_cluster(
            tmp_path_factory, "one_slot", (ASYNC_DAG, QUICK_DAG, ASYNC_FAILS_DAG), parallelism=1
        )

    def test_another_run_completes_while_a_node_waits_deferred(self, env: Env) -> None:
        cluster = env.cluster
        run_a = cluster.trigger(ASYNC_DAG, {"goal": "export"})

        def export_ti() -> dict[str, Any] | None:
            try:
                return task_instance(cluster, ASYNC_DAG, run_a, NODES_TASK, 0)
            except ValueError:  # not expanded yet
                return None

        wait_until(lambda: (export_ti() or {}).get("state") == "deferred", 120, "A's node deferred", cluster)
        t_deferred = time.monotonic()
        run_b = cluster.trigger(QUICK_DAG, {"goal": "quick"})
        assert cluster.wait_for_run(QUICK_DAG, run_b, timeout=RUN_TIMEOUT) == "success"
        print(f"\n[e2e] B completed {time.monotonic() - t_deferred:.1f}s after A's node deferred")
        waiting = export_ti()
        assert waiting is not None and waiting["state"] == "deferred", waiting  # A still waits
        assert states(cluster, QUICK_DAG, run_b) == dict.fromkeys(("k0", "k1", "k2"), "success")
        assert env.log(QUICK_DAG).count("quick") == 3
        assert env.log(QUICK_DAG).max_concurrency() == 1
        assert len(executor_workers(cluster)) == 1  # one worker slot in all

        assert cluster.wait_for_run(ASYNC_DAG, run_a, timeout=RUN_TIMEOUT) == "success"
        done = export_ti()
        assert done is not None and done["state"] == "success"
        b_end = utc(cluster.get_run(QUICK_DAG, run_b)["end_date"])
        assert b_end < utc(done["end_date"])  # B ended before A's node did
        record = cluster.xcom(ASYNC_DAG, run_a, NODES_TASK, key=NODE_KEY, map_index=0)
        assert record["status"] == "success"
        assert record["output"] == {"rows": 42, "uri": "file:///exports/table.parquet"}
        assert record["polling"]["outcome"] == "done"
        assert env.log(ASYNC_DAG).count("export") == 1  # the job was started once
        result = cluster.session_result(ASYNC_DAG, run_a)
        assert result is not None and result.status == "completed"
        assert result.outputs["export"] == record["output"]

    def test_a_failed_job_fails_its_node_with_the_reason(self, env: Env) -> None:
        cluster = env.cluster
        run_id = cluster.trigger(ASYNC_FAILS_DAG, {"goal": "export"})
        assert cluster.wait_for_run(ASYNC_FAILS_DAG, run_id, timeout=RUN_TIMEOUT) == "failed"
        ti = task_instance(cluster, ASYNC_FAILS_DAG, run_id, NODES_TASK, 0)
        assert (ti["state"], ti["try_number"]) == ("failed", 1)  # a failed job is not retried
        record = cluster.xcom(ASYNC_FAILS_DAG, run_id, NODES_TASK, key=NODE_KEY, map_index=0)
        assert record["status"] == "failed"
        assert record["error"] == "job failed: warehouse export quota exceeded"
        assert record["polling"]["outcome"] == "failed"
        result = cluster.session_result(ASYNC_FAILS_DAG, run_id)
        assert result is not None
        assert (result.status, result.reason) == ("failed", "node_failed")
        assert "warehouse export quota exceeded" in result.message
