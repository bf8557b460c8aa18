"""The session state machine, one transition at a time; typed node records."""

from __future__ import annotations

import pydantic
import pytest

from airflow_plan_provider.plan.approval import Approval
from airflow_plan_provider.plan.budgets import Budgets, Usage
from airflow_plan_provider.plan.decisions import NodeStatus
from airflow_plan_provider.plan.events import EventSource, make_event
from airflow_plan_provider.plan.result import ArtifactRef, NodeRecord
from airflow_plan_provider.plan.session import (
    RunContext,
    SessionState,
    continue_session,
    record_approval,
    record_approval_not_needed,
    record_node_outcomes,
    record_plan,
    record_planning_failure,
    replan_run_id,
    run_context,
    start_session,
    trigger_node,
)
from airflow_plan_provider.plan.validate import validate_plan

PLAN = validate_plan(
    {
        "goal": "g",
        "nodes": [
            {"id": "a", "action": "read", "tool": "read", "params": {"n": 1}},
            {"id": "b", "action": "sum", "tool": "sum", "params": {"x": "${a}"}},
            {"id": "c", "action": "report", "tool": "report", "params": {"x": "${b}"}},
        ],
    }
)
REPLANNED = validate_plan(
    {
        "goal": "g",
        "nodes": [
            {"id": "a", "action": "read", "tool": "read", "params": {"n": 1}},
            {"id": "d", "action": "other sum", "tool": "sum2", "params": {"x": "${a}"}},
        ],
    }
)
SHA = "0" * 64


def types(state: SessionState) -> list[str]:
    return [e.type for e in state.events]


def test_a_session_starts_from_a_goal_and_budgets() -> None:
    state = start_session(goal="g", budgets=Budgets(max_steps=5), dag_id="d", run_id="r")
    assert (state.goal, state.root_run_id, state.run_ids, state.dag_id) == ("g", "r", ["r"], "d")
    assert state.budgets.max_steps == 5 and state.revision == 0 and state.current_plan is None
    assert start_session(goal="g", run_id="r").budgets == Budgets()


def test_a_replan_session_continues_in_its_run() -> None:
    prepared = SessionState(goal="g", root_run_id="r", run_ids=["r"], revision=1, parent_run_id="r")
    state = continue_session(prepared, dag_id="d", run_id="r__replan_1")
    assert state.run_ids == ["r", "r__replan_1"] and state.dag_id == "d" and state.revision == 1
    assert state.source == EventSource("d", "r__replan_1", "r", 1)
    assert prepared.run_ids == ["r"]
    assert replan_run_id("r", 1) == "r__replan_1"


def test_recording_the_first_plan() -> None:
    state = start_session(goal="g", dag_id="d", run_id="r")
    usage = [{"prompt_tokens": 10, "completion_tokens": 2}, {"prompt_tokens": 5, "completion_tokens": 1}]
    planned = record_plan(
        state, PLAN, source="conf", lanes={"a": "api"}, usage=usage, attempts=2, details={"x": 1}
    )
    assert types(planned) == ["planner.usage", "planner.usage", "plan.created", "plan.validated"]
    assert (planned.usage.prompt_tokens, planned.usage.completion_tokens) == (15, 3)
    created, validated = planned.events[2:]
    assert created.data == {
        "nodes": 3,
        "layers": [["a"], ["b"], ["c"]],
        "attempts": 2,
        "source": "conf",
        "x": 1,
    }
    assert validated.data["execute"] == ["a", "b", "c"] and validated.data["reuse"] == []
    assert planned.plan_source == "conf" and planned.lanes == {"a": "api"}
    assert planned.current_plan == PLAN.as_plan().to_json_dict()
    assert planned.execution_order == ["a", "b", "c"] and planned.revisions == []
    assert state.events == [] and state.current_plan is None  # the input is unchanged


def test_recording_a_replanned_plan_records_the_revision_and_its_diff() -> None:
    state = SessionState(
        goal="g",
        root_run_id="r",
        run_ids=["r", "r__replan_1"],
        revision=1,
        current_plan=PLAN.as_plan().to_json_dict(),
        locked={"a": {"action": "read", "tool": "read", "params": {"n": 1}, "output": 1}},
        failed=["b"],
        last_error="node b failed: boom",
        plan_source="planner",
    )
    planned = record_plan(state, REPLANNED, source="conf", attempts=1)
    assert types(planned) == ["plan.diff", "plan.validated"]
    [revision] = planned.revisions
    assert (revision.revision, revision.run_id, revision.reason, revision.trigger_node) == (
        1,
        "r__replan_1",
        "node b failed: boom",
        "b",
    )
    assert (revision.diff.removed, revision.diff.added, revision.diff.revised) == (["b", "c"], ["d"], [])
    assert planned.plan_source == "planner"  # a replan keeps the session's source
    assert planned.execution_order == ["d"] and planned.events[-1].data["reuse"] == ["a"]


def test_recording_a_planning_failure() -> None:
    state = start_session(goal="g", run_id="r")
    failed = record_planning_failure(
        state,
        reason="invalid_plan",
        message="bad",
        problems=[{"code": "cycle"}],
        more_problems=2,
        usage=[{"prompt_tokens": 7}],
    )
    assert types(failed) == ["planner.usage", "plan.failed"]
    assert failed.events[1].data == {
        "reason": "invalid_plan",
        "message": "bad",
        "problems": [{"code": "cycle"}],
        "more_problems": 2,
    }
    assert failed.usage.prompt_tokens == 7 and state.usage.prompt_tokens == 0


