"""Local replanning across runs: locked nodes reused, plan diffs, budgets across the chain (dag.test)."""

from __future__ import annotations

from datetime import timedelta
from itertools import pairwise

import pytest

from airflow_plan_provider import Budgets, NodeExecution
from airflow_plan_provider.contract import FINALIZE_TASK, NODES_TASK, PLAN_TASK, REPLAN_TASK
from airflow_plan_provider.testing import CallLog, ScriptedPlanner, ScriptedTool, scripted_registry
from airflow_plan_provider.testing.in_process import run_session
from harness.seed import seed_plan, seed_revision, seed_tools
from tests.airflow.support import task_states, xcom

pytestmark = pytest.mark.airflow


def build(dag_id, planner, tools, **options):
    from airflow_plan_provider.dag_factory import build_plan_dag

    options.setdefault("execution", NodeExecution(retries=0, retry_delay=timedelta(0)))
    return build_plan_dag(dag_id, planner=planner, tools=scripted_registry(*tools), **options)


def linear(*steps: tuple[str, str], goal: str = "linear goal") -> dict:
    nodes = [{"id": i, "action": f"step {i}", "tool": tool, "params": {}} for i, tool in steps]
    edges = [{"from": a[0], "to": b[0]} for a, b in pairwise(steps)]
    return {"goal": goal, "nodes": nodes, "edges": edges}


def test_seed_story_replans_node_5_and_reuses_the_rest(tmp_path):
    log = CallLog(tmp_path)
    tools = seed_tools(log, query_deploys={"replan": "no deploys yesterday"})
    revised = seed_revision()
    planner = ScriptedPlanner(seed_plan(), on_error=[("no deploys", revised)])
    session = run_session(build("seed_replan", planner, tools), {"goal": "find why the payment API got slow"})
    runs = session.runs

    assert len(runs) == 2
    first = task_states(runs[0])
    assert first[f"{NODES_TASK}[4]"] == first[f"{NODES_TASK}[5]"] == "skipped"  # moot after node 3's result
    assert str(runs[1].state) == "success"
    # every tool ran exactly once across the chain: 1-4 reused, not re-executed
    assert {t.name: log.count(t.name) for t in tools} == dict.fromkeys((t.name for t in tools), 1)
    result = session.result
    assert (result.status, result.reason) == ("completed", "goal_met")
    assert result.revisions[0].diff.model_dump() == {"removed": [], "added": [], "revised": ["5"]}
    assert "no deploys" in result.revisions[0].reason
    assert result.outputs["6"] == {"report": {"inputs": ["health", "latency"]}}
    reused = sorted(r.node_id for r in result.history if r.reused)
    assert reused == ["1", "2", "3", "4"]
    assert [r.revision for r in result.history].count(1) == 6
    assert (result.usage.replans, result.usage.steps) == (1, 6)
    assert result.run_ids == session.run_ids == [r.run_id for r in runs]
    assert any(e.type == "plan.diff" for e in result.events)
    # the root run's replan task ran, found revision 1 finished, and reports the whole session
    assert task_states(runs[0])[REPLAN_TASK] == "success"
    assert xcom(runs[0], REPLAN_TASK) == xcom(runs[1], FINALIZE_TASK) == result.model_dump(mode="json")


def test_linear_success_needs_no_replan(tmp_path):
    log = CallLog(tmp_path)
    tools = [ScriptedTool(t, log=log, returns=t) for t in ("a", "b", "c")]
    session = run_session(
        build("linear_ok", ScriptedPlanner(linear(("1", "a"), ("2", "b"), ("3", "c"))), tools)
    )
    assert [run.state for run in session.runs] == ["success"]
    assert session.runs[0].node_states == dict.fromkeys("123", "success")
    assert session.result.status == "completed" and session.result.revisions == []
    assert task_states(session.runs[0])[REPLAN_TASK] == "skipped"


def test_mid_plan_failure_replans_once_and_completes(tmp_path):
    log = CallLog(tmp_path)
    tools = [
        ScriptedTool("a", log=log, returns=1),
        ScriptedTool("b", log=log, permanent="403 forbidden"),
        ScriptedTool("b2", log=log, returns=2),
        ScriptedTool("c", log=log, returns=3),
    ]
    around = {
        "nodes": [
            {"id": "2b", "action": "step 2 another way", "tool": "b2", "params": {}},
            {"id": "3", "action": "step 3", "tool": "c", "params": {"x": "${2b}"}},
        ],
        "edges": [{"from": "1", "to": "2b"}],
    }
    planner = ScriptedPlanner(linear(("1", "a"), ("2", "b"), ("3", "c")), on_error=[("403", around)])
    session = run_session(build("linear_replan", planner, tools), {"goal": "g"})
    assert [run.state for run in session.runs] == ["success", "success"]
    result = session.result
    assert result.status == "completed"
    assert result.revisions[0].diff.model_dump() == {"removed": ["2"], "added": ["2b"], "revised": ["3"]}
    assert (log.count("a"), log.count("b"), log.count("b2"), log.count("c")) == (1, 1, 1, 1)


