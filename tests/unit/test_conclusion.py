"""How a run ends: every branch of conclude, and the transitions that close a run."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_plan_provider.plan.budgets import Budgets, Usage
from airflow_plan_provider.plan.conclusion import (
    Conclusion,
    conclude,
    contained_failures,
    fail_session,
    finish_session,
    prepare_replan,
)
from airflow_plan_provider.plan.decisions import NodeStatus
from airflow_plan_provider.plan.result import NodeRecord
from airflow_plan_provider.plan.session import SessionState, replan_conf, start_session
from airflow_plan_provider.plan.validate import validate_plan

S, F, K = NodeStatus.SUCCESS, NodeStatus.FAILED, NodeStatus.SKIPPED

# a -> b (hard), a -> c (optional), d alone
PLAN = validate_plan(
    {
        "nodes": [{"id": n, "action": n, "tool": "t"} for n in "abcd"],
        "edges": [{"from": "a", "to": "b"}, {"from": "a", "to": "c", "optional": True}],
    }
)


def records(**statuses: NodeStatus | tuple[NodeStatus, dict[str, Any]]) -> dict[str, NodeRecord]:
    out = {}
    for node_id, value in statuses.items():
        status, fields = value if isinstance(value, tuple) else (value, {})
        out[node_id] = NodeRecord(node_id=node_id, tool="t", status=status, **fields)
    return out


ALL_OK = records(a=S, b=S, c=S, d=S)
A_FAILED = records(a=(F, {"error": "boom"}), b=K, c=S, d=S)
D_MOOT = records(a=S, b=S, c=S, d=(S, {"replan_requested": True, "error": "the rest is moot"}))
A_MOOT = records(a=(S, {"replan_requested": True, "error": "moot"}), b=K, c=K, d=S)


def session(**fields: Any) -> SessionState:
    return SessionState(goal="g", root_run_id="r", run_ids=["r"], **fields)


def test_every_node_succeeded() -> None:
    assert conclude(PLAN, ALL_OK, session()) == Conclusion(
        kind="done", reason="goal_met", message="every node succeeded"
    )


def test_a_failed_node_whose_children_went_on_without_it_is_contained() -> None:
    # d failed (a leaf: never contained); a failed but its only child ran through an optional edge
    plan = validate_plan(
        {
            "nodes": [{"id": n, "action": n, "tool": "t"} for n in "ac"],
            "edges": [{"from": "a", "to": "c", "optional": True}],
        }
    )
    contained = records(a=(F, {"error": "x"}), c=S)
    assert contained_failures(plan, contained, ["a"]) == ["a"]
    done = conclude(plan, contained, session())
    assert (done.kind, done.reason, done.failed) == ("done", "goal_met", [])
    assert "failed optional input(s) a" in done.message
    assert contained_failures(PLAN, records(a=S, b=S, c=S, d=F), ["d"]) == []


def test_a_node_skipped_for_the_step_budget_gives_up_at_once() -> None:
    starved = records(a=S, b=S, c=S, d=(K, {"budget_exhausted": True}))
    ending = conclude(PLAN, starved, session(budgets=Budgets(max_steps=3)))
    assert (ending.kind, ending.reason) == ("give_up", "step_budget")
    assert ending.message == "step budget of 3 spent; not executed: d"


def test_a_failure_is_replanned_while_budgets_last() -> None:
    ending = conclude(PLAN, A_FAILED, session())
    assert ending == Conclusion(
        kind="replan", reason="node_failed", message="node a failed: boom", failed=["a"]
    )


def test_a_replan_request_is_replanned_while_budgets_last() -> None:
    ending = conclude(PLAN, D_MOOT, session())
    assert (ending.kind, ending.reason, ending.replan_requested) == ("replan", "replan_requested", ["d"])
    assert ending.message == "node d requested a replan: the rest is moot"


@pytest.mark.parametrize(
    ("source", "words"), [("conf", "ready plan given in the run's conf"), ("dag", "frozen")]
)
def test_a_ready_or_frozen_plan_is_never_replanned(source: str, words: str) -> None:
    failed = conclude(PLAN, A_FAILED, session(plan_source=source))
    assert (failed.kind, failed.reason, failed.failed) == ("give_up", "node_failed", ["a"])
    assert words in failed.message
    moot = conclude(PLAN, A_MOOT, session(plan_source=source))
    assert (moot.kind, moot.reason) == ("give_up", "replan_unavailable")


def test_a_request_nothing_depends_on_ends_the_run_done_when_no_replan_can_answer() -> None:
    remedies = {  # each report says what a reader can do about the request
        "dag": "drop or change these nodes in its PLAN, or freeze a newer session",
        "conf": "give a plan without these nodes",
        "planner": "trigger with max_replans of 1 or more",
    }
    for source, remedy in remedies.items():
        state = session(plan_source=source, budgets=Budgets(max_replans=0))
        ending = conclude(PLAN, D_MOOT, state)
        assert (ending.kind, ending.reason, ending.replan_requested) == ("done", "goal_met", ["d"])
        assert "node d requested a replan" in ending.message and remedy in ending.message


def test_replanning_switched_off_gives_up() -> None:
    off = session(budgets=Budgets(max_replans=0))
    assert conclude(PLAN, A_FAILED, off).reason == "node_failed"
    assert conclude(PLAN, A_MOOT, off).reason == "replan_budget"


def test_spent_budgets_give_up() -> None:
    replans = conclude(PLAN, A_FAILED, session(budgets=Budgets(max_replans=2), usage=Usage(replans=2)))
    assert (replans.kind, replans.reason) == ("give_up", "replan_budget")
    assert replans.message.startswith("2 replan(s) used of 2; node a failed")
    steps = conclude(PLAN, A_FAILED, session(budgets=Budgets(max_steps=4), usage=Usage(steps=4)))
    assert (steps.kind, steps.reason) == ("give_up", "step_budget")


def test_finishing_a_done_run_completes_the_session() -> None:
    state = session()
    finished, result = finish_session(state, conclude(PLAN, ALL_OK, state), {"a": 1})
    assert (result.status, result.reason, result.outputs) == ("completed", "goal_met", {"a": 1})
    assert [e.type for e in finished.events] == ["session.finished"]
    assert result.events == finished.events and state.events == []


def test_giving_up_on_a_budget_names_it() -> None:
    state = session(budgets=Budgets(max_replans=1), usage=Usage(replans=1, steps=3))
    finished, result = finish_session(state, conclude(PLAN, A_FAILED, state))
    assert (result.status, result.reason) == ("failed", "replan_budget")
    exhausted, done = finished.events
    assert (exhausted.type, exhausted.data["budget"], exhausted.data["used"], exhausted.data["limit"]) == (
        "budget.exhausted",
        "replans",
        1,
        1,
    )
    assert done.type == "session.finished" and done.data == {"status": "failed", "reason": "replan_budget"}


def test_a_due_replan_that_cannot_start_fails_the_session_as_node_failed() -> None:
    state = session()
    _, result = finish_session(state, conclude(PLAN, D_MOOT, state))
    assert (result.status, result.reason) == ("failed", "node_failed")


def test_failing_a_session_without_a_plan() -> None:
    finished, result = fail_session(session(), "no_plan", "planning did not finish")
    assert (result.status, result.reason, result.message) == ("failed", "no_plan", "planning did not finish")
    assert [e.type for e in finished.events] == ["session.finished"]


def test_preparing_a_replan_reports_this_run_and_hands_the_next_revision_its_session() -> None:
    state = start_session(goal="g", dag_id="d", run_id="r")
    conclusion = conclude(PLAN, A_FAILED, state)
    result, following = prepare_replan(state, conclusion, A_FAILED, {"c": 3})
    assert (result.status, result.reason, result.message) == (
        "replanned",
        "node_failed",
        "replanning: node a failed: boom",
    )
    assert result.replan is not None
    assert (result.replan.revision, result.replan.run_id, result.replan.trigger_node) == (
        1,
        "r__replan_1",
        "a",
    )
    assert result.replan.failed == {"a": "boom"} and result.outputs == {"c": 3}
    [requested] = result.events
    assert (requested.type, requested.node_id, requested.run_id) == ("replan.requested", "a", "r")
    assert requested.data["next_run_id"] == "r__replan_1"
    assert following.revision == 1 and following.parent_run_id == "r" and following.usage.replans == 1
    assert (following.failed, following.replan_requested, following.last_error) == (
        ["a"],
        [],
        "node a failed: boom",
    )
    assert following.events == result.events
    assert state.revision == 0 and state.events == []  # the given state is unchanged
    assert replan_conf(following) == {"goal": "g", "session": following.model_dump(mode="json")}


def test_a_replan_is_prepared_only_when_one_is_due() -> None:
    with pytest.raises(ValueError, match="only when the run concludes 'replan'"):
        prepare_replan(session(), conclude(PLAN, ALL_OK, session()), ALL_OK)
