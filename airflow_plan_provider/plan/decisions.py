"""Node states and the rules that move them: what a node does given its parents, what a failure affects."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from airflow_plan_provider.plan.graph import descendants
from airflow_plan_provider.plan.model import ValidatedPlan


class NodeStatus(StrEnum):
    """A node's state in one run: pending until its record says how it ended."""

    PENDING = "pending"
    SUCCESS = "success"
    FAILED = "failed"
    SKIPPED = "skipped"

    @property
    def finished(self) -> bool:
        return self in (NodeStatus.SUCCESS, NodeStatus.FAILED, NodeStatus.SKIPPED)


@dataclass(frozen=True)
class Decision:
    """What a node does now. ``missing`` names optional parents whose output is missing."""

    action: Literal["run", "skip", "wait"]
    missing: tuple[str, ...] = ()
    reason: str = ""


def decide(
    plan: ValidatedPlan,
    node_id: str,
    statuses: Mapping[str, NodeStatus],
    replan_requested: Iterable[str] = (),
) -> Decision:
    """Run, skip or wait, from the parents' states and edge kinds.

    A hard parent that failed or was skipped skips the node; an optional one is named as missing. A
    parent that requested a replan skips the node: its result made this part of the plan moot.
    """
    moot = set(replan_requested)
    soft = {tuple(edge) for edge in plan.soft_edges}
    missing: list[str] = []
    for parent in plan.parents[node_id]:
        status = statuses.get(parent, NodeStatus.PENDING)
        if parent in moot:
            return Decision("skip", reason=f"parent {parent} requested a replan")
        if status is NodeStatus.SUCCESS:
            continue
        if not status.finished:
            return Decision("wait", reason=f"parent {parent} is {status.value}")
        if (parent, node_id) in soft:
            missing.append(parent)
        else:
            return Decision("skip", reason=f"parent {parent} {status.value}")
    return Decision("run", tuple(missing))


def affected_subgraph(
    plan: ValidatedPlan,
    statuses: Mapping[str, NodeStatus],
    failed: Iterable[str] = (),
    replan_requested: Iterable[str] = (),
) -> set[str]:
    """Nodes a replan must re-plan: failed nodes and every descendant of a failed or replan-requesting
    node, except nodes that succeeded (those are locked)."""
    failed, replan_requested = set(failed), set(replan_requested)
    affected = failed | descendants(plan.parents, failed | replan_requested)
    return {node for node in affected if statuses.get(node) is not NodeStatus.SUCCESS}
