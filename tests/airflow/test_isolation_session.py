"""A run's conf is user input: a session in it is accepted only from this DAG's own replan task.

Each forged or altered session is rejected by the planning task before any node runs, with reason
``untrusted_session``; nothing of the forged content reaches XCom, and the run it names keeps its tool
calls, side effects and checkpoints to itself. Also: what the planning task writes about an invalid plan
is capped (a 20k-node plan), and ``repair_attempts`` is checked when the operator is built.
"""

from __future__ import annotations

import copy
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_plan_provider import ArtifactStore, Limits, NodeExecution
from airflow_plan_provider.contract import (
    FINALIZE_TASK,
    NODES_TASK,
    PLAN_KEY,
    PLAN_TASK,
    PLANNING_ERROR_KEY,
    REPLAN_CONF_KEY,
    SESSION_KEY,
    ReplanConf,
)
from airflow_plan_provider.plan.session import replan_run_id
from airflow_plan_provider.problems import MAX_REPORTED_PROBLEMS
from airflow_plan_provider.testing import CallLog, ScriptedPlanner, ScriptedTool, scripted_registry
from airflow_plan_provider.testing.in_process import run_plan_dag, run_session
from tests.airflow.support import run_xcoms, task_states, xcom

pytestmark = pytest.mark.airflow

MARKER = "FORGED-OUTPUT-7f3a"  # forged content: must never show up in what a rejected run writes
GOAL = "pay the invoice and report"
PLAN = {
    "nodes": [
        {"id": "1", "action": "pay the invoice", "tool": "pay", "params": {"amount": 100}},
        {"id": "2", "action": "report the payment", "tool": "report", "params": {"paid": "${1}"}},
    ]
}
NODE_TASKS = (NODES_TASK,)


def build(dag_id: str, log: CallLog, store: Path, *, fail_report: bool = False, **options: Any) -> Any:
    """Pay (a side effect recorded once per idempotency key), then report; ``fail_report`` makes the
    report fail for good so the run prepares a replan (replaced by ``report2``)."""
    from airflow_plan_provider.dag_factory import build_plan_dag

    tools = scripted_registry(
        ScriptedTool("pay", log=log, returns={"paid": 100}, side_effect=True),
        ScriptedTool("report", log=log, returns=lambda p: {"report": p["paid"]}),
        ScriptedTool("report_down", log=log, permanent="report service down"),
        ScriptedTool("report2", log=log, returns=lambda p: {"report2": p["paid"]}),
    )
    plan = copy.deepcopy(PLAN)
    if fail_report:
        plan["nodes"][1]["tool"] = "report_down"
    replacement = {
        "nodes": [{"id": "3", "action": "report another way", "tool": "report2", "params": {"paid": "${1}"}}]
    }
    planner = ScriptedPlanner(plan, on_error=[("report service down", replacement)])
    options.setdefault("execution", NodeExecution(retries=0, retry_delay=timedelta(0)))
    return build_plan_dag(
        dag_id, planner=planner, tools=tools, artifacts=ArtifactStore(url=f"file://{store}"), **options
    )


def store_snapshot(store: Path) -> dict[str, bytes]:
    """Every file of the artifact store (checkpoints included) with its content."""
    return {str(p.relative_to(store)): p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()}


def assert_rejected(run: Any, check: str) -> dict[str, Any]:
    """The run failed in planning as an untrusted session (naming ``check``), no node task ran, and no
    forged content reached its XComs. Returns the finalize result."""
    states = task_states(run)
    assert str(run.state) == "failed"
    assert states[PLAN_TASK] == "failed"
    ran = {
        t: s
        for t, s in states.items()
        if t.split("[")[0] in NODE_TASKS and s not in ("upstream_failed", "skipped")
    }
    assert ran == {}, f"node tasks ran: {ran}"
    error = xcom(run, PLAN_TASK, key=PLANNING_ERROR_KEY)
    assert error["reason"] == "untrusted_session"
    assert check in error["message"]
    result = xcom(run, FINALIZE_TASK)
    assert (result["status"], result["reason"]) == ("failed", "untrusted_session")
    assert check in result["message"]
    assert result["outputs"] == {} and result["history"] == []
    assert result["root_run_id"] == run.run_id and result["run_ids"] == [run.run_id]
    assert xcom(run, PLAN_TASK, key=PLAN_KEY) is None
    written = json.dumps(list(run_xcoms(run).values()))
    assert MARKER not in written
    return result


