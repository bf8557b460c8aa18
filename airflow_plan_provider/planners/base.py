"""The planner protocol and the repair loop every planner shares.

A planner turns a :class:`PlanRequest` into a plan (a :class:`Plan`, a dict, or the raw JSON text a
model wrote) or ``None`` when it has no plan. For a replan (``request.is_replan``) it returns only the
replacement for the affected subgraph. :func:`plan_with_repairs` validates each reply and, while
attempts remain, asks again with the validator's problems; it never repairs a plan itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from airflow_plan_provider.exceptions import PlanningError, PlanValidationError
from airflow_plan_provider.plan.decisions import affected_subgraph
from airflow_plan_provider.plan.model import Plan, ValidatedPlan
from airflow_plan_provider.plan.session import SessionState, statuses_of, trigger_node
from airflow_plan_provider.plan.validate import Limits
from airflow_plan_provider.problems import MAX_REPORTED_PROBLEMS, Problem, capped
from airflow_plan_provider.tools.registry import ToolRegistry


@dataclass(frozen=True)
class LockedNode:
    """A node that succeeded in an earlier revision: it may not change, and its output is reused.

    ``summary`` is a short bounded text of the output (or of its artifact), never the full output.

    :param id: the node's id.
    :param action: what the node did.
    :param tool: the tool it called.
    :param summary: a bounded summary of its output.
    """

    id: str
    action: str
    tool: str
    summary: str


@dataclass(frozen=True)
class PlanRequest:
    """What a planner is asked: a goal and the tools on offer, or, for a replan, the part to replace.

    :param goal: what the session is for, in the user's words.
    :param tools: the tools a plan may call.
    :param limits: the size limits the plan must keep.
    :param conf: the run's conf (untrusted user input), for planners that read values from it.
    :param current_plan: for a replan, the plan that ran; ``None`` for a fresh plan.
    :param locked: the nodes that succeeded earlier in the session and may not change.
    :param failed_node: the node whose failure (or replan request) started the replan.
    :param last_error: that node's error or replan reason.
    :param affected: the ids of the subgraph to replace (the failed node and what depends on it).
    :param revision: the revision the plan will be.
    :param previous_reply: for a repair, the previous reply (bounded), as the model wrote it.
    :param problems: for a repair, what the validator found wrong with the previous reply.
    """

    goal: str
    tools: ToolRegistry
    limits: Limits = field(default_factory=Limits)
    conf: Mapping[str, Any] = field(default_factory=dict)
    # replanning
    current_plan: Plan | None = None
    locked: tuple[LockedNode, ...] = ()
    failed_node: str | None = None
    last_error: str | None = None
    affected: tuple[str, ...] = ()
    revision: int = 0
    # repair feedback: the previous reply and what was wrong with it
    previous_reply: str | None = None
    problems: tuple[Problem, ...] = ()

    @property
    def is_replan(self) -> bool:
        return self.current_plan is not None


def replan_request(
    state: SessionState,
    current: ValidatedPlan,
    tools: ToolRegistry,
    limits: Limits | None = None,
    conf: Mapping[str, Any] | None = None,
) -> PlanRequest:
    """What the planner is asked when a session replans (``state`` is the next revision's session,
    ``current`` the plan the last revision ran): the locked nodes, the node that started the replan and
    why, and the affected subgraph (the failed nodes and every descendant of a failed or
    replan-requesting node, except those that succeeded)."""
    last = {r.node_id: r for r in state.history if r.revision == state.revision - 1}
    affected = affected_subgraph(current, statuses_of(last), state.failed, state.replan_requested)
    locked = tuple(
        LockedNode(id=n, action=lo.action, tool=lo.tool, summary=lo.summary) for n, lo in state.locked.items()
    )
    return PlanRequest(
        goal=state.goal,
        tools=tools,
        limits=limits or Limits(),
        conf=dict(conf or {}),
        current_plan=current.as_plan(),
        locked=locked,
        failed_node=trigger_node(state),
        last_error=state.last_error,
        affected=tuple(sorted(affected)),
        revision=state.revision,
    )


@dataclass
class PlannerReply:
    """A planner's answer with what it cost.

    :param plan: the plan (a :class:`Plan`, a dict or JSON text), or ``None`` for no plan.
    :param usage: token counts of the call (``prompt_tokens``, ``completion_tokens``), when known.
    """

    plan: Plan | Mapping[str, Any] | str | None
    usage: dict[str, int] = field(default_factory=dict)  # prompt_tokens, completion_tokens


@runtime_checkable
class Planner(Protocol):
    """Anything with a ``plan(request)`` method: returns a :class:`PlannerReply`, a plan or ``None``."""

    def plan(self, request: PlanRequest) -> PlannerReply | Plan | Mapping[str, Any] | str | None: ...


def as_reply(result: PlannerReply | Plan | Mapping[str, Any] | str | None) -> PlannerReply:
    return result if isinstance(result, PlannerReply) else PlannerReply(plan=result)


@dataclass
class PlanningOutcome:
    plan: ValidatedPlan
    attempts: int
    usage: list[dict[str, int]]
    # Problems of each rejected attempt, as dicts: the first MAX_REPORTED_PROBLEMS, then (when more)
    # one marker {"code": "more_problems", "more": N, ...} counting the rest; see rejected_problem_count.
    rejected: list[list[dict[str, Any]]]


def rejected_summary(problems: list[Problem]) -> list[dict[str, Any]]:
    """The problems of one rejected attempt as kept in :attr:`PlanningOutcome.rejected`: the first
    :data:`MAX_REPORTED_PROBLEMS` as dicts, then a ``more_problems`` marker counting the rest."""
    shown, more = capped(problems, MAX_REPORTED_PROBLEMS)
    summary = [p.to_dict() for p in shown]
    if more:
        message = f"... and {more} more problem(s)"
        summary.append({"code": "more_problems", "message": message, "nodes": [], "path": "", "more": more})
    return summary


def rejected_problem_count(summary: list[dict[str, Any]]) -> int:
    """How many problems the attempt behind one entry of :attr:`PlanningOutcome.rejected` had."""
    return sum(p.get("more", 0) if p.get("code") == "more_problems" else 1 for p in summary)


def _reply_text(raw: Any) -> str:
    import json

    if isinstance(raw, str):
        return raw
    if isinstance(raw, Plan):
        return json.dumps(raw.to_json_dict())
    return json.dumps(raw, default=str)


def plan_with_repairs(
    planner: Planner,
    request: PlanRequest,
    finish: Callable[[Any], ValidatedPlan],
    *,
    repair_attempts: int = 2,
) -> PlanningOutcome:
    """Ask ``planner`` for a plan, turn it into a validated plan with ``finish``, repair while allowed.

    ``finish`` validates a fresh plan, or merges a replacement subgraph and validates the result; it
    raises :class:`PlanValidationError`. Raises :class:`PlanningError` with reason ``no_plan`` when the
    planner has no plan, or ``invalid_plan`` with every remaining problem when repairs run out.
    Raises :class:`ValueError` when ``repair_attempts`` is not an integer of at least 0.
    """
    if isinstance(repair_attempts, bool) or not isinstance(repair_attempts, int) or repair_attempts < 0:
        raise ValueError(f"repair_attempts must be an integer of at least 0, got {repair_attempts!r}")
    usage: list[dict[str, int]] = []
    rejected: list[list[dict[str, Any]]] = []
    current = request
    for attempt in range(1, repair_attempts + 2):
        try:
            reply = as_reply(planner.plan(current))
        except PlanningError as error:
            error.usage = usage + error.usage
            raise
        if reply.usage:
            usage.append(dict(reply.usage))
        if reply.plan is None:
            raise PlanningError("the planner returned no plan", reason="no_plan", usage=usage)
        try:
            return PlanningOutcome(finish(reply.plan), attempt, usage, rejected)
        except PlanValidationError as error:
            rejected.append(rejected_summary(error.problems))
            if attempt > repair_attempts:
                raise PlanningError(
                    f"no valid plan after {attempt} attempt(s) ({repair_attempts} repair(s))",
                    error.problems,
                    reason="invalid_plan",
                    usage=usage,
                ) from error
            current = replace(request, previous_reply=_reply_text(reply.plan), problems=tuple(error.problems))
    raise AssertionError("unreachable")