def test_two_replans_then_complete(tmp_path):
    log = CallLog(tmp_path)
    tools = [
        ScriptedTool("a", log=log, returns=1),
        ScriptedTool("b", log=log, permanent="broken b"),
        ScriptedTool("b2", log=log, permanent="broken b2"),
        ScriptedTool("b3", log=log, returns=3),
    ]
    planner = ScriptedPlanner(
        linear(("1", "a"), ("2", "b")),
        on_error=[("broken b2", linear(("3", "b3"))), ("broken b", linear(("2x", "b2")))],
    )
    session = run_session(build("two_replans", planner, tools), {"goal": "g"})
    assert [run.revision for run in session.runs] == [0, 1, 2]
    result = session.result
    assert (result.status, result.usage.replans) == ("completed", 2)
    assert [r.diff.added for r in result.revisions] == [["2x"], ["3"]]
    assert [run.node_states for run in session.runs] == [
        {"1": "success", "2": "failed"},
        {"1": "success", "2x": "failed"},
        {"1": "success", "3": "success"},
    ]
    assert log.count("a") == 1


def test_replans_exhausted(tmp_path):
    log = CallLog(tmp_path)
    tools = [ScriptedTool("a", log=log, returns=1), ScriptedTool("b", log=log, permanent="still broken")]
    planner = ScriptedPlanner(
        linear(("1", "a"), ("2", "b")),
        on_error=[("still broken", lambda req: linear((f"r{req.revision}", "b")))],
    )
    session = run_session(build("replans_out", planner, tools, budgets=Budgets(max_replans=2)), {"goal": "g"})
    assert (session.result.status, session.result.reason) == ("failed", "replan_budget")
    # every run of a failed session fails: the last by its finalize, the others by their replan task
    assert [run.state for run in session.runs] == ["failed", "failed", "failed"]
    assert log.count("a") == 1 and log.count("b") == 3


def test_step_budget_exhausted(tmp_path):
    log = CallLog(tmp_path)
    tools = [ScriptedTool(t, log=log, returns=t) for t in ("a", "b", "c")]
    planner = ScriptedPlanner(linear(("1", "a"), ("2", "b"), ("3", "c")))
    session = run_session(build("steps_out", planner, tools), {"goal": "g", "max_steps": 2})
    assert (session.result.status, session.result.reason) == ("failed", "step_budget")
    assert log.count("c") == 0 and log.count() == 2
    assert [run.state for run in session.runs] == ["failed"]


def test_step_budget_holds_across_replans(tmp_path):
    log = CallLog(tmp_path)
    tools = [
        ScriptedTool("a", log=log, returns=1),
        ScriptedTool("b", log=log, permanent="broken"),
        ScriptedTool("c", log=log, returns=3),
    ]
    planner = ScriptedPlanner(
        linear(("1", "a"), ("2", "b")), on_error=[("broken", linear(("3", "c"), ("4", "c")))]
    )
    result = run_session(build("steps_chain", planner, tools), {"goal": "g", "max_steps": 3}).result
    assert (result.status, result.reason) == ("failed", "step_budget")
    assert log.count("c") == 1  # 2 steps in revision 0, 1 left for revision 1


def test_no_plan(tmp_path):
    session = run_session(
        build("no_plan", ScriptedPlanner(None), [ScriptedTool("a", log=CallLog(tmp_path))]), {"goal": "g"}
    )
    assert (session.result.status, session.result.reason) == ("failed", "no_plan")
    assert task_states(session.runs[0])[PLAN_TASK] == "failed"
    assert session.runs[0].node_states == {}


def test_replan_that_changes_a_locked_node_is_rejected_and_asked_again(tmp_path):
    log = CallLog(tmp_path)
    tools = [
        ScriptedTool("a", log=log, returns=1),
        ScriptedTool("b", log=log, permanent="broken"),
        ScriptedTool("c", log=log, returns=3),
    ]

    def replacement(request):
        if not request.problems:  # first answer rewrites locked node 1
            return {
                "nodes": [
                    {"id": "1", "action": "step 1", "tool": "c", "params": {}},
                    {"id": "9", "action": "fix", "tool": "c", "params": {}},
                ]
            }
        assert request.problems[0].code == "locked_changed"
        return {
            "nodes": [{"id": "9", "action": "fix", "tool": "c", "params": {}}],
            "edges": [{"from": "1", "to": "9"}],
        }

    planner = ScriptedPlanner(linear(("1", "a"), ("2", "b")), on_error=[("broken", replacement)])
    result = run_session(build("locked_guard", planner, tools), {"goal": "g"}).result
    assert result.status == "completed"
    diff_event = next(e for e in result.events if e.type == "plan.diff")
    assert diff_event.data["attempts"] == 2
    assert diff_event.data["rejected"][0][0]["code"] == "locked_changed"
    assert log.count("a") == 1
