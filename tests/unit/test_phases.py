"""A node's phase, from its task state, its resume method and its parents' states."""

from __future__ import annotations

import pytest

from airflow_plan_provider.plan.phases import (
    RESUME_AFTER_JOB,
    RESUME_AFTER_PARENTS,
    NodePhase,
    Phase,
    node_phase,
)

RUNNING_PARENTS = {"3": "running", "1": "success", "2": "queued"}
DONE_PARENTS = {"1": "success", "2": "skipped", "3": "failed"}


@pytest.mark.parametrize(
    ("state", "method", "parents", "expected"),
    [
        (None, None, {}, NodePhase(Phase.QUEUED)),
        ("scheduled", None, RUNNING_PARENTS, NodePhase(Phase.QUEUED)),
        ("queued", None, {}, NodePhase(Phase.QUEUED)),
        # waiting in its slot: named parents, in the plan's order
        ("running", None, RUNNING_PARENTS, NodePhase(Phase.WAITING, ("3", "2"), "in its slot")),
        ("running", None, DONE_PARENTS, NodePhase(Phase.RUNNING)),
        ("running", None, {}, NodePhase(Phase.RUNNING)),
        # resumed after its parents finished: its tool runs
        ("running", RESUME_AFTER_PARENTS, DONE_PARENTS, NodePhase(Phase.RUNNING)),
        ("deferred", RESUME_AFTER_PARENTS, RUNNING_PARENTS, NodePhase(Phase.WAITING, ("3", "2"), "deferred")),
        ("deferred", RESUME_AFTER_PARENTS, DONE_PARENTS, NodePhase(Phase.WAITING, (), "deferred")),
        ("deferred", RESUME_AFTER_JOB, DONE_PARENTS, NodePhase(Phase.POLLING)),
        ("deferred", None, DONE_PARENTS, NodePhase(Phase.POLLING)),
        ("deferred", None, RUNNING_PARENTS, NodePhase(Phase.WAITING, ("3", "2"), "deferred")),
        ("up_for_reschedule", None, RUNNING_PARENTS, NodePhase(Phase.WAITING, ("3", "2"), "made way")),
        ("up_for_retry", None, DONE_PARENTS, NodePhase(Phase.RETRYING)),
        ("success", None, {}, NodePhase("success")),
        ("not_run", None, RUNNING_PARENTS, NodePhase("not_run")),
    ],
)
def test_a_nodes_phase(state, method, parents, expected) -> None:
    assert node_phase(state, method, parents) == expected


def test_the_resume_methods_are_the_node_tasks_own() -> None:
    from airflow_plan_provider.operators.node import PlanNodeOperator

    assert callable(getattr(PlanNodeOperator, RESUME_AFTER_PARENTS))
    assert callable(getattr(PlanNodeOperator, RESUME_AFTER_JOB))
