"""What the triggers send back to a deferred task, and the checks the task runs on it when it resumes.

An event crosses from the triggerer to a worker through the metadata database, so the method a task
resumes into can receive ``None``, a status it does not know (a trigger of another version, a custom
trigger) or a payload without the fields it reads. Each ``validate_*`` function returns the event in a
typed form or raises :class:`~airflow_plan_provider.exceptions.TriggerEventError` naming what is wrong;
an unknown status never passes as a success.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow_plan_provider.exceptions import TriggerEventError
from airflow_plan_provider.plan.waiting import Wait
from airflow_plan_provider.tools.jobs import JobOutcome as JobOutcome  # re-exported: a job event's content

JOB_STATUSES = ("done", "failed", "timeout")
#: what the parents trigger sends: every parent finished, one needs a slot again (the deferred node
#: lets go of its task's cap), or the parents run their tools (the node comes back to wait in a slot)
PARENTS_STATUSES = (Wait.READY.value, Wait.MAKE_WAY.value, Wait.WAIT.value)


def _mapping(event: object, trigger: str) -> Mapping[str, Any]:
    if event is None:
        raise TriggerEventError(f"the task resumed without an event from {trigger}")
    if not isinstance(event, Mapping):
        raise TriggerEventError(
            f"the event from {trigger} is a {type(event).__name__}, expected a mapping: {event!r:.200}"
        )
    return event


def _status(event: Mapping[str, Any], trigger: str, known: Sequence[str]) -> Any:
    status = event.get("status")
    if status not in known:
        raise TriggerEventError(
            f"the event from {trigger} has status {status!r}, expected one of {', '.join(known)}"
        )
    return status


def validate_job_event(event: object) -> JobOutcome:
    """The :class:`JobOutcome` in a :class:`~.job.ToolJobTrigger` event.

    >>> validate_job_event({"status": "done", "result": {"rows": 3}})
    JobOutcome(status='done', result={'rows': 3}, reason='')
    """
    trigger = "the job trigger"
    payload = _mapping(event, trigger)
    status = _status(payload, trigger, JOB_STATUSES)
    if status == "done":
        if "result" not in payload:
            raise TriggerEventError(f"the done event from {trigger} has no result")
        return JobOutcome("done", result=payload["result"])
    reason = payload.get("reason")
    if not isinstance(reason, str) or not reason:
        raise TriggerEventError(f"the {status} event from {trigger} has no reason (text): {reason!r:.200}")
    return JobOutcome(status, reason=reason)


def validate_parents_event(event: object) -> str:
    """The status in a :class:`~.parents.ParentsFinishedTrigger` event: ``ready``, ``make_way`` or
    ``wait``."""
    trigger = "the parents trigger"
    return str(_status(_mapping(event, trigger), trigger, PARENTS_STATUSES))


def validate_dag_state_event(event: object) -> tuple[str, str]:
    """The run id and state in a standard provider ``DagStateTrigger`` event that waited for one run.

    The event is ``(class path, data)`` (a list once it went through the database); ``data`` holds
    ``run_ids`` (one run id here) and that run id's state.

    >>> validate_dag_state_event(("DagStateTrigger", {"run_ids": ["r1"], "r1": "success"}))
    ('r1', 'success')
    """
    trigger = "the DAG run state trigger"
    if event is None:
        raise TriggerEventError(f"the task resumed without an event from {trigger}")
    if isinstance(event, str | bytes) or not isinstance(event, Sequence) or len(event) != 2:
        raise TriggerEventError(f"the event from {trigger} is not a (class path, data) pair: {event!r:.200}")
    data = _mapping(event[1], trigger)
    run_ids = data.get("run_ids")
    if not isinstance(run_ids, Sequence) or isinstance(run_ids, str) or len(run_ids) != 1:
        raise TriggerEventError(
            f"the event from {trigger} must name exactly one run in run_ids: {run_ids!r:.200}"
        )
    run_id = run_ids[0]
    state = data.get(run_id) if isinstance(run_id, str) else None
    if not isinstance(state, str) or not state:
        raise TriggerEventError(f"the event from {trigger} has no state for run {run_id!r}")
    return run_id, state


APPROVAL_ERROR_TYPES = ("timeout", "unknown", "validation")


def validate_approval_event(event: object) -> Mapping[str, Any]:
    """The standard provider's ``HITLTrigger`` event the approval task resumes with, checked.

    Either an answer (``chosen_options``: option names; ``responded_by_user``: ``{"id", "name"}`` or
    ``None`` when a timeout chose the default; ``timedout``; ``responded_at``) or an error (``error``:
    text; ``error_type``: ``timeout``, ``unknown`` or ``validation``).
    """
    trigger = "the approval trigger"
    payload = _mapping(event, trigger)
    if "error" in payload:
        if not isinstance(payload["error"], str) or payload.get("error_type") not in APPROVAL_ERROR_TYPES:
            raise TriggerEventError(
                f"the error event from {trigger} must carry the error (text) and an error_type, one of "
                f"{', '.join(APPROVAL_ERROR_TYPES)}: {dict(payload)!r:.200}"
            )
        return payload
    chosen = payload.get("chosen_options")
    if not isinstance(chosen, list) or not all(isinstance(option, str) for option in chosen):
        raise TriggerEventError(
            f"the answer from {trigger} has chosen_options {chosen!r:.200}, expected a list of option names"
        )
    user = payload.get("responded_by_user")
    if user is not None and not (isinstance(user, Mapping) and isinstance(user.get("id"), str)):
        raise TriggerEventError(
            f"the answer from {trigger} has responded_by_user {user!r:.200}, expected {{id, name}} or None"
        )
    if not isinstance(payload.get("timedout", False), bool):
        raise TriggerEventError(
            f"the answer from {trigger} has timedout {payload['timedout']!r:.50}, expected a bool"
        )
    return payload
