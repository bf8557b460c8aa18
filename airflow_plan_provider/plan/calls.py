"""One node's call of its tool: the idempotency key it carries, and the params it is called with.

The node step (:mod:`airflow_plan_provider.plan.node_step`), which the plan DAG's node tasks and the local
runner both run, makes keys and params with these functions only, so a node gets the same key and the same
params wherever it runs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from airflow_plan_provider.plan.model import Node
from airflow_plan_provider.plan.references import MissingInput, resolve
from airflow_plan_provider.tools.tool import Tool


class CallRefused(ValueError):
    """The node's params cannot be made into a valid call: a reference does not resolve, or the resolved
    params break the tool's argument schema. Retrying cannot help; the message names the param at fault."""


def idempotency_key(dag_id: str, root_run_id: str, node_id: str, tool: str, params: Any) -> str:
    """The key of one node's call in one session: ``dag/root run/node/<hash of tool and params>``.

    The same for every try, and for every revision in which the node is unchanged (same tool, same
    declared params), so a side effect done before a failure is not repeated after a replan; different
    as soon as a revision changes the node's call.

    >>> idempotency_key("d", "run1", "n", "query", {"day": 1}) == idempotency_key(
    ...     "d", "run1", "n", "query", {"day": 1})
    True
    """
    call = json.dumps({"tool": tool, "params": params}, sort_keys=True, separators=(",", ":"))
    return f"{dag_id}/{root_run_id}/{node_id}/{hashlib.sha256(call.encode()).hexdigest()[:16]}"


def key_scope(dag_id: str, group: str = "") -> str:
    """The scope of a plan's idempotency keys: its DAG's id, and the task group's when the plan runs in
    one (``dag:group``: two plans of one DAG in two groups are two sessions, whose keys never meet).

    >>> key_scope("reports"), key_scope("reports", "weekly")
    ('reports', 'reports:weekly')
    """
    return f"{dag_id}:{group}" if group else dag_id


def node_key(scope: str, root_run_id: str, node: Node) -> str:
    """The idempotency key of ``node``'s call in the session of ``root_run_id`` within ``scope``
    (:func:`key_scope`): the one rule every host follows."""
    return idempotency_key(scope, root_run_id, node.id, node.tool, node.params)


def call_params(node: Node, tool: Tool, outputs: Mapping[str, Any]) -> Any:
    """``node``'s params with its references resolved against ``outputs`` (the succeeded parents'
    outputs by node id), checked against ``tool``'s argument schema.

    A reference to a parent absent from ``outputs`` (an optional parent that did not succeed) reaches
    the tool as ``None``; the tool learns which inputs are missing from ``ToolContext.missing_inputs``.
    Raises :class:`CallRefused` naming the reference or the params at fault.
    """
    try:
        params = _without_missing(resolve(node.params, outputs))
    except LookupError as error:  # UnresolvedReference, ParamsTooNested
        raise CallRefused(str(error)) from error
    bad = [
        f"{'.'.join(map(str, e.absolute_path)) or 'params'}: {e.message}"
        for e in tool.validator.iter_errors(params)
    ]
    if bad:
        raise CallRefused(
            f"params for tool {tool.name!r} are invalid after resolving references: {'; '.join(bad)}"
        )
    return params


def _without_missing(value: Any) -> Any:
    if isinstance(value, MissingInput):
        return None
    if isinstance(value, dict):
        return {k: _without_missing(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_missing(v) for v in value]
    return value
