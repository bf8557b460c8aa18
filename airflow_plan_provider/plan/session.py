"""A plan session across revisions: the state each run carries, and the transitions that change it.

One goal may take several runs of the plan DAG: revision 0 plans and executes; each replan starts a new
run (revision n+1) that continues the :class:`SessionState` its parent run left in XCom, with the locked
nodes' outputs, the history and the budgets used so far (its conf only names it). The session is a state
machine; each transition is a function of typed values that returns the new state (its input is left
unchanged)::

    start_session / continue_session   a run begins (a new goal, or a verified replan session)
      -> record_plan                   the validated plan, its execution order, revision and events
         (or record_planning_failure)
      -> record_approval(_not_needed)  the answer to the plan's approval request, if one was asked
      -> record_node_outcomes          the nodes' records: history, steps, events, locked outputs
      -> conclusion.conclude           done / replan / give up, within the budgets
      -> conclusion.finish_session     the SessionResult (completed or failed)
         or conclusion.prepare_replan  this run's result (replanned) and the next revision's session

What a node task needs of the session is the small :class:`RunContext` (:func:`run_context`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from pydantic import Field

from airflow_plan_provider.base_model import Model
from airflow_plan_provider.plan.approval import Approval
from airflow_plan_provider.plan.budgets import Budgets, Usage
from airflow_plan_provider.plan.decisions import NodeStatus
from airflow_plan_provider.plan.events import NODE_OUTCOMES, EventSource, in_order, make_event
from airflow_plan_provider.plan.merge import plan_diff
from airflow_plan_provider.plan.model import Plan, ValidatedPlan
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

# "conf": a ready plan given in the run's conf, run as given and never replanned (no planner wrote it);
# "dag": the plan built into the DAG (a frozen plan), never replanned either; "planner": written by the
# DAG's planner
PlanSource = Literal["planner", "conf", "dag"]


class LockedOutput(Model):
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


class SessionState(Model):
    """The session so far, as one run carries it (XCom ``session`` of ``plan``; ``replan_conf`` of
    ``finalize`` for the next revision's run).

    Changed only by the transitions of this module and :mod:`~airflow_plan_provider.plan.conclusion`,
    each of which returns a new state and leaves its input as it was.
    """

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
    plan_source: PlanSource = "planner"
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


class RunSlots(Model):
    """A run's slots as its planning task knows them (the least of the DAG's ``max_active_tasks`` and
    Airflow's parallelism) and its node tasks (ids without their group's prefix), whose instances' states
    say whether the run leaves a slot idle (``plan.waiting.leaves_a_slot_idle``)."""

    slots: int = Field(ge=1)
    tasks: list[str] = Field(min_length=1)


class RunContext(Model):
    """What a node task needs of the session (XCom ``run`` of ``plan``): a few identifiers, where the
    run's nodes are, the step budget, and which nodes are reused. A reused node's locked output is
    published on its own (one XCom per locked node), so no node reads the whole session.
    """

    root_run_id: str = ""
    revision: int = 0
    lanes: dict[str, str] = Field(default_factory=dict)  # node id -> lane (absent: the default lane)
    execution_order: list[str] = Field(default_factory=list)  # nodes this revision executes, in order
    budgets: Budgets = Field(default_factory=Budgets)
    steps_used: int = 0  # node executions of the earlier revisions
    reused: list[str] = Field(default_factory=list)  # locked nodes of this plan
    # nodes started on the triggerer come to a slot as soon as their parents begin their tools; in a run
    # without slots to spare (plan.waiting.slots_to_spare, the planning task's choice for the run) only
    # while the run leaves one of these slots idle, else once the parents finished or saved their results
    near_while_idle: RunSlots | None = None

    def position(self, node_id: str) -> int | None:
        """The node's place in this revision's execution order (what the step budget counts); None for
        a node the revision does not execute (a reused one)."""
        try:
            return self.execution_order.index(node_id)
        except ValueError:
            return None

    def for_node(self, node_id: str) -> RunContext:
        """This context as one node needs it: the session's ids, revision and budget, and whether the
        node is reused; no other node's lane, place or reuse."""
        return RunContext(
            root_run_id=self.root_run_id,
            revision=self.revision,
            budgets=self.budgets,
            steps_used=self.steps_used,
            reused=[node_id] if node_id in self.reused else [],
            near_while_idle=self.near_while_idle,
        )


