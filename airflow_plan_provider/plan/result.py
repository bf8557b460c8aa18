"""What a plan session reports: node records, events, revisions and the final SessionResult."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from airflow_plan_provider.plan.budgets import Usage
from airflow_plan_provider.plan.replan import PlanDiff

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
]


def summarize(value: Any, limit: int = SUMMARY_CHARS) -> str:
    """A short, bounded text of an output, for prompts, events and the UI."""
    text = value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)
    return text if len(text) <= limit else f"{text[: limit - 20]}… ({len(text)} chars)"


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class Event(BaseModel):
    type: str  # plan.created, plan.diff, node.succeeded, node.failed, node.skipped, node.reused, ...
    at: str = Field(default_factory=now)
    revision: int = 0
    node_id: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)


class ArtifactRef(BaseModel):
    """A large output the provider stored in its artifact store: where, how many bytes, which sha256.

    Only this model, in a record's or a locked node's ``artifact`` field, is ever dereferenced; a tool
    output that happens to look like it is plain data.
    """

    uri: str
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    summary: str = ""


class NodeRecord(BaseModel):
    """The outcome of one node in one revision.

    ``artifact`` is set when the output was too large for XCom and the provider stored it (the record's
    ``output`` is then empty); ``hostname`` names the worker that ran the node's task.
    """

    node_id: str
    revision: int = 0
    action: str = ""
    tool: str = ""
    status: Literal["success", "failed", "skipped"]
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


class Revision(BaseModel):
    revision: int
    run_id: str
    reason: str
    trigger_node: str | None = None
    diff: PlanDiff


class SessionResult(BaseModel):
    status: Literal["completed", "failed"]
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

    def summary_text(self) -> str:
        """A few readable lines for logs and the command line."""
        lines = [f"status: {self.status} ({self.reason})", f"goal: {self.goal}"]
        if self.message:
            lines.append(f"message: {self.message}")
        lines.append(
            f"runs: {len(self.run_ids)}  replans: {self.usage.replans}  steps: {self.usage.steps}  "
            f"tokens: {self.usage.prompt_tokens}+{self.usage.completion_tokens}"
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
