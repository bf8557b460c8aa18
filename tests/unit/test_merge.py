"""Replan merge and the diff between revisions, directly."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from airflow_plan_provider.exceptions import PlanValidationError
from airflow_plan_provider.plan.merge import PlanDiff, merge_replan, plan_diff
from airflow_plan_provider.plan.model import Plan


def plan(*nodes: tuple[str, str, dict[str, object]], edges: Sequence[tuple[str, str]] = ()) -> Plan:
    return Plan.model_validate(
        {
            "goal": "g",
            "nodes": [{"id": i, "action": f"do {i}", "tool": t, "params": p} for i, t, p in nodes],
            "edges": [{"from": a, "to": b} for a, b in edges],
        }
    )


def test_the_diff_names_removed_added_and_revised_nodes_in_node_order() -> None:
    before = plan(("1", "a", {}), ("2", "b", {"x": 1}), ("10", "c", {}), ("3", "d", {}))
    after = plan(("1", "a", {}), ("2", "b", {"x": 2}), ("4", "e", {}), ("11", "f", {}))
    assert plan_diff(before, after) == PlanDiff(removed=["3", "10"], added=["4", "11"], revised=["2"])
    assert plan_diff(before, before) == PlanDiff()


def test_a_new_action_text_alone_revises_a_node() -> None:
    before = plan(("1", "a", {}))
    after = Plan.model_validate({"nodes": [{"id": "1", "action": "other words", "tool": "a"}]})
    assert plan_diff(before, after).revised == ["1"]


def test_a_merge_keeps_locked_nodes_and_their_edges_and_takes_the_rest_from_the_replacement() -> None:
    current = plan(("1", "a", {}), ("2", "b", {}), ("3", "c", {}), edges=[("1", "2"), ("2", "3")])
    replacement = {
        "nodes": [
            {"id": "2", "action": "do 2", "tool": "b", "params": {}},  # a locked node repeated unchanged
            {"id": "4", "action": "new", "tool": "d", "params": {"x": "${2}"}},
        ],
        "edges": [{"from": "2", "to": "4"}],
    }
    merged, diff = merge_replan(current, replacement, locked={"1", "2"})
    assert merged.node_ids == ["1", "2", "4"]
    assert [(e.source, e.target) for e in merged.edges] == [("1", "2"), ("2", "4")]
    assert merged.goal == "g"
    assert diff == PlanDiff(removed=["3"], added=["4"], revised=[])


def test_a_merge_may_not_change_a_locked_node() -> None:
    current = plan(("1", "a", {"x": 1}))
    with pytest.raises(PlanValidationError) as raised:
        merge_replan(current, {"nodes": [{"id": "1", "action": "x", "tool": "a", "params": {"x": 2}}]}, {"1"})
    assert [p.code for p in raised.value.problems] == ["locked_changed"]
    assert raised.value.problems[0].nodes == ("1",)


def test_a_malformed_replacement_is_a_schema_problem() -> None:
    with pytest.raises(PlanValidationError) as raised:
        merge_replan(plan(("1", "a", {})), {"nodes": "not a list"}, set())
    assert raised.value.problems[0].code == "schema"