def test_recording_approval_answers() -> None:
    state = start_session(goal="g", run_id="r")
    granted = Approval(status="granted", nodes=["a"], responded_by="alice", message="approved by alice")
    answered = record_approval(state, granted)
    assert answered.approvals == [granted] and types(answered) == ["approval.granted"]
    assert answered.events[0].data["responded_by"] == "alice" and state.approvals == []
    skipped = record_approval_not_needed(state, ["a"])
    assert types(skipped) == ["approval.not_needed"] and skipped.events[0].data == {"approved_earlier": ["a"]}


def test_recording_node_outcomes() -> None:
    state = record_plan(start_session(goal="g", run_id="r"), PLAN)
    ref = ArtifactRef(uri="file:///x", size=10, sha256=SHA)
    started = make_event("node.started", state.source, "a")
    records = {
        "c": NodeRecord(node_id="c", tool="report", status=NodeStatus.SKIPPED, error="parent b failed"),
        "a": NodeRecord(
            node_id="a", tool="read", status=NodeStatus.SUCCESS, output={"n": 1}, events=[started]
        ),
        "b": NodeRecord(
            node_id="b", tool="sum", status=NodeStatus.SUCCESS, artifact=ref, output_summary="big"
        ),
    }
    recorded = record_node_outcomes(state, PLAN, records)
    assert recorded.usage.steps == 2  # a skipped node is no step
    assert [r.node_id for r in recorded.history] == ["a", "b", "c"]  # in plan order
    assert all(r.events == [] and r.output is None for r in recorded.history)
    assert [(e.type, e.node_id) for e in recorded.events[len(state.events) :]] == [
        ("node.started", "a"),  # reported by the node task
        ("node.succeeded", "b"),  # no events reported: finalize records the outcome
        ("node.skipped", "c"),
    ]
    assert recorded.locked["a"].output == {"n": 1} and recorded.locked["a"].summary == '{"n": 1}'
    assert recorded.locked["b"].output is None and recorded.locked["b"].artifact == ref
    assert recorded.locked["b"].summary == "big" and "c" not in recorded.locked
    assert state.history == [] and state.locked == {}


def test_reused_nodes_are_no_steps_and_stay_locked_as_they_were() -> None:
    state = SessionState(locked={"a": {"action": "read", "tool": "read", "output": "first"}}, current_plan={})
    records = {"a": NodeRecord(node_id="a", status=NodeStatus.SUCCESS, reused=True, output="again")}
    recorded = record_node_outcomes(state, PLAN, records)
    assert recorded.usage.steps == 0 and recorded.locked["a"].output == "first"
    assert [e.type for e in recorded.events] == ["node.reused"]


def test_the_run_context_holds_what_a_node_needs() -> None:
    state = SessionState(
        root_run_id="r",
        revision=2,
        lanes={"b": "api"},
        budgets=Budgets(max_steps=9),
        locked={
            "a": {"action": "read", "tool": "read", "output": "x" * 1000},
            "gone": {"action": "old", "tool": "old"},  # locked earlier, not in this plan
        },
        current_plan=REPLANNED.as_plan().to_json_dict(),
        execution_order=["d"],
        usage=Usage(steps=4),
    )
    assert run_context(state) == RunContext(
        root_run_id="r",
        revision=2,
        lanes={"b": "api"},
        execution_order=["d"],
        budgets=Budgets(max_steps=9),
        steps_used=4,
        reused=["a"],
    )
    assert "x" * 1000 not in run_context(state).model_dump_json()  # no locked outputs


def test_the_trigger_node_is_the_first_failed_or_requesting_node() -> None:
    assert trigger_node(SessionState(failed=["b"], replan_requested=["c"])) == "b"
    assert trigger_node(SessionState(replan_requested=["c"])) == "c"
    assert trigger_node(SessionState()) is None


def test_a_node_record_is_finished_and_round_trips_as_pushed() -> None:
    with pytest.raises(pydantic.ValidationError, match="success, failed or skipped"):
        NodeRecord(node_id="a", status=NodeStatus.PENDING)
    with pytest.raises(pydantic.ValidationError):
        NodeRecord.model_validate({"node_id": "a", "status": "running"})
    event = make_event("node.succeeded", EventSource(), "a")
    record = NodeRecord(
        node_id="a", status=NodeStatus.SUCCESS, output=[1], checkpoint=True, started_at="t0", events=[event]
    )
    pushed = record.pushed()
    assert pushed["status"] == "success" and pushed["output"] == [1] and pushed["checkpoint"] is True
    assert NodeRecord.model_validate(pushed) == record
    history = record.model_dump(mode="json")
    assert not {"output", "events", "checkpoint", "started_at", "ended_at"} & set(history)


def test_an_outcome_event_keeps_a_duration_of_zero_seconds() -> None:
    """0.0 s (an instant tool, to the millisecond) is a figure: the event says it, as the record does."""
    from airflow_plan_provider.plan.decisions import NodeStatus
    from airflow_plan_provider.plan.events import EventSource, outcome_event
    from airflow_plan_provider.plan.result import NodeRecord

    source = EventSource("d", "r", "r", 0)
    for seconds in (0.0, 0.125):
        record = NodeRecord(node_id="1", status=NodeStatus.SUCCESS, duration_s=seconds)
        assert outcome_event(record, source, 1).data["duration_s"] == seconds
    assert "replan_requested" not in outcome_event(record, source, 1).data  # False is left out
