"""Control tasks (plan, lane select tasks, finalize, replan) retry, each safe to run again (dag.test).

A lost worker is stood in for by a try that raises after its work (the task runner then records the
try as failed and Airflow retries it, as after a heartbeat timeout): the state it leaves is the one a
worker killed at that moment leaves. tests/e2e/test_celery_durability.py kills real workers.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_plan_provider import Budgets, NodeExecution
from airflow_plan_provider.contract import (
    FINALIZE_TASK,
    NODES_TASK,
    PLAN_TASK,
    REPLAN_TASK,
    lane_task_id,
    select_task_id,
)
from airflow_plan_provider.testing import CallLog, ScriptedPlanner, ScriptedTool, scripted_registry
from airflow_plan_provider.testing.in_process import run_plan_dag, run_session
from tests.airflow.support import xcom

pytestmark = pytest.mark.airflow

LINEAR = {
    "goal": "two steps",
    "nodes": [
        {"id": "1", "action": "step 1", "tool": "a", "params": {}},
        {"id": "2", "action": "step 2", "tool": "b", "params": {"x": "${1}"}},
    ],
    "edges": [],
}
AROUND = {
    "nodes": [{"id": "2b", "action": "step 2 another way", "tool": "b2", "params": {"x": "${1}"}}],
    "edges": [],
}
AROUND_FAILING = {
    "nodes": [{"id": "2b", "action": "step 2 once more", "tool": "b", "params": {}}],
    "edges": [],
}


def build(dag_id: str, planner: Any, log: CallLog, **options: Any) -> Any:
    from airflow_plan_provider import ControlRetries
    from airflow_plan_provider.dag_factory import build_plan_dag

    tools = [
        ScriptedTool("a", log=log, returns=1, side_effect=True),
        ScriptedTool("b", log=log, permanent="403 forbidden"),
        ScriptedTool("b2", log=log, returns=2, side_effect=True),
    ]
    options.setdefault("execution", NodeExecution(retries=0))
    options.setdefault("control_retries", ControlRetries(retries=1, delay=timedelta(0)))
    return build_plan_dag(dag_id, planner=planner, tools=scripted_registry(*tools), **options)


def replanning() -> ScriptedPlanner:
    """Node 2's tool fails for good: the first run replans it as node 2b, which completes."""
    return ScriptedPlanner(LINEAR, on_error=[("403", AROUND)])


class CountingPlanner:
    """A planner that logs each call to a file (tasks may run on copies of the planner object);
    ``crash_first`` makes its first call die as a worker lost mid-call would."""

    def __init__(self, folder: Path, plan: dict[str, Any], *, crash_first: bool = False) -> None:
        self.calls = folder / "planner_calls"
        self.plan_ = plan
        self.crash_first = crash_first

    def count(self) -> int:
        return len(self.calls.read_text().splitlines()) if self.calls.exists() else 0

    def plan(self, request: Any) -> Any:
        first = self.count() == 0
        with self.calls.open("a") as fh:
            fh.write("call\n")
        if first and self.crash_first:
            raise RuntimeError("worker lost while the planner was answering")
        return self.plan_


def lost_after(operator_class: type) -> type:
    """``operator_class`` whose first try does all its work, then is lost before reporting success."""

    class LostAfterWork(operator_class):  # type: ignore[misc, valid-type]
        def execute(self, context: Any) -> Any:
            try:
                return super().execute(context)
            finally:  # also replaces what the work raised to end the try (finalize's skip of replan)
                if context["ti"].try_number == 1:
                    raise RuntimeError(f"worker lost after {self.task_id} did its work")

    return LostAfterWork


def tries(dag_run: Any) -> dict[str, int]:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(TaskInstance).filter_by(dag_id=dag_run.dag_id, run_id=dag_run.run_id).all()
        return {
            ti.task_id if ti.map_index < 0 else f"{ti.task_id}[{ti.map_index}]": ti.try_number for ti in rows
        }


