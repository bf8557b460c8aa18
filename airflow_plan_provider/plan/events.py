"""The session's events: one builder for every event, whoever records it.

An event is one state change of a session, stamped with where it happened (DAG, run, root run,
revision, node)::

    {"type": "node.succeeded", "at": "2025-01-01T12:00:00.000+00:00", "dag_id": "plan_and_execute",
     "run_id": "manual__...", "root_run_id": "manual__...", "revision": 0, "node_id": "3",
     "data": {"tool": "query_deploys", "attempt": 1, "duration_s": 0.12, ...}}

Types (:data:`EVENT_TYPES`): the planning task records ``planner.usage`` (one per planner call),
``plan.created``, ``plan.diff`` (replan runs), ``plan.validated`` or ``plan.failed``; each node task
records ``node.started`` then one of ``node.succeeded`` / ``node.failed`` / ``node.skipped`` /
``node.reused`` (``node.polling`` while an asynchronous job runs, ``node.retrying`` when a try failed
and Airflow retries it); finalize records ``replan.requested``, ``budget.exhausted`` and
``session.finished``, and the answer of an approval task: ``approval.granted``, ``approval.rejected``
(or ``approval.not_needed`` when it asked nothing). A retried node's earlier tries are in its task
log only: the SessionResult keeps the events of the try that counted.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from airflow_plan_provider.plan.decisions import NodeStatus
from airflow_plan_provider.plan.result import Event, NodeRecord

EVENT_TYPES = (
    "planner.usage",
    "plan.created",
    "plan.diff",
    "plan.validated",
    "plan.failed",
    "node.started",
    "node.polling",
    "node.retrying",
    "node.succeeded",
    "node.failed",
    "node.skipped",
    "node.reused",
    "replan.requested",
    "budget.exhausted",
    "session.finished",
    "approval.granted",
    "approval.rejected",
    "approval.not_needed",
)
NODE_OUTCOMES = {
    NodeStatus.SUCCESS: "node.succeeded",
    NodeStatus.FAILED: "node.failed",
    NodeStatus.SKIPPED: "node.skipped",
}


@dataclass(frozen=True)
class EventSource:
    """Where events happen: the identifiers every event of one task carries."""

    dag_id: str = ""
    run_id: str = ""
    root_run_id: str = ""
    revision: int = 0


def make_event(type_: str, source: EventSource, node_id: str | None = None, /, **data: Any) -> Event:
    """The one way an event is built (``type_`` must be one of :data:`EVENT_TYPES`).

    >>> make_event("node.started", EventSource("d", "r", "r", 0), "1", tool="t").node_id
    '1'
    """
    if type_ not in EVENT_TYPES:
        raise ValueError(f"unknown event type {type_!r}; known: {', '.join(EVENT_TYPES)}")
    return Event(
        type=type_,
        dag_id=source.dag_id,
        run_id=source.run_id,
        root_run_id=source.root_run_id,
        revision=source.revision,
        node_id=node_id,
        data=data,
    )


def event_line(event: Event) -> str:
    """The event as one compact JSON line (the form it takes in task logs)."""
    return json.dumps(event.model_dump(mode="json"), separators=(",", ":"), default=str)


def in_order(events: Iterable[Event]) -> list[Event]:
    """Events by time (ties keep their order: a node's events are recorded in sequence)."""
    return sorted(events, key=lambda event: event.at)


# what a node's outcome event tells of its record (the fields that are set)
OUTCOME_DETAILS = (
    "duration_s",
    "error",
    "output_summary",
    "missing_inputs",
    "replan_requested",
    "budget_exhausted",
    "checkpoint",
)


def outcome_event(record: NodeRecord, source: EventSource, attempt: int) -> Event:
    """The event of how a node ended: ``node.succeeded``, ``node.failed``, ``node.skipped`` (its
    ``reason``: why it was skipped; nothing went wrong in it) or ``node.reused``, with the record's
    details that are set and, for an output the provider stored, the artifact's URI."""
    kind = "node.reused" if record.reused else NODE_OUTCOMES[record.status]
    # "is": a duration of 0.0 s equals False, and is a figure all the same
    values = {k: getattr(record, k) for k in OUTCOME_DETAILS}
    details = {k: v for k, v in values.items() if v is not None and v is not False and v != []}
    if record.status is NodeStatus.SKIPPED and "error" in details:
        details["reason"] = details.pop("error")
    if record.artifact is not None:
        details["artifact_uri"] = record.artifact.uri
    return make_event(kind, source, record.node_id, tool=record.tool, attempt=attempt, **details)