def replan_run_id(root_run_id: str, revision: int) -> str:
    """Run ids of a session's revisions: the root run's id with the revision, easy to follow in the UI."""
    return f"{root_run_id}__replan_{revision}"


def session_root_run_id(run_id: str) -> str:
    """The root run's id of the session run ``run_id`` belongs to, read from the id alone
    (:func:`replan_run_id`'s inverse; any other id is a root run's).

    >>> session_root_run_id("manual__2026-12-06T04:00:00+00:00__replan_2")
    'manual__2026-12-06T04:00:00+00:00'
    >>> session_root_run_id("manual__2026-12-06T04:00:00+00:00")
    'manual__2026-12-06T04:00:00+00:00'
    >>> session_root_run_id("nightly__replan_")
    'nightly__replan_'
    """
    root, marker, revision = run_id.rpartition("__replan_")
    return root if marker and root and revision.isascii() and revision.isdigit() else run_id


def replan_conf(state: SessionState) -> dict[str, Any]:
    """What finalize prepares for the run that plans and executes ``state`` (a session
    :func:`prepare_replan` made): its goal and the whole session (that run's conf only names it)."""
    return {"goal": state.goal, "session": state.model_dump(mode="json")}


def start_session(
    *, goal: str, budgets: Budgets | None = None, dag_id: str = "", run_id: str
) -> SessionState:
    """A new session for ``goal``, begun by run ``run_id`` (its root run)."""
    return SessionState(
        dag_id=dag_id,
        goal=goal,
        root_run_id=run_id,
        run_ids=[run_id],
        budgets=budgets or Budgets(),
    )


def continue_session(state: SessionState, *, dag_id: str = "", run_id: str) -> SessionState:
    """A replan session (prepared by :func:`~airflow_plan_provider.plan.conclusion.prepare_replan`, and
    verified by the caller to be one) as run ``run_id`` begins it."""
    return state.model_copy(deep=True, update={"run_ids": [*state.run_ids, run_id], "dag_id": dag_id})


def record_plan(
    state: SessionState,
    plan: ValidatedPlan,
    *,
    source: PlanSource = "planner",
    lanes: Mapping[str, str] | None = None,
    usage: Sequence[Mapping[str, int]] = (),
    attempts: int = 1,
    details: Mapping[str, Any] | None = None,
) -> SessionState:
    """The run's validated plan: the planner calls' token usage, then ``plan.created`` (the first plan,
    from ``source``) or the revision with its diff (``plan.diff``, a replan), then the execution order
    (locked nodes are reused, not executed) and ``plan.validated``. ``lanes``: node id -> pool lane;
    ``details``: more data for the ``plan.created`` / ``plan.diff`` event (e.g. rejected attempts)."""
    new = _record_usage(state.model_copy(deep=True), usage)
    details = dict(details or {})
    if state.current_plan is None:
        new.plan_source = source
        _add(
            new,
            "plan.created",
            nodes=len(plan.nodes),
            layers=plan.layers,
            attempts=attempts,
            source=source,
            **details,
        )
    else:
        diff = plan_diff(Plan.model_validate(state.current_plan), plan)
        new.revisions.append(
            Revision(
                revision=state.revision,
                run_id=state.source.run_id,
                reason=state.last_error or "",
                trigger_node=trigger_node(state),
                diff=diff,
            )
        )
        _add(new, "plan.diff", **diff.model_dump(), attempts=attempts, **details)
    new.current_plan = plan.as_plan().to_json_dict()
    new.lanes = dict(lanes or {})
    new.execution_order = [n for n in plan.run_order if n not in state.locked]
    _add(
        new,
        "plan.validated",
        nodes=plan.node_ids,
        layers=plan.layers,
        execute=new.execution_order,
        reuse=[n for n in plan.node_ids if n in state.locked],
        source=new.plan_source,
    )
    return new