# ------------------------------------------------------------------------------------------ settings


def test_every_task_but_the_nodes_retries_promptly_by_default(tmp_path):
    from airflow_plan_provider.dag_factory import build_plan_dag

    log = CallLog(tmp_path)
    registry = scripted_registry(ScriptedTool("a", log=log), ScriptedTool("p", log=log, pool="api"))
    for dag, node_retries in (
        (build_plan_dag("retries_default", planner=None, tools=registry), 2),
        (
            build_plan_dag(
                "retries_set_nodes", planner=None, tools=registry, execution=NodeExecution(retries=4)
            ),
            4,
        ),
    ):
        node_tasks = {NODES_TASK, lane_task_id("api")}
        control = {t.task_id: (t.retries, t.retry_delay) for t in dag.tasks if t.task_id not in node_tasks}
        assert {t.task_id for t in dag.tasks} - set(control) == node_tasks
        assert set(control) == {PLAN_TASK, select_task_id(lane_task_id("api")), FINALIZE_TASK, REPLAN_TASK}
        assert set(control.values()) == {(3, timedelta(seconds=5))}, control
        assert {t.retries for t in dag.tasks if t.task_id in node_tasks} == {node_retries}


def test_control_retries_are_one_setting(tmp_path):
    from airflow_plan_provider import ControlRetries, build_plan_dag

    log = CallLog(tmp_path)
    registry = scripted_registry(ScriptedTool("a", log=log), ScriptedTool("p", log=log, pool="api"))
    dag = build_plan_dag(
        "retries_set",
        planner=None,
        tools=registry,
        control_retries=ControlRetries(retries=1, delay=timedelta(seconds=2)),
    )
    control = {
        t.task_id: (t.retries, t.retry_delay) for t in dag.tasks if not t.task_id.startswith(NODES_TASK)
    }
    assert control == dict.fromkeys(
        (PLAN_TASK, select_task_id(lane_task_id("api")), FINALIZE_TASK, REPLAN_TASK),
        (1, timedelta(seconds=2)),
    )
    with pytest.raises(ValueError, match=r"ControlRetries.retries must be an integer >= 0, got -1"):
        ControlRetries(retries=-1)
    with pytest.raises(ValueError, match=r"ControlRetries.retries must be an integer >= 0, got True"):
        ControlRetries(retries=True)
    with pytest.raises(ValueError, match=r"ControlRetries.delay must be a timedelta >= 0, got 5"):
        ControlRetries(delay=5)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ planning


def test_planning_lost_mid_call_asks_the_planner_again(tmp_path):
    log = CallLog(tmp_path / "calls")
    planner = CountingPlanner(tmp_path, LINEAR | {"nodes": LINEAR["nodes"][:1]}, crash_first=True)
    run = run_plan_dag(build("plan_lost_mid_call", planner, log), {"goal": "g"})
    assert str(run.state) == "success"
    assert planner.count() == 2 and tries(run)[PLAN_TASK] == 2
    assert xcom(run, FINALIZE_TASK)["status"] == "completed"
    assert log.count("a") == 1


class LookingStore:
    """A task's reply store that notes in a file each key it is asked for (a look is an API request)."""

    def __init__(self, store: Any, looks: Path) -> None:
        self.store, self.looks = store, looks

    def get(self, key: str) -> Any:
        with self.looks.open("a") as fh:
            fh.write(f"{key}\n")
        return self.store.get(key)

    def set(self, key: str, value: Any) -> None:
        self.store.set(key, value)


