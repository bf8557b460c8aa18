"""A plan session across revisions: the state each run carries, and the decision at the end of a run.

One goal may take several runs of the plan DAG: revision 0 plans and executes; each replan starts a new
run (revision n+1) whose conf carries a :class:`SessionState` with the locked nodes' outputs, the history
and the budgets used so far.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field

from airflow_plan_provider.plan.approval import Approval
from airflow_plan_provider.plan.budgets import Budgets, Usage
from airflow_plan_provider.plan.decisions import NodeStatus
from airflow_plan_provider.plan.events import EventSource, make_event
from airflow_plan_provider.plan.model import ValidatedPlan
from airflow_plan_provider.plan.result import (
    ArtifactRef,
    Event,
    NodeRecord,
    Reason,
    ReplanInfo,
    Revision,
    SessionResult,
    summarize,
)


class LockedOutput(BaseModel):
    """A node that succeeded earlier: its call, its output, and a summary.

    ``output`` is the tool's data as it returned it, never interpreted. When the output was too large for
    XCom, ``output`` is empty and ``artifact`` says where the provider stored it: that field alone is
    dereferenced, and only inside the configured store.
    """

    action: str
    tool: str
    params: dict[str, Any] = Field(default_factory=dict)
    output: Any = None
    artifact: ArtifactRef | None = None
    summary: str = ""


class SessionState(BaseModel):
    dag_id: str = ""
    goal: str = ""
    root_run_id: str = ""
    parent_run_id: str | None = None
    run_ids: list[str] = Field(default_factory=list)
    revision: int = 0
    budgets: Budgets = Field(default_factory=Budgets)
    usage: Usage = Field(default_factory=Usage)
    locked: dict[str, LockedOutput] = Field(default_factory=dict)
    history: list[NodeRecord] = Field(default_factory=list)
    revisions: list[Revision] = Field(default_factory=list)
    events: list[Event] = Field(default_factory=list)
    approvals: list[Approval] = Field(default_factory=list)  # answers to this session's approval requests
    # set by the planning step of this run
    current_plan: dict[str, Any] | None = None
    # "conf": a ready plan given in the run's conf, run as given and never replanned (no planner wrote
    # it); "dag": the plan built into the DAG (a frozen plan), never replanned either; "planner": written
    # by the DAG's planner
    plan_source: Literal["planner", "conf", "dag"] = "planner"
    eager: bool = False  # nodes run as one mapped task, each starting when its own parents finish
    # node id -> the lane (a pool's node tasks) it runs in; a node absent here runs in the default lane
    lanes: dict[str, str] = Field(default_factory=dict)
    execution_order: list[str] = Field(default_factory=list)  # nodes this revision executes, in order
    # set when a run ends by asking for a replan
    failed: list[str] = Field(default_factory=list)
    replan_requested: list[str] = Field(default_factory=list)
    last_error: str | None = None

    @property
    def source(self) -> EventSource:
        """The identifiers of this run's events (the run is the last one in ``run_ids``)."""
        run_id = self.run_ids[-1] if self.run_ids else self.root_run_id
        return EventSource(self.dag_id, run_id, self.root_run_id, self.revision)

    def event(self, type_: str, node_id: str | None = None, /, **data: Any) -> Event:
        """Build an event of this run and add it to the session's events."""
        event = make_event(type_, self.source, node_id, **data)
        self.events.append(event)
        return event

    def result(
        self,
        status: Literal["completed", "failed", "replanned"],
        reason: Reason,
        message: str = "",
        outputs: Mapping[str, Any] | None = None,
        replan: ReplanInfo | None = None,
    ) -> SessionResult:
        return SessionResult(
            status=status,
            reason=reason,
            goal=self.goal,
            root_run_id=self.root_run_id,
            run_ids=list(self.run_ids),
            history=list(self.history),
            revisions=list(self.revisions),
            events=list(self.events),
            outputs=dict(outputs or {}),
            usage=self.usage,
            message=message,
            replan=replan,
            approvals=list(self.approvals),
        )


