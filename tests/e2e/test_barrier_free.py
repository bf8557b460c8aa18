"""Barrier-free nodes on a real scheduler (LocalExecutor, SQLite): a node starts when its own parents
finish, a deferred node comes back to wait once its parents start their tools (started on the
triggerer, in a run without slots to spare only to an idle slot), a cap smaller than the
plan's width with a retrying parent does not deadlock, sessions sharing a pool run in turn, and
concurrent runs on SQLite complete while another writer holds the database lock
for longer than an API request's default timeout."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_plan_provider.contract import (
    FINALIZE_TASK,
    NODES_TASK,
    PLAN_KEY,
    PLAN_TASK,
    RUN_CONTEXT_KEY,
    after_lane,
    lane_task_id,
    select_task_id,
)
from airflow_plan_provider.plan.model import ValidatedPlan
from airflow_plan_provider.sessions_in_turn import RANK_STRIDE
from airflow_plan_provider.testing import CallLog
from harness.cluster import AirflowCluster
from harness.sqlite import LOCK_TIMEOUT

pytestmark = pytest.mark.e2e

DAG_FILE = Path(__file__).parent / "dags" / "barrier_free_dags.py"
DAGS = (
    "e2e_unbalanced",
    "e2e_cap_2_retrying_root",
    "e2e_dag_cap_2_retrying_root",
    "e2e_sqlite_diamond",
    "e2e_sessions_in_turn",
    "e2e_comes_back",
    "e2e_lanes_in_order",
    "e2e_started_on_triggerer",
    "e2e_started_without_spare",
)
AFTER = lane_task_id(after_lane(None))  # the default lane's nodes that start on the triggerer
LOCKED = "database is locked"
HOLD = 8.0  # seconds another writer holds the lock


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AirflowCluster, Path]]:
    base = tmp_path_factory.mktemp("barrier_free")
    (base / "dags").mkdir()
    shutil.copy(DAG_FILE, base / "dags")
    calls = base / "calls"
    with AirflowCluster(base / "dags", env={"PLAN_E2E_CALL_LOG": str(calls)}) as running:
        for dag_id in DAGS:
            running.wait_for_dag(dag_id, timeout=180)
            running.unpause(dag_id)
        yield running, calls


def times(log: CallLog, node: str) -> dict[str, float]:
    entries = [e for e in log._read(log.path) if e["node"] == node]
    return {e["event"]: e["t"] for e in entries}


def test_a_node_starts_when_its_own_parents_finish(cluster: tuple[AirflowCluster, Path]) -> None:
    airflow, calls = cluster
    run_id = airflow.trigger("e2e_unbalanced", {"goal": "unbalanced"})
    assert airflow.wait_for_run("e2e_unbalanced", run_id, timeout=300) == "success"
    log = CallLog(calls / "e2e_unbalanced")
    a, c, d = times(log, "a"), times(log, "c"), times(log, "d")
    assert c["start"] < a["end"]  # c (layer 1) did not wait for a (layer 0, 20 s): no barrier
    assert d["start"] >= a["end"] and d["start"] >= c["end"]  # d waited for both of its parents
    assert {n: log.count(node=n) for n in "abcd"} == dict.fromkeys("abcd", 1)
    result = airflow.session_result("e2e_unbalanced", run_id)
    assert result is not None and result.status == "completed"
    assert result.outputs == {"a": "slow", "b": "q", "c": "q", "d": "q"}
    task_ids = {ti["task_id"] for ti in airflow.task_instances("e2e_unbalanced", run_id)}
    assert task_ids == {PLAN_TASK, NODES_TASK, FINALIZE_TASK}


def test_a_deferred_node_comes_back_to_wait_once_its_parents_start_their_tools(
    cluster: tuple[AirflowCluster, Path],
) -> None:
    """Chain a (12 s) -> b (4 s) -> c, in-slot bound 4 s. c defers while b still waits on a, and comes
    back to wait in a slot once b runs its tool; b defers on a, which runs its tool already, and waits
    on the triggerer until a's end."""
    airflow, calls = cluster
    dag_id = "e2e_comes_back"
    run_id = airflow.trigger(dag_id, {"goal": "chain"})
    assert airflow.wait_for_run(dag_id, run_id, timeout=300) == "success"
    log = CallLog(calls / dag_id)
    a, b, c = times(log, "a"), times(log, "b"), times(log, "c")
    assert a["end"] <= b["start"] and b["end"] <= c["start"]
    assert {n: log.count(node=n) for n in "abc"} == dict.fromkeys("abc", 1)
    came_back = "parents run their tools; waiting for them in its slot"
    # map indexes follow the plan's run order: a, b, c
    logs = {
        node: airflow.task_log(dag_id, run_id, NODES_TASK, try_number=1, map_index=i)
        for i, node in enumerate("abc")
    }
    assert "waiting on the triggerer" in logs["c"] and came_back in logs["c"], logs["c"]
    assert "waiting on the triggerer" in logs["b"] and came_back not in logs["b"]


