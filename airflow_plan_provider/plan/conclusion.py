"""How a run ends: the decision (:func:`conclude`) and the transitions that close the run.

:func:`finish_session` ends the session (completed or failed) with its :class:`SessionResult`;
:func:`prepare_replan` reports the run as replanned and returns the next revision's session, which the
finalize task keeps for the replan run (:func:`~airflow_plan_provider.plan.session.replan_conf`). Both
return new values and leave the given state unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import Field

from airflow_plan_provider.base_model import Model
from airflow_plan_provider.plan.decisions import NodeStatus
from airflow_plan_provider.plan.events import make_event
from airflow_plan_provider.plan.model import ValidatedPlan
from airflow_plan_provider.plan.result import NodeRecord, Reason, ReplanInfo, SessionResult
from airflow_plan_provider.plan.session import SessionState, replan_run_id

# give-up reason -> what the budget is called, how much of it was used, its limit
BUDGETS: dict[str, Callable[[SessionState], tuple[str, int, int]]] = {
    "step_budget": lambda state: ("steps", state.usage.steps, state.budgets.max_steps),
    "replan_budget": lambda state: ("replans", state.usage.replans, state.budgets.max_replans),
}


class Conclusion(Model):
    """How a run ends: the goal is met, a replan is due, or the session gives up."""

    kind: Literal["done", "replan", "give_up"]
    reason: Reason  # why the session gives up; what prompted the replan; goal_met when done
    message: str = ""
    failed: list[str] = Field(default_factory=list)
    replan_requested: list[str] = Field(default_factory=list)


def conclude(plan: ValidatedPlan, records: Mapping[str, NodeRecord], state: SessionState) -> Conclusion:
    """Decide the end of a run from its node records and the session's budgets."""
    failed = [n for n in plan.node_ids if n in records and records[n].status is NodeStatus.FAILED]
    contained = contained_failures(plan, records, failed)
    failed = [n for n in failed if n not in contained]
    moot = [n for n in plan.node_ids if n in records and records[n].replan_requested]
    starved = [n for n in plan.node_ids if n in records and records[n].budget_exhausted]
    if starved:
        return Conclusion(
            kind="give_up",
            reason="step_budget",
            message=f"step budget of {state.budgets.max_steps} spent; not executed: {', '.join(starved)}",
            failed=failed,
        )
    cannot_replan = state.plan_source != "planner" or state.budgets.max_replans == 0
    if cannot_replan and not failed and moot and not any(_children(plan)[n] for n in moot):
        return _done_beside_requests(records, moot, state)
    if not failed and not moot:
        if contained:
            return Conclusion(
                kind="done",
                reason="goal_met",
                message=f"completed without the output of failed optional input(s) {', '.join(contained)}",
            )
        return Conclusion(kind="done", reason="goal_met", message="every node succeeded")
    return _replan_or_give_up(records, failed, moot, state)


def _done_beside_requests(
    records: Mapping[str, NodeRecord], moot: list[str], state: SessionState
) -> Conclusion:
    """Done, though nodes ``moot`` requested a replan: no replan can answer (as for a frozen plan), and
    no node depends on the requesting nodes, so nothing was skipped for them: the run concludes on the
    rest."""
    return Conclusion(
        kind="done",
        reason="goal_met",
        message="the plan ran to its end (no node depends on "
        + ", ".join(moot)
        + "); "
        + "; ".join(f"node {n} requested a replan: {records[n].error}" for n in moot)
        + f"; no replan runs: {_no_replan_remedy(state)}",
        replan_requested=moot,
    )


def _replan_or_give_up(
    records: Mapping[str, NodeRecord], failed: list[str], moot: list[str], state: SessionState
) -> Conclusion:
    """Nodes ``failed`` failed or nodes ``moot`` requested a replan: a replan, unless the plan cannot be
    replanned (a ready plan, a frozen plan, no replans allowed) or a budget is spent."""
    budgets, usage = state.budgets, state.usage
    what = "; ".join(
        [f"node {n} failed: {records[n].error}" for n in failed]
        + [f"node {n} requested a replan: {records[n].error}" for n in moot]
    )

    def give_up(reason: Reason, message: str) -> Conclusion:
        return Conclusion(
            kind="give_up", reason=reason, message=message, failed=failed, replan_requested=moot
        )

    if state.plan_source == "conf":
        return give_up(
            "node_failed" if failed else "replan_unavailable",
            f"{what}; the plan is the ready plan given in the run's conf, and no planner can replan a "
            "ready plan (trigger a new run with a corrected plan, or with a goal for the planner)",
        )
    if state.plan_source == "dag":
        return give_up(
            "node_failed" if failed else "replan_unavailable",
            f"{what}; the plan is the one built into this DAG (a frozen plan), which is never replanned",
        )
    if budgets.max_replans == 0:
        return give_up("node_failed" if failed else "replan_budget", what)
    if usage.replans >= budgets.max_replans:
        return give_up("replan_budget", f"{usage.replans} replan(s) used of {budgets.max_replans}; {what}")
    if usage.steps >= budgets.max_steps:
        return give_up("step_budget", f"step budget of {budgets.max_steps} spent; {what}")
    return Conclusion(
        kind="replan",
        reason="node_failed" if failed else "replan_requested",
        message=what,
        failed=failed,
        replan_requested=moot,
    )


