"""How a run reports to its readers (the replan task, the test helpers, scripts): one rule each.

The session's outcome: a run's own result is ``finalize``'s ``return_value``. When that result is
``replanned``, the run handed over to its next revision, and the session's outcome is the
``return_value`` of the run's ``replan`` task, which reports the rest of the chain (completed, or
failed and why).

A node's state: each node is one instance of a mapped node task, labelled ``"<node id> · <action>"``
in the grid (its rendered map index). Reading states by label does not depend on how nodes are laid
out over tasks; an instance that never started has no label.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from airflow_plan_provider.operators.layout import FINALIZE_TASK, REPLAN_TASK
from airflow_plan_provider.plan.result import SessionResult

#: Between the node id and the action in a node instance's label (node ids have no spaces).
LABEL_SEPARATOR = " · "


def node_label(node_id: str, action: str) -> str:
    """The label of a node's task instance."""
    return f"{node_id}{LABEL_SEPARATOR}{action}"


def labelled_node(label: str | None) -> str | None:
    """The node id a task instance's label names, or None for an unlabelled instance."""
    return label.split(LABEL_SEPARATOR, 1)[0] if label else None


def as_result(value: Any) -> SessionResult | None:
    """``value`` as a :class:`SessionResult`, or None when it is missing or is not one."""
    if not isinstance(value, dict):
        return None
    try:
        return SessionResult.model_validate(value)
    except ValidationError:
        return None


def session_outcome(read: Callable[[str], Any]) -> SessionResult | None:
    """The outcome of the session as one run reports it.

    :param read: ``task_id`` → that task's ``return_value`` XCom in the run (None when it has none).
    :return: ``finalize``'s result, or, when the run replanned, its ``replan`` task's result for the
        rest of the chain; None while the run (or the rest of its chain) has not reported yet.
    """
    result = as_result(read(FINALIZE_TASK))
    if result is None or result.status != "replanned":
        return result
    return as_result(read(REPLAN_TASK))