def test_nodes_with_parents_start_on_the_triggerer_and_come_to_a_slot_near_their_parents(
    cluster: tuple[AirflowCluster, Path],
) -> None:
    """``NodeExecution(start_on_triggerer=True)``, two slots for the run: a (15 s) -> b (3 s) -> c, and
    r -> d <- c. Airflow starts b, c and d on the triggerer (their task ``nodes__after``), where they
    wait holding no slot: each instance's first try resumes from its start trigger. b comes to a slot
    while a runs its tool; every node runs once, after its parents."""
    airflow, calls = cluster
    dag_id = "e2e_started_on_triggerer"
    run_id = airflow.trigger(dag_id, {"goal": "started on the triggerer"})
    assert airflow.wait_for_run(dag_id, run_id, timeout=300) == "success"
    log = CallLog(calls / dag_id)
    a, b, c, r, d = (times(log, node) for node in "abcrd")
    assert a["end"] <= b["start"] and b["end"] <= c["start"] and max(r["end"], c["end"]) <= d["start"]
    assert {n: log.count(node=n) for n in "abcrd"} == dict.fromkeys("abcrd", 1)
    result = airflow.session_result(dag_id, run_id)
    assert result is not None and result.outputs == {"a": "a", "r": "q", "b": "b", "c": "q", "d": "q"}
    instances = airflow.task_instances(dag_id, run_id)
    assert {ti["task_id"] for ti in instances} == {
        PLAN_TASK,
        NODES_TASK,
        select_task_id(AFTER),
        AFTER,
        FINALIZE_TASK,
    }
    after = sorted((ti for ti in instances if ti["task_id"] == AFTER), key=lambda ti: ti["map_index"])
    assert [ti["rendered_map_index"].split(" · ")[0] for ti in after] == ["b", "c", "d"]
    logs = {
        node: airflow.task_log(dag_id, run_id, AFTER, try_number=1, map_index=i)
        for i, node in enumerate("bcd")
    }
    for node, text in logs.items():
        assert "started on the triggerer" in text, (node, text)
    assert "started on the triggerer; its parents run their tools" in logs["b"], logs["b"]
    roots = airflow.task_log(dag_id, run_id, NODES_TASK, try_number=1, map_index=0)
    assert "started on the triggerer" not in roots


def test_in_a_run_without_slots_to_spare_a_started_node_comes_near_its_parents_only_to_an_idle_slot(
    cluster: tuple[AirflowCluster, Path],
) -> None:
    """Two slots, seven nodes in three layers: a (30 s) -> b -> c beside four 2 s roots. b, weighed
    before the roots (it has a descendant), would take the slot the first root frees; instead its
    trigger sees the run's two slots held or waited for by a and the roots, says so in b's log, and has
    b come near a only once the last root ended, while a still runs its tool."""
    from datetime import datetime

    airflow, calls = cluster
    dag_id = "e2e_started_without_spare"
    run_id = airflow.trigger(dag_id, {"goal": "without slots to spare"})
    assert airflow.wait_for_run(dag_id, run_id, timeout=300) == "success"
    context = airflow.xcom(dag_id, run_id, PLAN_TASK, key=RUN_CONTEXT_KEY)
    assert context["near_while_idle"] == {"slots": 2, "tasks": [NODES_TASK, AFTER]}
    log = CallLog(calls / dag_id)
    nodes = ["a", "r1", "r2", "r3", "r4", "b", "c"]
    assert {n: log.count(node=n) for n in nodes} == dict.fromkeys(nodes, 1)
    a, b = times(log, "a"), times(log, "b")
    last_root = max(times(log, f"r{i}")["end"] for i in range(1, 5))
    text = airflow.task_log(dag_id, run_id, AFTER, try_number=1, map_index=0)
    came = [line for line in text.splitlines() if "on the triggerer; its parents run their tools" in line]
    assert came, text
    when = datetime.fromisoformat(came[0].split(" ", 1)[0].replace("Z", "+00:00")).timestamp()
    assert last_root <= when < a["end"] <= b["start"], (last_root, when, a["end"])
    assert "slots are all taken or waited for" in text, text