def test_planning_lost_after_validating_reuses_its_plan(tmp_path, monkeypatch):
    from airflow_plan_provider import dag_factory
    from airflow_plan_provider.operators.plan_task import ACCEPTED_REPLY_KEY, PlanOperator

    monkeypatch.setattr(dag_factory, "PlanOperator", lost_after(PlanOperator))
    looks, reply_store = tmp_path / "looks", PlanOperator._reply_store
    monkeypatch.setattr(
        PlanOperator, "_reply_store", lambda self, context: LookingStore(reply_store(self, context), looks)
    )
    log = CallLog(tmp_path / "calls")
    planner = CountingPlanner(tmp_path, LINEAR | {"nodes": LINEAR["nodes"][:1]})
    run = run_plan_dag(build("plan_lost_after", planner, log), {"goal": "g"})
    assert str(run.state) == "success"
    assert planner.count() == 1 and tries(run)[PLAN_TASK] == 2  # the retry reused the validated plan
    result = xcom(run, FINALIZE_TASK)
    assert result["status"] == "completed" and log.count("a") == 1
    created = [e for e in result["events"] if e["type"] == "plan.created"]
    assert len(created) == 1 and created[0]["data"]["attempts"] == 1
    kept = task_state(run, PLAN_TASK, ACCEPTED_REPLY_KEY)
    assert kept["reply"]["nodes"][0]["tool"] == "a" and kept["attempts"] == 1
    # only the retry looked for a kept reply: the first try had none to find
    assert looks.read_text().splitlines() == [ACCEPTED_REPLY_KEY]


def task_state(dag_run: Any, task_id: str, key: str) -> Any:
    """What the task instance kept under ``key`` for its later tries: in Airflow's task state store, or
    where Airflow has none (before 3.3), in its checkpoint in the artifact store."""
    from airflow_plan_provider import airflow_features, artifacts

    if not airflow_features.task_state_store():
        scope = json.dumps([dag_run.dag_id, dag_run.run_id, task_id, -1])
        return artifacts.TaskStateCheckpoints(scope).get(key)
    from airflow.models.task_state_store import TaskStateStoreModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = (
            session.query(TaskStateStoreModel)
            .filter_by(dag_id=dag_run.dag_id, run_id=dag_run.run_id, task_id=task_id, key=key)
            .one()
        )
        return json.loads(row.value)


# ------------------------------------------------------------------------------------------ finalize


def test_finalize_lost_after_its_work_recomputes_and_the_chain_completes(tmp_path, monkeypatch):
    from airflow_plan_provider import dag_factory
    from airflow_plan_provider.operators.finalize import FinalizePlanOperator

    monkeypatch.setattr(dag_factory, "FinalizePlanOperator", lost_after(FinalizePlanOperator))
    log = CallLog(tmp_path / "calls")
    runs = run_session(build("finalize_lost", replanning(), log), {"goal": "g"}).runs
    assert len(runs) == 2 and [str(r.state) for r in runs] == ["success", "success"]
    # the replan run accepted the conf the retried finalize prepared; no node ran twice
    assert [tries(r)[FINALIZE_TASK] for r in runs] == [2, 2]
    result = xcom(runs[-1], FINALIZE_TASK)
    assert (result["status"], result["reason"]) == ("completed", "goal_met")
    assert (log.count("a"), log.count("b"), log.count("b2")) == (1, 1, 1)
    assert sorted(e["tool"] for e in log.side_effects()) == ["a", "b2"]


# ------------------------------------------------------------------------------------------ replan


