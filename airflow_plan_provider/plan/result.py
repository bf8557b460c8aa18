"""What a plan session reports: node records, events, revisions and the final SessionResult."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import Field, field_validator

from airflow_plan_provider.base_model import Model
from airflow_plan_provider.plan.approval import Approval
from airflow_plan_provider.plan.budgets import Usage
from airflow_plan_provider.plan.decisions import NodeStatus
from airflow_plan_provider.plan.merge import PlanDiff

SUMMARY_CHARS = 400

Reason = Literal[
    "goal_met",
    "node_failed",
    "step_budget",
    "replan_budget",
    "no_plan",
    "invalid_plan",
    "planner_unavailable",
    "replan_failed",
    "untrusted_session",
    "replan_requested",
    "replan_unavailable",
    "rejected",  # the plan was not approved (rejected, or no answer before the approval timeout)
]


def summarize(value: Any, limit: int = SUMMARY_CHARS) -> str:
    """A short, bounded text of an output, for prompts, events and the UI."""
    text = value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)
    return text if len(text) <= limit else f"{text[: limit - 20]}… ({len(text)} chars)"


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class Event(Model):
    """One state change of a session (built by :func:`airflow_plan_provider.plan.events.make_event`)."""

    type: str  # see airflow_plan_provider.plan.events.EVENT_TYPES
    at: str = Field(default_factory=now)
    dag_id: str = ""
    run_id: str = ""
    root_run_id: str = ""
    revision: int = 0
    node_id: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)


class ArtifactRef(Model):
    """A large output the provider stored in its artifact store: where, how many bytes, which sha256.

    Only this model, in a record's or a locked node's ``artifact`` field, is ever dereferenced; a tool
    output that happens to look like it is plain data.
    """

    uri: str
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    summary: str = ""


class NodeRecord(Model):
    """The outcome of one node in one revision: what its task pushes (XCom ``node``), and what the
    session's history keeps of it.

    ``artifact`` is set when the output was too large for XCom and the provider stored it (``output`` is
    then empty); ``hostname`` names the worker that ran the node's task. ``output``, ``events``,
    ``checkpoint`` and the timestamps travel with the pushed record (:meth:`pushed`) but are not kept
    in the history.
    """

    node_id: str
    revision: int = 0
    action: str = ""
    tool: str = ""
    status: NodeStatus
    reused: bool = False
    attempts: int = 0
    missing_inputs: list[str] = Field(default_factory=list)
    replan_requested: bool = False
    budget_exhausted: bool = False
    error: str | None = None
    output_summary: str | None = None
    polling: dict[str, Any] | None = None  # an asynchronous job: handle, since, until, outcome
    artifact: ArtifactRef | None = None
    hostname: str | None = None
    duration_s: float | None = None  # of the try that counted: the tool call (and its job), in seconds
    # the tool's data (a succeeded node whose output was not stored as an artifact)
    output: Any = Field(default=None, exclude=True)
    checkpoint: bool = Field(default=False, exclude=True)  # reused from this revision's checkpoint
    started_at: str | None = Field(default=None, exclude=True)
    ended_at: str | None = Field(default=None, exclude=True)
    # the node task's events of this try, in order; carried to the session's events, not to the history
    events: list[Event] = Field(default_factory=list, exclude=True)

    @field_validator("status")
    @classmethod
    def _finished(cls, status: NodeStatus) -> NodeStatus:
        if not status.finished:
            raise ValueError(f"a node record's status is success, failed or skipped, not {status.value!r}")
        return status

    def pushed(self) -> dict[str, Any]:
        """The record as its node task pushes it: every field, as JSON values."""
        return {
            **self.model_dump(mode="json"),
            "output": self.output,
            "checkpoint": self.checkpoint,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "events": [event.model_dump(mode="json") for event in self.events],
        }

    def in_history(self) -> NodeRecord:
        """The record as the session's history keeps it (no output, no events)."""
        return self.model_copy(
            update={"output": None, "events": [], "checkpoint": False, "started_at": None, "ended_at": None}
        )


class Revision(Model):
    revision: int
    run_id: str
    reason: str
    trigger_node: str | None = None
    diff: PlanDiff


class ReplanInfo(Model):
    """What a run that ended by replanning asked for, and where the session goes on.

    The session's outcome is the ``return_value`` XCom of this run's ``replan`` task (the root run's
    ``replan`` task reports the whole chain).
    """

    revision: int  # the revision the replan run plans and executes
    run_id: str  # that run's id
    trigger_node: str | None = None
    failed: dict[str, str] = Field(default_factory=dict)  # node id -> its error
    # node id -> why its result made the rest of the plan moot
    replan_requested: dict[str, str] = Field(default_factory=dict)
    chain_result: str = "XCom return_value of task 'replan' in this run"


class SessionResult(Model):
    """What a run reports (XCom ``return_value`` of ``finalize``), or a whole chain (of ``replan``).

    ``status`` is ``completed`` or ``failed`` for a session's outcome, ``replanned`` for a run that
    handed over to a replan run (``replan`` says which node asked for it, why, and which run goes on).
    """

    status: Literal["completed", "failed", "replanned"]
    reason: Reason
    goal: str = ""
    root_run_id: str = ""
    run_ids: list[str] = Field(default_factory=list)
    history: list[NodeRecord] = Field(default_factory=list)
    revisions: list[Revision] = Field(default_factory=list)
    events: list[Event] = Field(default_factory=list)
    outputs: dict[str, Any] = Field(default_factory=dict)
    usage: Usage = Field(default_factory=Usage)
    message: str = ""
    replan: ReplanInfo | None = None
    approvals: list[Approval] = Field(default_factory=list)  # answers to approval requests, in order

    def summary_text(self) -> str:
        """A few readable lines for logs and the command line."""
        lines = [f"status: {self.status} ({self.reason})", f"goal: {self.goal}"]
        if self.message:
            lines.append(f"message: {self.message}")
        if self.replan is not None:
            lines.append(f"continues in run {self.replan.run_id} (revision {self.replan.revision})")
        lines.append(
            f"runs: {len(self.run_ids)}  replans: {self.usage.replans}  steps: {self.usage.steps}  "
            f"tokens: {self.usage.prompt_tokens}+{self.usage.completion_tokens}"
        )
        for approval in self.approvals:
            who = approval.responded_by or ("nobody (timed out)" if approval.timed_out else "nobody")
            lines.append(
                f"approval of revision {approval.revision}: {approval.status} by {who} "
                f"for nodes {approval.nodes}"
            )
        for revision in self.revisions:
            d = revision.diff
            lines.append(
                f"revision {revision.revision} ({revision.reason}): removed {d.removed} added {d.added} "
                f"revised {d.revised}"
            )
        last: dict[str, NodeRecord] = {}
        for record in self.history:
            last[record.node_id] = record
        for record in last.values():
            flag = " (reused)" if record.reused else ""
            detail = record.error or record.output_summary or ""
            lines.append(
                f"  node {record.node_id} [{record.tool}] {record.status}{flag}: {summarize(detail, 120)}"
            )
        return "\n".join(lines)