@pytest.mark.parametrize(
    "dag_id",
    ["e2e_cap_2_retrying_root", "e2e_dag_cap_2_retrying_root"],
    ids=["node task cap", "DAG cap"],
)
def test_a_cap_of_two_with_a_root_that_retries_twice_completes(
    cluster: tuple[AirflowCluster, Path], dag_id: str
) -> None:
    """Ten nodes, at most two running at once, six children waiting on a root that fails twice: the
    children make way for the root's retries instead of keeping the two slots (no deadlock). Under the
    node task's cap (``max_active_nodes``) or the DAG's (``max_active_tasks``, where waiting nodes also
    step aside for ready ones)."""
    airflow, calls = cluster
    run_id = airflow.trigger(dag_id, {"goal": "retrying root"})
    assert airflow.wait_for_run(dag_id, run_id, timeout=420) == "success"
    states = airflow.node_states(dag_id, run_id)
    assert states == dict.fromkeys(["root", *(f"c{i}" for i in range(6)), "g0", "g1", "end"], "success")
    root = next(
        ti
        for ti in airflow.task_instances(dag_id, run_id)
        if ti["task_id"] == NODES_TASK and ti["map_index"] == 0
    )
    assert root["try_number"] == 3
    log = CallLog(calls / dag_id)
    assert log.count("flaky") == 3 and log.count("quick") == 9
    result = airflow.session_result(dag_id, run_id)
    assert result is not None and (result.status, result.reason) == ("completed", "goal_met")


def test_sessions_sharing_a_pool_run_in_turn(cluster: tuple[AirflowCluster, Path]) -> None:
    """Three sessions triggered without a logical date, their nine nodes waiting for a pool of no slot;
    then the pool gets one slot. Every instance of a session outranks every instance of a later one
    (Airflow would otherwise hand the slot out by map index: a, a, a, b, b, b, ...), so the sessions'
    nodes run one session after the other, in the order the sessions were triggered."""
    airflow, _ = cluster
    dag_id, pool = "e2e_sessions_in_turn", "e2e_sessions"
    airflow.api("POST", "/pools", {"name": pool, "slots": 0, "include_deferred": False})
    run_ids = [airflow.trigger(dag_id, {"goal": f"session {i}"}) for i in range(3)]

    def nodes(run_id: str) -> list[dict[str, Any]]:
        return [ti for ti in airflow.task_instances(dag_id, run_id) if ti["task_id"] == NODES_TASK]

    deadline = time.monotonic() + 240
    while not all(
        [ti["state"] for ti in nodes(run_id)] == ["scheduled"] * 3 for run_id in run_ids
    ):  # every session planned, its nodes waiting for the pool
        assert time.monotonic() < deadline, {run_id: nodes(run_id) for run_id in run_ids}
        time.sleep(1.0)
    airflow.api("PATCH", f"/pools/{pool}", {"pool": pool, "slots": 1, "include_deferred": False})
    for run_id in run_ids:
        assert airflow.wait_for_run(dag_id, run_id, timeout=300) == "success"
    # each node one below the one before it in the run order, each session a stride below the one before
    weights = [
        [ti["priority_weight"] for ti in sorted(nodes(run_id), key=lambda ti: ti["map_index"])]
        for run_id in run_ids
    ]
    first = weights[0][0]
    assert weights == [[first - RANK_STRIDE * rank - place for place in range(3)] for rank in range(3)], (
        weights
    )
    starts = [sorted(ti["start_date"] for ti in nodes(run_id)) for run_id in run_ids]
    assert starts[0][-1] < starts[1][0] and starts[1][-1] < starts[2][0], starts