def _no_replan_remedy(state: SessionState) -> str:
    """Why no replan answers a request in this session, and what a reader can do about it."""
    if state.plan_source == "dag":
        return (
            "this DAG's plan is frozen (never replanned); to stop these requests, drop or change these "
            "nodes in its PLAN, or freeze a newer session"
        )
    if state.plan_source == "conf":
        return "a ready plan from the run's conf is never replanned; give a plan without these nodes"
    return "max_replans is 0; trigger with max_replans of 1 or more to let the planner answer"


def contained_failures(
    plan: ValidatedPlan, records: Mapping[str, NodeRecord], failed: list[str]
) -> list[str]:
    """Failed nodes whose children all succeeded without them (through optional edges): the plan went on,
    so they need no replan. A failed leaf is never contained."""
    children = _children(plan)
    return [
        n
        for n in failed
        if children[n] and all(c in records and records[c].status is NodeStatus.SUCCESS for c in children[n])
    ]


def _children(plan: ValidatedPlan) -> dict[str, list[str]]:
    children: dict[str, list[str]] = {n: [] for n in plan.node_ids}
    for child, parents in plan.parents.items():
        for parent in parents:
            children[parent].append(child)
    return children


def finish_session(
    state: SessionState, conclusion: Conclusion, outputs: Mapping[str, Any] | None = None
) -> tuple[SessionState, SessionResult]:
    """End the session as the run concluded: completed when done; failed otherwise (a replan that is due
    where none can start, as in a DAG without a replan task, fails with ``node_failed``)."""
    if conclusion.kind == "done":
        return _finish(state, "completed", "goal_met", conclusion.message, outputs)
    reason: Reason = "node_failed" if conclusion.kind == "replan" else conclusion.reason
    return fail_session(state, reason, conclusion.message, outputs)


def fail_session(
    state: SessionState, reason: Reason, message: str, outputs: Mapping[str, Any] | None = None
) -> tuple[SessionState, SessionResult]:
    """End the session failed (no plan, the plan rejected, a node failed with no replan left, a budget
    spent: ``budget.exhausted`` names it), after its ``session.finished`` event."""
    return _finish(state, "failed", reason, message, outputs)


def prepare_replan(
    state: SessionState,
    conclusion: Conclusion,
    records: Mapping[str, NodeRecord],
    outputs: Mapping[str, Any] | None = None,
) -> tuple[SessionResult, SessionState]:
    """Hand over to the next revision (``conclusion.kind`` is ``replan``): this run's result (status
    ``replanned``: which node asked, why, which run goes on) after its ``replan.requested`` event, and the
    session the next revision's run carries."""
    if conclusion.kind != "replan":
        raise ValueError(
            f"a replan is prepared only when the run concludes 'replan', not {conclusion.kind!r}"
        )
    request = ReplanInfo(
        revision=state.revision + 1,
        run_id=replan_run_id(state.root_run_id, state.revision + 1),
        trigger_node=next(iter(conclusion.failed + conclusion.replan_requested), None),
        failed={n: records[n].error or "" for n in conclusion.failed},
        replan_requested={n: records[n].error or "" for n in conclusion.replan_requested},
    )
    new = state.model_copy(deep=True)
    new.events.append(
        make_event(
            "replan.requested",
            new.source,
            request.trigger_node,
            reason=conclusion.reason,
            message=conclusion.message,
            failed=request.failed,
            replan_requested=request.replan_requested,
            next_revision=request.revision,
            next_run_id=request.run_id,
        )
    )
    result = new.result("replanned", conclusion.reason, f"replanning: {conclusion.message}", outputs, request)
    new.usage.replans += 1
    new.revision += 1
    new.parent_run_id = new.source.run_id
    new.failed, new.replan_requested = list(conclusion.failed), list(conclusion.replan_requested)
    new.last_error = conclusion.message
    return result, new


def _finish(
    state: SessionState,
    status: Literal["completed", "failed"],
    reason: Reason,
    message: str,
    outputs: Mapping[str, Any] | None,
) -> tuple[SessionState, SessionResult]:
    new = state.model_copy(deep=True)
    if reason in BUDGETS:
        budget, used, limit = BUDGETS[reason](new)
        new.events.append(
            make_event("budget.exhausted", new.source, budget=budget, used=used, limit=limit, message=message)
        )
    new.events.append(make_event("session.finished", new.source, status=status, reason=reason))
    return new, new.result(status, reason, message, outputs)
