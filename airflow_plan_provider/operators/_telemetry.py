"""Where the session's events leave a task: a JSON line in the task log, Airflow Stats metrics, and
OpenTelemetry spans when Airflow's tracing is on.

Metrics (names under Airflow's ``[metrics] statsd_prefix``; tags ``dag_id`` and, for nodes, ``tool``):

* ``plan.node.succeeded`` / ``.failed`` / ``.skipped`` / ``.reused`` / ``.retrying`` / ``.polling``
  (counters, one per node event) and ``plan.node.duration`` (timer, ms, for nodes that called a tool);
* ``plan.planner.calls``, ``plan.planner.prompt_tokens``, ``plan.planner.completion_tokens``;
* ``plan.replans``, ``plan.budget_exhausted``, ``plan.planning_failed``,
  ``plan.session.completed`` / ``.failed``.

Spans (only with ``[traces] otel_on``): ``plan.planning`` (the planner calls and validation) and
``plan.node`` (one tool call), children of the span Airflow opens for the task; each event is added
to the current span as a span event.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from airflow_plan_provider.plan.events import event_line
from airflow_plan_provider.plan.result import Event

NODE_COUNTERS = {
    "node.succeeded": "plan.node.succeeded",
    "node.failed": "plan.node.failed",
    "node.skipped": "plan.node.skipped",
    "node.reused": "plan.node.reused",
    "node.retrying": "plan.node.retrying",
    "node.polling": "plan.node.polling",
}


def emit(log: Any, event: Event) -> None:
    """Publish one event: its JSON line in the task log, its metrics, and a span event."""
    log.info("%s", event_line(event))
    try:
        record_metrics(event)
    except Exception as error:  # metrics must never fail a node
        log.warning("could not send metrics for event %s: %s", event.type, error)
    _span_event(event)


def record_metrics(event: Event) -> None:
    """The Stats metrics of one event (see the module docstring)."""
    from airflow_plan_provider.airflow_features import stats as airflow_stats

    stats = airflow_stats()

    data = event.data
    tags: dict[str, Any] = {"dag_id": event.dag_id}
    if event.type in NODE_COUNTERS:
        tags["tool"] = data.get("tool") or ""
        stats.incr(NODE_COUNTERS[event.type], tags=tags)
        if isinstance(data.get("duration_s"), int | float):
            stats.timing("plan.node.duration", timedelta(seconds=data["duration_s"]), tags=tags)
    elif event.type == "planner.usage":
        stats.incr("plan.planner.calls", tags=tags)
        for kind in ("prompt_tokens", "completion_tokens"):
            if int(data.get(kind) or 0) > 0:
                stats.incr(f"plan.planner.{kind}", count=int(data[kind]), tags=tags)
    elif event.type == "replan.requested":
        stats.incr("plan.replans", tags=tags)
    elif event.type == "budget.exhausted":
        stats.incr("plan.budget_exhausted", tags={**tags, "budget": data.get("budget", "")})
    elif event.type == "plan.failed":
        stats.incr("plan.planning_failed", tags=tags)
    elif event.type == "session.finished" and data.get("status") in ("completed", "failed"):
        stats.incr(f"plan.session.{data['status']}", tags=tags)


def tracing_on() -> bool:
    """Whether Airflow's OpenTelemetry tracing is on (``[traces] otel_on``)."""
    from airflow_plan_provider.airflow_features import sdk_conf

    return bool(sdk_conf().getboolean("traces", "otel_on", fallback=False))


@contextmanager
def span(name: str, **attributes: Any) -> Iterator[None]:
    """A span ``name`` under the current (task) span when tracing is on; nothing otherwise."""
    if not tracing_on():
        yield
        return
    from opentelemetry import trace

    tracer = trace.get_tracer("airflow_plan_provider")
    clean = {f"plan.{k}": v for k, v in attributes.items() if isinstance(v, str | bool | int | float)}
    with tracer.start_as_current_span(name, attributes=clean):
        yield


def _span_event(event: Event) -> None:
    if not tracing_on():
        return
    from opentelemetry import trace

    current = trace.get_current_span()
    if current.is_recording():
        attributes: dict[str, str | int] = {"plan.revision": event.revision, "plan.run_id": event.run_id}
        if event.node_id is not None:
            attributes["plan.node_id"] = event.node_id
        current.add_event(event.type, attributes=attributes)
