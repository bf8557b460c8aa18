"""Merging a replanned subgraph into the current plan, and the diff between revisions."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import Field

from airflow_plan_provider.base_model import Model
from airflow_plan_provider.exceptions import PlanValidationError
from airflow_plan_provider.plan.graph import node_sort_key
from airflow_plan_provider.plan.model import Node, Plan
from airflow_plan_provider.plan.validate import parse_plan
from airflow_plan_provider.problems import Problem


class PlanDiff(Model):
    """Node ids removed, added and revised (same id, different tool, params or action) by a revision."""

    removed: list[str] = Field(default_factory=list)
    added: list[str] = Field(default_factory=list)
    revised: list[str] = Field(default_factory=list)


def _same_call(a: Node, b: Node) -> bool:
    return a.tool == b.tool and a.params == b.params


def plan_diff(before: Plan, after: Plan) -> PlanDiff:
    old = {n.id: n for n in before.nodes}
    new = {n.id: n for n in after.nodes}
    return PlanDiff(
        removed=sorted(old.keys() - new.keys(), key=node_sort_key),
        added=sorted(new.keys() - old.keys(), key=node_sort_key),
        revised=sorted(
            (
                i
                for i in old.keys() & new.keys()
                if not _same_call(old[i], new[i]) or old[i].action != new[i].action
            ),
            key=node_sort_key,
        ),
    )


def merge_replan(
    current: Plan, replacement: Plan | Mapping[str, Any] | str, locked: Iterable[str]
) -> tuple[Plan, PlanDiff]:
    """The plan after a replan: the locked nodes unchanged, plus the replacement subgraph.

    Non-locked nodes of ``current`` that the replacement does not mention are removed. The replacement
    may depend on locked nodes; it may repeat a locked node only unchanged. Edges between locked nodes
    are kept. The merged plan still has to pass :func:`validate_plan`.
    Raises :class:`PlanValidationError` (``locked_changed``, or ``schema`` for a malformed replacement).
    """
    locked = set(locked)
    sub = parse_plan(replacement)
    kept = [n for n in current.nodes if n.id in locked]
    by_id = {n.id: n for n in kept}
    problems: list[Problem] = []
    added: list[Node] = []
    for node in sub.nodes:
        if node.id in by_id:
            if not _same_call(by_id[node.id], node):
                problems.append(
                    Problem(
                        "locked_changed",
                        f"node {node.id!r} succeeded earlier and is locked; the replan may not change its "
                        f"tool or params (give the new step a new id)",
                        (node.id,),
                    )
                )
            continue
        added.append(node)
    if problems:
        raise PlanValidationError(problems)
    edges = [e for e in current.edges if e.source in locked and e.target in locked] + list(sub.edges)
    merged = Plan(goal=current.goal or sub.goal, nodes=kept + added, edges=edges)
    return merged, plan_diff(current, merged)
