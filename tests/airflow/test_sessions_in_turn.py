"""Sessions in turn: a plan DAG's task instances are weighed by their session's rank among the DAG's
unfinished runs, so that when sessions share slots the earlier one goes first.

On the test process's SQLite database, with Airflow's own ``TaskInstance`` (whose constructor asks the
task's weight rule, as the scheduler does when it creates an instance) and the task as the scheduler
has it (the DAG serialized and read back, the plugin's registration resolving the rule's name).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from airflow.models.dagrun import DagRun
from airflow.models.taskinstance import TaskInstance
from airflow.serialization import serialized_objects
from airflow.utils.session import create_session
from airflow.utils.state import DagRunState

from airflow_plan_provider import build_plan_dag, sessions_in_turn
from airflow_plan_provider.contract import FINALIZE_TASK, NODES_TASK, PLAN_TASK, REPLAN_TASK, lane_task_id
from airflow_plan_provider.dag_factory import SESSIONS_IN_TURN
from airflow_plan_provider.plan.session import replan_run_id
from airflow_plan_provider.sessions_in_turn import RANK_STRIDE, SessionsInTurn, downstream, session_rank
from airflow_plan_provider.testing import CallLog, ScriptedPlanner, ScriptedTool, scripted_registry

# DagSerialization since Airflow 3.2, SerializedDAG before
DagSerialization = getattr(serialized_objects, "DagSerialization", None) or serialized_objects.SerializedDAG

PLAN = {"goal": "g", "nodes": [{"id": "a", "action": "a", "tool": "quick"}]}


def scheduler_dag(dag_id: str, log: CallLog, **kwargs: Any) -> Any:
    """A plan DAG as the scheduler reads it: serialized, then read back."""
    dag = build_plan_dag(
        dag_id,
        planner=ScriptedPlanner(PLAN),
        tools=scripted_registry(ScriptedTool("quick", log=log, returns="q")),
        **kwargs,
    )
    return DagSerialization.from_dict(DagSerialization.to_dict(dag))


def weight(dag: Any, task_id: str, run_id: str, map_index: int = 0) -> int:
    """The priority weight Airflow gives a new instance of ``task_id`` in run ``run_id`` (as it does when
    it creates a run's instances: the task's weight rule asked with a new ``TaskInstance``)."""
    task = dag.get_task(task_id)
    return int(
        task.weight_rule.get_weight(
            TaskInstance(task, run_id=run_id, map_index=map_index, dag_version_id=None)
        )
    )


@pytest.fixture
def runs(request: pytest.FixtureRequest) -> Iterator[tuple[str, list[str]]]:
    """Runs of one DAG id, created in this order: a finished run, two sessions, the first session's
    replan run, a third session and a queued fourth (the scheduler has not started it yet)."""
    dag_id = f"turns_{request.node.name[-40:]}".replace("[", "_").replace("]", "_")
    specs = [
        ("done", DagRunState.SUCCESS),
        ("s0", DagRunState.RUNNING),
        ("s1", DagRunState.RUNNING),
        (replan_run_id("s0", 1), DagRunState.RUNNING),
        ("s2", DagRunState.RUNNING),
        ("s3", DagRunState.QUEUED),
    ]
    with create_session() as session:
        for run_id, state in specs:
            session.add(DagRun(dag_id=dag_id, run_id=run_id, run_type="manual", state=state))
            session.flush()  # ids in creation order
    yield dag_id, [run_id for run_id, _ in specs]
    with create_session() as session:
        session.query(DagRun).filter(DagRun.dag_id == dag_id).delete()


def test_a_session_ranks_behind_every_unfinished_run_that_began_before_it(
    runs: tuple[str, list[str]],
) -> None:
    dag_id, _ = runs
    ranks = {run_id: session_rank(dag_id, run_id) for run_id in ("s0", "s1", "s2", "s3")}
    # s0: the finished run does not count; s1: s0; s2: s0, s1 and s0's replan run; s3: all four
    assert ranks == {"s0": 0, "s1": 1, "s2": 3, "s3": 4}


def test_a_replan_run_ranks_with_its_sessions_root_run(runs: tuple[str, list[str]]) -> None:
    dag_id, _ = runs
    assert session_rank(dag_id, replan_run_id("s0", 1)) == session_rank(dag_id, "s0") == 0
    # a later revision not created yet ranks with its root too
    assert session_rank(dag_id, replan_run_id("s1", 2)) == session_rank(dag_id, "s1") == 1


def test_a_run_not_visible_yet_began_after_every_unfinished_run(runs: tuple[str, list[str]]) -> None:
    """The API server creates a run and its first instances in a database session of its own: the rank
    is read in another one, which does not see the run yet."""
    dag_id, _ = runs
    assert session_rank(dag_id, "being_created") == 5  # s0, s1, s0's replan, s2, s3


def test_in_the_callers_open_session_a_run_it_has_not_committed_is_seen(
    runs: tuple[str, list[str]],
) -> None:
    """The scheduler creates a run's instances in the transaction that created the run: the rank is
    read in that transaction, which sees the run (and its place) before it is committed."""
    dag_id, _ = runs
    with create_session() as session:
        session.add(DagRun(dag_id=dag_id, run_id="s4", run_type="manual", state=DagRunState.QUEUED))
        session.flush()
        assert session_rank(dag_id, "s4") == 5
        session.query(DagRun).filter(DagRun.dag_id == dag_id, DagRun.state == DagRunState.RUNNING).update(
            {"state": DagRunState.SUCCESS}
        )
        session.flush()
        assert session_rank(dag_id, "s4") == 1  # only s3 (queued) is left before it
        session.rollback()
    assert session_rank(dag_id, "s4") == 5  # rolled back: not created


def test_every_task_of_a_plan_dag_weighs_its_instances_by_session(
    runs: tuple[str, list[str]], tmp_path: Any
) -> None:
    dag_id, _ = runs
    dag = scheduler_dag(dag_id, CallLog(tmp_path))
    tasks = (PLAN_TASK, NODES_TASK, FINALIZE_TASK, REPLAN_TASK)
    assert {task_id: type(dag.get_task(task_id).weight_rule) for task_id in tasks} == dict.fromkeys(
        tasks, SessionsInTurn
    )
    assert f"{SessionsInTurn.__module__}.{SessionsInTurn.__qualname__}" == SESSIONS_IN_TURN
    for task_id in tasks:
        task = dag.get_task(task_id)
        default = downstream().get_weight(TaskInstance(task, run_id="s0", map_index=0, dag_version_id=None))
        weights = [weight(dag, task_id, run_id) for run_id in ("s0", "s1", "s2", "s3")]
        assert weights == [default - RANK_STRIDE * rank for rank in (0, 1, 3, 4)], task_id
    # within a run, Airflow's own order stands: the plan task above its nodes, the nodes above finalize
    assert weight(dag, PLAN_TASK, "s2") > weight(dag, NODES_TASK, "s2") > weight(dag, FINALIZE_TASK, "s2")
    # an earlier session's last task ranks above a later session's first
    assert weight(dag, FINALIZE_TASK, "s0") > weight(dag, PLAN_TASK, "s2")


def test_node_instances_weigh_by_their_nodes_place_in_the_run_order(
    runs: tuple[str, list[str]], tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Below its session's rank, a node instance weighs one less per place of its node in the run
    order: its map index in a run without lanes; the place the planning task published (XCom
    ``places``) in a run with lanes, across the lanes' tasks. Tasks other than node tasks have none."""
    dag_id, _ = runs
    dag = scheduler_dag(dag_id, CallLog(tmp_path))
    default = downstream().get_weight(
        TaskInstance(dag.get_task(NODES_TASK), run_id="s1", map_index=0, dag_version_id=None)
    )
    base = default - RANK_STRIDE  # s1 ranks 1
    assert [weight(dag, NODES_TASK, "s1", i) for i in range(3)] == [base, base - 1, base - 2]
    asked: list[tuple[str, str, str]] = []

    def published(dag_id: str, run_id: str, prefix: str = "") -> dict[str, list[int]] | None:
        asked.append((dag_id, run_id, prefix))
        return {NODES_TASK: [0, 2, 5], lane_task_id("gpu"): [1, 3, 4]} if run_id == "s2" else None

    monkeypatch.setattr(sessions_in_turn, "node_places_of_run", published)
    monkeypatch.setattr(sessions_in_turn, "_places", {})
    base = default - 3 * RANK_STRIDE  # s2 ranks 3
    assert [weight(dag, NODES_TASK, "s2", i) for i in range(3)] == [base, base - 2, base - 5]
    assert asked == [(dag_id, "s2", "")]  # one read for the run's instances
    assert (
        weight(dag, FINALIZE_TASK, "s2")
        == downstream().get_weight(
            TaskInstance(dag.get_task(FINALIZE_TASK), run_id="s2", map_index=-1, dag_version_id=None)
        )
        - 3 * RANK_STRIDE
    )


def test_the_simulator_weighs_sessions_as_the_rule_does() -> None:
    from bench.simulator import engine

    assert engine.RANK_STRIDE == RANK_STRIDE


def test_operator_args_replace_the_weight_rule(runs: tuple[str, list[str]], tmp_path: Any) -> None:
    dag_id, _ = runs
    dag = scheduler_dag(dag_id, CallLog(tmp_path), operator_args={"weight_rule": "absolute"})
    assert [weight(dag, NODES_TASK, run_id) for run_id in ("s0", "s2")] == [1, 1]