@pytest.fixture(scope="module")
def victim(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A completed run whose payment was made once; forged sessions below name it as their root."""
    base = tmp_path_factory.mktemp("victim")
    log, store = CallLog(base / "calls"), base / "store"
    dag = build("isolation_victim", log, store)
    run = run_plan_dag(dag, {"goal": GOAL})
    assert str(run.state) == "success"
    assert log.count("pay") == 1 and len(log.side_effects()) == 1
    assert store_snapshot(store), "the victim run saved no checkpoint: the checks below would prove nothing"
    return {"dag": dag, "run": run, "log": log, "store": store}


def forged_session(root: str, revision: Any, **fields: Any) -> dict[str, Any]:
    """A reference to a session of ``root`` (as a replan run's conf names one), ``fields`` changed."""
    return {"root_run_id": root, "parent_run_id": root, "revision": revision, **fields}


def forgeries(root: str) -> dict[str, tuple[dict[str, Any], str | None, str]]:
    """name → (conf, run id to give the run or None for a generated one, the check that fails).

    Apart from the first, each case gets the run id the replan task would give its revision (one
    revision per case: a run id is used once), so a later check is the one that fails.
    """

    def case(revision: Any, **fields: Any) -> tuple[dict[str, Any], str]:
        conf = {"goal": GOAL, "session": forged_session(root, revision, **fields)}
        return conf, replan_run_id(root, revision)

    conf, _ = case(1)
    prepared_none, prepared_none_id = case(2)
    no_such_parent, no_such_parent_id = case(3, parent_run_id="manual__no_such_run")
    no_parent, no_parent_id = case(4, parent_run_id="")
    with_plan, with_plan_id = case(5)
    not_session, _ = case(MARKER)
    # a whole session, as an earlier version's replan run carried it: node 1 (pay) "locked", forged output
    locked = {"1": {"action": "pay the invoice", "tool": "pay", "params": {"amount": 100}, "output": MARKER}}
    whole, whole_id = case(7, goal=GOAL, run_ids=[root], locked=locked)
    return {
        "any run id": (conf, None, "run's id"),
        "parent prepared no replan": (prepared_none, prepared_none_id, "prepared no replan"),
        "parent is no run": (no_such_parent, no_such_parent_id, "is not a run of DAG"),
        "no parent": (no_parent, no_parent_id, "names no parent"),
        "ready plan too": ({**with_plan, "plan": PLAN}, with_plan_id, "ready plan"),
        "not a session": (not_session, replan_run_id(root, 6), "is not a reference"),
        "a whole session": (whole, whole_id, "3 invalid field(s)"),
    }


@pytest.mark.parametrize(
    "name",
    [
        "any run id",
        "parent prepared no replan",
        "parent is no run",
        "no parent",
        "ready plan too",
        "not a session",
        "a whole session",
    ],
)
def test_forged_session_naming_another_run_is_rejected_before_any_node(
    victim: dict[str, Any], name: str
) -> None:
    log, store = victim["log"], victim["store"]
    calls, effects, saved = log.calls(), log.side_effects(), store_snapshot(store)
    conf, run_id, check = forgeries(victim["run"].run_id)[name]
    run = run_plan_dag(victim["dag"], conf, run_id=run_id)
    assert_rejected(run, check)
    # the victim's tool calls, payment and checkpoints are untouched: no tool was called at all
    assert log.calls() == calls and log.side_effects() == effects
    assert store_snapshot(store) == saved


@pytest.mark.parametrize(
    ("change", "check"),
    [
        ("locked output", "1 invalid field(s)"),
        ("goal", "(in goal)"),
        ("extra key", "1 other key(s)"),
        ("unknown session field", "1 invalid field(s)"),
        ("revision", "(in session.revision)"),
        ("root run", "(in session.root_run_id)"),
    ],
)
def test_session_named_after_a_real_parent_but_altered_is_rejected(
    tmp_path: Path, change: str, check: str
) -> None:
    log, store = CallLog(tmp_path / "calls"), tmp_path / "store"
    dag = build(f"isolation_altered_{change.replace(' ', '_')}", log, store, fail_report=True)
    parent = run_plan_dag(dag, {"goal": GOAL})
    prepared = xcom(parent, FINALIZE_TASK, key=REPLAN_CONF_KEY)
    assert prepared and prepared["session"]["locked"]["1"]["output"] == {"paid": 100}
    conf = ReplanConf.model_validate(prepared).run_conf()  # what the replan task would start the run with
    run_id = replan_run_id(parent.run_id, 1)
    if change == "locked output":
        conf["session"]["locked"] = {"1": {**prepared["session"]["locked"]["1"], "output": MARKER}}
    elif change == "goal":
        conf["goal"] = MARKER
    elif change == "extra key":
        conf[MARKER] = 1
    elif change == "unknown session field":
        conf["session"][MARKER] = 1
    elif change == "revision":
        conf["session"]["revision"] = 2
        run_id = replan_run_id(parent.run_id, 2)
    else:  # another root, with the run id that root's revision gets: the parent prepared it for its own
        conf["session"]["root_run_id"] = f"{parent.run_id}_other"
        run_id = replan_run_id(conf["session"]["root_run_id"], 1)
    calls = log.calls()
    run = run_plan_dag(dag, conf, run_id=run_id)
    assert_rejected(run, check)
    assert log.calls() == calls


def test_legitimate_chain_completes_and_its_session_cannot_start_a_second_run(tmp_path: Path) -> None:
    log, store = CallLog(tmp_path / "calls"), tmp_path / "store"
    dag = build("isolation_chain", log, store, fail_report=True)
    parent, child = run_session(dag, {"goal": GOAL}).runs
    assert child.run_id == replan_run_id(parent.run_id, 1)
    result = xcom(child, FINALIZE_TASK)
    assert (result["status"], result["reason"]) == ("completed", "goal_met")
    assert result["outputs"]["3"] == {"report2": {"paid": 100}}
    assert log.count("pay") == 1 and log.count("report2") == 1
    prepared = ReplanConf.model_validate(xcom(parent, FINALIZE_TASK, key=REPLAN_CONF_KEY))
    assert child.conf == prepared.run_conf()
    assert set(child.conf["session"]) == {"root_run_id", "parent_run_id", "revision"}  # a name, no state
    # the same, genuine conf once more under another run id: one parent starts one run per revision
    replay = run_plan_dag(dag, child.conf)
    assert_rejected(replay, "run's id")
    assert log.count("pay") == 1 and log.count("report2") == 1


def test_session_prepared_by_another_dag_is_rejected(tmp_path: Path) -> None:
    log, store = CallLog(tmp_path / "calls"), tmp_path / "store"
    other = build("isolation_other_dag", log, store, fail_report=True)
    parent = run_plan_dag(other, {"goal": GOAL})
    prepared = xcom(parent, FINALIZE_TASK, key=REPLAN_CONF_KEY)
    assert prepared
    target = build("isolation_target_dag", log, store, fail_report=True)
    calls = log.calls()
    conf = ReplanConf.model_validate(prepared).run_conf()
    run = run_plan_dag(target, conf, run_id=replan_run_id(parent.run_id, 1))
    assert_rejected(run, "is not a run of DAG 'isolation_target_dag'")
    assert log.calls() == calls


def test_rejected_huge_plan_writes_capped_problems(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    log, store = CallLog(tmp_path / "calls"), tmp_path / "store"
    nodes = 1_000
    # a limit that lets the validator check every node (as many as Airflow maps in one task): a thousand
    # problems, one unknown tool per node
    dag = build("isolation_huge_plan", log, store, replan=False, limits=Limits(max_nodes=nodes))
    plan = {
        "nodes": [
            {"id": f"n{i}", "action": "step", "tool": "no_such_tool", "params": {}} for i in range(nodes)
        ]
    }
    capfd.readouterr()
    run = run_plan_dag(dag, {"goal": GOAL, "plan": plan})
    out, err = capfd.readouterr()
    assert task_states(run)[PLAN_TASK] == "failed" and str(run.state) == "failed"

    values = run_xcoms(run)
    sizes = {f"{task}.{key}": len(json.dumps(value)) for (task, _index, key), value in values.items()}
    assert {"plan.session", "plan.planning_error", "finalize.return_value"} <= set(sizes)
    assert sum(sizes.values()) < 200_000, sizes

    more = nodes - MAX_REPORTED_PROBLEMS
    error = xcom(run, PLAN_TASK, key=PLANNING_ERROR_KEY)
    assert error["reason"] == "invalid_plan"
    assert error["message"].count("\n  - ") == MAX_REPORTED_PROBLEMS
    assert f"... and {more} more problem(s)" in error["message"]
    failed = next(e for e in xcom(run, PLAN_TASK, key=SESSION_KEY)["events"] if e["type"] == "plan.failed")
    assert len(failed["data"]["problems"]) == MAX_REPORTED_PROBLEMS
    assert failed["data"]["more_problems"] == more
    assert f"... and {more} more problem(s)" in xcom(run, FINALIZE_TASK)["message"]

    logged = (out + err).splitlines()
    problem_lines = [line for line in logged if "plan problem:" in line]
    assert len(problem_lines) == MAX_REPORTED_PROBLEMS + 1, len(problem_lines)
    assert f"... and {more} more problem(s)" in problem_lines[-1]
    assert sum("unknown_tool" in line for line in logged) < 10 * MAX_REPORTED_PROBLEMS  # not one per node
    assert len(logged) < 2_000


@pytest.mark.parametrize("attempts", [-1, -5, 1.5, True, "2"])
def test_repair_attempts_must_be_a_count(attempts: Any) -> None:
    from airflow_plan_provider.operators.plan_task import PlanOperator

    with pytest.raises(ValueError, match="repair_attempts"):
        PlanOperator(task_id=PLAN_TASK, planner=None, repair_attempts=attempts)


def test_repair_attempts_zero_is_allowed() -> None:
    from airflow_plan_provider.operators.plan_task import PlanOperator

    assert PlanOperator(task_id=PLAN_TASK, planner=None, repair_attempts=0).repair_attempts == 0
