"""The node decision rules (decide) and the replan scope (affected_subgraph), directly."""

from __future__ import annotations

import pytest

from airflow_plan_provider.plan.decisions import Decision, NodeStatus, affected_subgraph, decide
from airflow_plan_provider.plan.validate import validate_plan

S, F, K, P = NodeStatus.SUCCESS, NodeStatus.FAILED, NodeStatus.SKIPPED, NodeStatus.PENDING

# a -> c (hard), b -> c (optional), c -> d, e alone
PLAN = validate_plan(
    {
        "nodes": [{"id": n, "action": n, "tool": "t"} for n in "abcde"],
        "edges": [
            {"from": "a", "to": "c"},
            {"from": "b", "to": "c", "optional": True},
            {"from": "c", "to": "d"},
        ],
    }
)


def test_a_node_without_parents_runs() -> None:
    assert decide(PLAN, "a", {}) == Decision("run")


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (S, S, Decision("run")),
        (S, F, Decision("run", ("b",))),  # optional parent failed: run without its input
        (S, K, Decision("run", ("b",))),
        (F, S, Decision("skip", reason="parent a failed")),  # hard parent failed
        (K, S, Decision("skip", reason="parent a skipped")),
        (P, S, Decision("wait", reason="parent a is pending")),
        (S, P, Decision("wait", reason="parent b is pending")),
    ],
)
def test_a_node_follows_its_parents_states_and_edge_kinds(
    a: NodeStatus, b: NodeStatus, expected: Decision
) -> None:
    assert decide(PLAN, "c", {"a": a, "b": b}) == expected


def test_a_parent_that_asked_for_a_replan_makes_its_children_moot() -> None:
    assert decide(PLAN, "c", {"a": S, "b": S}, replan_requested=["b"]) == Decision(
        "skip", reason="parent b requested a replan"
    )


def test_a_missing_status_counts_as_pending() -> None:
    assert decide(PLAN, "d", {}).action == "wait"


def test_only_finished_statuses_are_finished() -> None:
    assert [s for s in NodeStatus if s.finished] == [S, F, K]


def test_the_affected_subgraph_is_the_failed_nodes_and_their_descendants_that_did_not_succeed() -> None:
    statuses = {"a": F, "b": S, "c": K, "d": K, "e": S}
    assert affected_subgraph(PLAN, statuses, failed=["a"]) == {"a", "c", "d"}
    # a replan request re-plans what follows the requesting node, not the node itself (it succeeded)
    assert affected_subgraph(PLAN, {**statuses, "a": S}, replan_requested=["a"]) == {"c", "d"}
    # a descendant that succeeded (through an optional edge) is locked, not re-planned
    assert affected_subgraph(PLAN, {"b": F, "c": S, "d": S}, failed=["b"]) == {"b"}
    assert affected_subgraph(PLAN, statuses) == set()