def test_node_instances_weigh_by_their_place_in_the_run_order_across_lanes(
    cluster: tuple[AirflowCluster, Path],
) -> None:
    """A plan whose nodes run in two tasks (the default lane and a pooled tool's): every node instance
    weighs one less than the one before it in the plan's run order, whichever task it is in, so that
    Airflow hands the slots the tasks share out in the plan's order. A mapped task's first instance is
    the one Airflow created with the run, before the plan (map index -1, turned into 0 at expansion with
    its weight kept): it weighs as the run's first place."""
    airflow, _ = cluster
    dag_id = "e2e_lanes_in_order"
    airflow.api("POST", "/pools", {"name": "e2e_lane", "slots": 2, "include_deferred": False})
    run_id = airflow.trigger(dag_id, {"goal": "two lanes"})
    assert airflow.wait_for_run(dag_id, run_id, timeout=300) == "success"
    plan = airflow.xcom(dag_id, run_id, PLAN_TASK, PLAN_KEY)
    order = ValidatedPlan.model_validate(plan).run_order
    lanes = airflow.xcom(dag_id, run_id, PLAN_TASK, RUN_CONTEXT_KEY)["lanes"]
    assert set(lanes) == {"r2", "m2", "end"}
    node_tasks = {NODES_TASK, f"{NODES_TASK}__e2e_lane"}
    instances = [ti for ti in airflow.task_instances(dag_id, run_id) if ti["task_id"] in node_tasks]
    by_node, firsts = {}, set()
    for task_id in sorted(node_tasks):  # map indexes follow the run order within each task
        in_task = [n for n in order if (n in lanes) == (task_id != NODES_TASK)]
        firsts.add(in_task[0])
        for ti in instances:
            if ti["task_id"] == task_id:
                by_node[in_task[ti["map_index"]]] = ti["priority_weight"]
    first = by_node[order[0]]
    expected = [first if node in firsts else first - place for place, node in enumerate(order)]
    assert [by_node[node] for node in order] == expected, by_node
    assert order[1] in firsts and order[1] in lanes  # the lane's first node is second in the run


@contextlib.contextmanager
def lock_held(database: Path, holds: int, hold: float, gap: float) -> Iterator[list[float]]:
    """Another writer takes SQLite's database lock ``holds`` times, for ``hold`` s each with ``gap`` s
    between, while the block runs; yields the seconds each hold waited for the lock."""
    waits: list[float] = []

    def take() -> None:
        connection = sqlite3.connect(database, timeout=LOCK_TIMEOUT, isolation_level=None)
        try:
            for _ in range(holds):
                time.sleep(gap)
                asked = time.monotonic()
                connection.execute("BEGIN IMMEDIATE")
                waits.append(time.monotonic() - asked)
                time.sleep(hold)
                connection.execute("ROLLBACK")
        finally:
            connection.close()

    holder = threading.Thread(target=take, name="lock-holder")
    holder.start()
    try:
        yield waits
    finally:
        holder.join()


@pytest.mark.slow  # a load test: the only one of SQLite held locked under concurrent runs
def test_ten_concurrent_runs_on_sqlite_complete_while_the_database_is_locked(
    cluster: tuple[AirflowCluster, Path],
) -> None:
    """Ten runs at once, and three times the lock is held for 8 s: longer than Airflow's default
    execution API timeout (5 s), after which a task gave up on requests the server went on to commit."""
    airflow, _ = cluster
    dag_id = "e2e_sqlite_diamond"
    assert airflow.is_sqlite and HOLD < LOCK_TIMEOUT
    run_ids = [airflow.trigger(dag_id, {"goal": f"diamond {i}"}) for i in range(10)]
    database = Path(airflow.database_url.split("///", 1)[1])
    with lock_held(database, holds=3, hold=HOLD, gap=2.0) as waits:
        outcomes = {run_id: airflow.wait_for_run(dag_id, run_id, timeout=600) for run_id in run_ids}
    failed = [run_id for run_id, outcome in outcomes.items() if outcome != "success"]
    assert not failed, "\n".join(airflow.failure_report(dag_id, run_id) for run_id in failed)
    # ten runs, and the lock was held three times, each while runs were going
    assert len(outcomes) == 10 and len(waits) == 3
    for run_id in run_ids:
        result = airflow.session_result(dag_id, run_id)
        assert result is not None and result.status == "completed", result
        assert LOCKED not in result.model_dump_json()
    locked = [
        f"{path.relative_to(airflow.log_dir)}: {line.strip()[:200]}"
        for path in sorted(airflow.log_dir.rglob("*.log"))
        for line in path.read_text(errors="replace").splitlines()
        if LOCKED in line
    ]
    assert locked == []