class Conclusion(BaseModel):
    """How a run ends: the goal is met, a replan is due, or the session gives up."""

    kind: Literal["done", "replan", "give_up"]
    reason: str  # a SessionResult reason when giving up; what prompted the replan otherwise
    message: str = ""
    failed: list[str] = Field(default_factory=list)
    replan_requested: list[str] = Field(default_factory=list)


def statuses_of(records: Mapping[str, NodeRecord]) -> dict[str, NodeStatus]:
    return {node_id: NodeStatus(record.status) for node_id, record in records.items()}


def conclude(plan: ValidatedPlan, records: Mapping[str, NodeRecord], state: SessionState) -> Conclusion:
    """Decide the end of a run from its node records and the session's budgets."""
    failed = [n for n in plan.node_ids if n in records and records[n].status == "failed"]
    contained = contained_failures(plan, records, failed)
    failed = [n for n in failed if n not in contained]
    moot = [n for n in plan.node_ids if n in records and records[n].replan_requested]
    starved = [n for n in plan.node_ids if n in records and records[n].budget_exhausted]
    budgets, usage = state.budgets, state.usage
    if starved:
        return Conclusion(
            kind="give_up",
            reason="step_budget",
            message=f"step budget of {budgets.max_steps} spent; not executed: {', '.join(starved)}",
            failed=failed,
        )
    cannot_replan = state.plan_source != "planner" or budgets.max_replans == 0
    if cannot_replan and not failed and moot and not any(_children(plan)[n] for n in moot):
        # No replan can answer (as for a frozen plan), and no node depends on the requesting nodes, so
        # nothing was skipped for them: the run concludes on the rest.
        return Conclusion(
            kind="done",
            reason="goal_met",
            message="the plan ran to its end; no replan can answer these requests, and no node depends "
            "on them: " + "; ".join(f"node {n} requested a replan: {records[n].error}" for n in moot),
            replan_requested=moot,
        )
    if not failed and not moot:
        if contained:
            return Conclusion(
                kind="done",
                reason="goal_met",
                message=f"completed without the output of failed optional input(s) {', '.join(contained)}",
            )
        return Conclusion(kind="done", reason="goal_met", message="every node succeeded")
    what = "; ".join(
        [f"node {n} failed: {records[n].error}" for n in failed]
        + [f"node {n} requested a replan: {records[n].error}" for n in moot]
    )

    def give_up(reason: str, message: str) -> Conclusion:
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


def contained_failures(
    plan: ValidatedPlan, records: Mapping[str, NodeRecord], failed: list[str]
) -> list[str]:
    """Failed nodes whose children all succeeded without them (through optional edges): the plan went on,
    so they need no replan. A failed leaf is never contained."""
    children = _children(plan)
    return [
        n
        for n in failed
        if children[n] and all(c in records and records[c].status == "success" for c in children[n])
    ]


def _children(plan: ValidatedPlan) -> dict[str, list[str]]:
    children: dict[str, list[str]] = {n: [] for n in plan.node_ids}
    for child, parents in plan.parents.items():
        for parent in parents:
            children[parent].append(child)
    return children


def record_approval(state: SessionState, approval: Approval) -> None:
    """Add an answer to an approval request to the session, with its event (``approval.granted`` or
    ``approval.rejected``: who could answer, who did and when, which nodes)."""
    state.approvals.append(approval)
    state.event(
        f"approval.{approval.status}",
        nodes=approval.nodes,
        approvers=approval.approvers,
        responded_by=approval.responded_by,
        requested_at=approval.requested_at,
        responded_at=approval.responded_at,
        timed_out=approval.timed_out,
        message=approval.message,
    )


def lock_successes(
    plan: ValidatedPlan, records: Mapping[str, NodeRecord], outputs: Mapping[str, Any], state: SessionState
) -> None:
    """Add this run's succeeded nodes to the locked set, with their outputs (``outputs``: the tools' data)
    or the references to the outputs the provider stored (the records' ``artifact``)."""
    for node in plan.nodes:
        record = records.get(node.id)
        if record is not None and record.status == "success" and node.id not in state.locked:
            output = None if record.artifact is not None else outputs.get(node.id)
            state.locked[node.id] = LockedOutput(
                action=node.action,
                tool=node.tool,
                params=node.params,
                output=output,
                artifact=record.artifact,
                summary=record.output_summary or summarize(output),
            )