def record_planning_failure(
    state: SessionState,
    *,
    reason: str,
    message: str,
    problems: Sequence[Mapping[str, Any]] = (),
    more_problems: int = 0,
    usage: Sequence[Mapping[str, int]] = (),
) -> SessionState:
    """No plan this run: the failed planner calls' token usage, and ``plan.failed`` (why, the first
    problems and how many more)."""
    new = _record_usage(state.model_copy(deep=True), usage)
    _add(
        new,
        "plan.failed",
        reason=reason,
        message=message,
        problems=[dict(p) for p in problems],
        more_problems=more_problems,
    )
    return new


def record_approval(state: SessionState, approval: Approval) -> SessionState:
    """An answer to an approval request, with its event (``approval.granted`` or ``approval.rejected``:
    who could answer, who did and when, which nodes)."""
    new = state.model_copy(deep=True)
    new.approvals.append(approval)
    _add(
        new,
        f"approval.{approval.status}",
        nodes=approval.nodes,
        approvers=approval.approvers,
        responded_by=approval.responded_by,
        requested_at=approval.requested_at,
        responded_at=approval.responded_at,
        timed_out=approval.timed_out,
        message=approval.message,
    )
    return new


def record_approval_not_needed(state: SessionState, approved_earlier: Iterable[str] = ()) -> SessionState:
    """The approval task asked nothing (``approval.not_needed``; risky nodes approved earlier named)."""
    new = state.model_copy(deep=True)
    _add(new, "approval.not_needed", approved_earlier=list(approved_earlier))
    return new


def record_node_outcomes(
    state: SessionState, plan: ValidatedPlan, records: Mapping[str, NodeRecord]
) -> SessionState:
    """The run's node records: executed nodes count as steps, the records join the history, their
    events join the session's (the events each node task recorded, in order, then an outcome event for
    each node whose task recorded none), and the succeeded nodes are locked with their outputs."""
    new = state.model_copy(deep=True)
    ordered = [records[n] for n in plan.node_ids if n in records]
    new.usage.steps += sum(1 for r in ordered if not r.reused and r.status is not NodeStatus.SKIPPED)
    new.history.extend(record.in_history() for record in ordered)
    new.events.extend(in_order(event for record in ordered for event in record.events))
    for record in ordered:
        if not record.events:
            kind = "node.reused" if record.reused else NODE_OUTCOMES[record.status]
            data = {"tool": record.tool, "attempt": record.attempts, "error": record.error}
            new.events.append(make_event(kind, new.source, record.node_id, **data))
    for record in ordered:
        if record.status is NodeStatus.SUCCESS and record.node_id not in new.locked:
            node = plan.node(record.node_id)
            output = None if record.artifact is not None else record.output
            new.locked[node.id] = LockedOutput(
                action=node.action,
                tool=node.tool,
                params=node.params,
                output=output,
                artifact=record.artifact,
                summary=record.output_summary or summarize(output),
            )
    return new


def run_context(state: SessionState) -> RunContext:
    """What the run's node tasks need of a session that has recorded its plan."""
    plan_nodes = {n["id"] for n in (state.current_plan or {}).get("nodes", [])}
    return RunContext(
        root_run_id=state.root_run_id,
        revision=state.revision,
        lanes=state.lanes,
        execution_order=state.execution_order,
        budgets=state.budgets,
        steps_used=state.usage.steps,
        reused=[n for n in state.locked if n in plan_nodes],
    )


def statuses_of(records: Mapping[str, NodeRecord]) -> dict[str, NodeStatus]:
    return {node_id: record.status for node_id, record in records.items()}


def trigger_node(state: SessionState) -> str | None:
    """The node whose failure (or replan request) started this revision."""
    nodes = state.failed + state.replan_requested
    return nodes[0] if nodes else None


def _record_usage(state: SessionState, calls: Sequence[Mapping[str, int]]) -> SessionState:
    """Token usage of each planner call, in the session's usage and as events (changes ``state``)."""
    for usage in calls:
        state.usage.add_tokens(dict(usage))
        _add(
            state,
            "planner.usage",
            prompt_tokens=usage.get("prompt_tokens", 0),
            completion_tokens=usage.get("completion_tokens", 0),
        )
    return state


def _add(state: SessionState, type_: str, node_id: str | None = None, /, **data: Any) -> Event:
    """Add an event of this run to ``state`` (changes ``state``: for the transitions' own copies)."""
    event = make_event(type_, state.source, node_id, **data)
    state.events.append(event)
    return event