def replan_again(dag: Any, dag_run: Any) -> Any:
    """Run the ``replan`` task of ``dag_run`` once more (its next try), as the scheduler would after
    its worker was lost; returns the task instance."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from airflow.utils.state import TaskInstanceState

    from airflow_plan_provider.compat import run_task_in_process

    with create_session() as session:
        ti = (
            session.query(TaskInstance)
            .filter_by(dag_id=dag.dag_id, run_id=dag_run.run_id, task_id=REPLAN_TASK)
            .one()
        )
        ti.try_number += 1
        ti.state = TaskInstanceState.SCHEDULED
        session.commit()
        session.refresh(ti)
        session.expunge(ti)
    run_task_in_process(ti=ti, task=dag.task_dict[REPLAN_TASK], run_triggerer=True)
    with create_session() as session:
        return session.query(TaskInstance).filter_by(id=ti.id).one()


def run_ids(dag_id: str) -> list[str]:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        return sorted(r.run_id for r in session.query(DagRun).filter_by(dag_id=dag_id))


def set_run_state(dag_id: str, run_id: str, state: str) -> None:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        session.query(DagRun).filter_by(dag_id=dag_id, run_id=run_id).update({"state": state})


def test_replan_retry_reports_the_run_an_earlier_try_started(tmp_path):
    log = CallLog(tmp_path / "calls")
    dag = build("replan_retry_done", replanning(), log)
    root, child = run_session(dag, {"goal": "g"}).runs
    ti = replan_again(dag, root)
    assert str(ti.state) == "success"  # not DagRunAlreadyExists
    assert run_ids(dag.dag_id) == sorted([root.run_id, child.run_id])
    assert xcom(root, REPLAN_TASK) == xcom(child, FINALIZE_TASK)
    assert xcom(root, REPLAN_TASK, key="trigger_run_id") == child.run_id  # the task's link to the run


def test_replan_retry_waits_deferred_for_the_run_an_earlier_try_started(tmp_path):
    log = CallLog(tmp_path / "calls")
    dag = build("replan_retry_waits", replanning(), log)
    root, child = run_session(dag, {"goal": "g"}).runs
    set_run_state(dag.dag_id, child.run_id, "running")  # as if the child were still going
    finished: list[float] = []

    def finish_child() -> None:
        time.sleep(3)
        finished.append(time.time())
        set_run_state(dag.dag_id, child.run_id, "success")

    finisher = threading.Thread(target=finish_child)
    finisher.start()
    try:
        ti = replan_again(dag, root)
    finally:
        finisher.join()
    assert str(ti.state) == "success"
    assert ti.end_date.timestamp() >= finished[0]  # it reported only after the child finished
    assert run_ids(dag.dag_id) == sorted([root.run_id, child.run_id])
    assert xcom(root, REPLAN_TASK) == xcom(child, FINALIZE_TASK)


def test_replan_retry_fails_with_the_chain_when_the_existing_run_failed(tmp_path):
    log = CallLog(tmp_path / "calls")
    planner = ScriptedPlanner(LINEAR, on_error=[("403", AROUND_FAILING)])
    dag = build("replan_retry_failed", planner, log, budgets=Budgets(max_replans=1))
    root, child = run_session(dag, {"goal": "g"}).runs
    assert str(child.state) == "failed"
    ti = replan_again(dag, root)
    assert str(ti.state) == "failed"
    assert xcom(root, REPLAN_TASK)["status"] == "failed" == xcom(child, FINALIZE_TASK)["status"]
    assert run_ids(dag.dag_id) == sorted([root.run_id, child.run_id])


@pytest.mark.parametrize(
    "value",
    [
        None,
        "a plan",
        {"attempts": 1, "usage": [], "rejected": []},  # no reply
        {"reply": {}, "attempts": 0, "usage": [], "rejected": []},
        {"reply": {}, "attempts": True, "usage": [], "rejected": []},
        {"reply": {}, "attempts": 1, "usage": [{"prompt_tokens": "9"}], "rejected": []},
        {"reply": {}, "attempts": 1, "usage": "lots", "rejected": []},
        {"reply": {}, "attempts": 1, "usage": [], "rejected": [{"problem": 1}]},
    ],
)
def test_a_kept_reply_of_another_shape_is_not_reused(value):
    from airflow_plan_provider.operators.plan_task import _kept_reply

    assert _kept_reply(value) is None


def test_a_kept_reply_is_reused_as_stored():
    from airflow_plan_provider.operators.plan_task import _kept_reply

    kept = {"reply": LINEAR, "attempts": 2, "usage": [{"prompt_tokens": 9}], "rejected": [[{"code": "x"}]]}
    assert _kept_reply(kept) == kept
