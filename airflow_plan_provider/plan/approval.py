"""Human approval of a plan before its nodes run: which nodes must be approved, and the request's text.

A tool declared with ``needs_approval=True`` is *risky*. A plan DAG's approval ``mode`` decides what a
revision must have approved before any of its nodes runs:

- ``"never"``: nothing;
- ``"risky"``: the risky nodes the revision would execute;
- ``"always"``: every node the revision would execute.

A call (node id, tool and declared params) approved once in a session is not asked about again, and a
locked node (succeeded earlier) is reused, never re-run. So a replan that only reuses approved or locked
nodes runs without waiting, and one that adds or revises such a node asks again, for those nodes only::

    >>> from airflow_plan_provider.plan.model import Plan
    >>> plan = Plan.model_validate({"nodes": [
    ...     {"id": "1", "action": "read", "tool": "query", "params": {}},
    ...     {"id": "2", "action": "purge", "tool": "purge", "params": {"table": "t"}}]})
    >>> nodes_to_approve(plan, risky_tools={"purge"}, mode="risky")
    ['2']
    >>> granted = Approval(status="granted", nodes=["2"], calls=approved_calls(plan, ["2"]))
    >>> nodes_to_approve(plan, risky_tools={"purge"}, mode="risky", approvals=[granted])
    []

An answer other than "approve" — a rejection, or no answer before the timeout — ends the session with
reason ``rejected`` before any node of the revision runs.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, Literal

from pydantic import Field

from airflow_plan_provider.base_model import Model
from airflow_plan_provider.plan.model import Node, Plan

ApprovalMode = Literal["risky", "always", "never"]
APPROVAL_MODES: tuple[ApprovalMode, ...] = ("risky", "always", "never")

MAX_PARAMS_CHARS = 4000  # of one node's params in the request text
MAX_BODY_CHARS = 60_000  # of the whole request text


def call_digest(node: Node) -> str:
    """SHA-256 of a node's call (tool and declared params): what an approval approves."""
    call = json.dumps({"tool": node.tool, "params": node.params}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(call.encode("utf-8", "surrogatepass")).hexdigest()


def approved_calls(plan: Plan, node_ids: Iterable[str]) -> dict[str, str]:
    """Node id → call digest, for the given nodes of ``plan`` (what a granted approval records)."""
    return {node_id: call_digest(plan.node(node_id)) for node_id in node_ids}


class Approval(Model):
    """One answer to an approval request: which nodes were asked about, who could answer, who did, when.

    ``status`` is ``granted`` or ``rejected`` (a timeout is a rejection, with ``timed_out`` set and no
    ``responded_by``). ``calls`` holds the digests of the approved calls (:func:`call_digest`), so a
    later revision knows which nodes it need not ask about again.
    """

    revision: int = 0
    run_id: str = ""
    status: Literal["granted", "rejected"]
    nodes: list[str] = Field(default_factory=list)
    calls: dict[str, str] = Field(default_factory=dict)
    approvers: list[str] = Field(default_factory=list)  # who may answer; empty: any user allowed to
    responded_by: str | None = None
    requested_at: str | None = None
    responded_at: str | None = None
    timed_out: bool = False
    message: str = ""


def nodes_to_approve(
    plan: Plan,
    *,
    risky_tools: Collection[str],
    mode: ApprovalMode,
    approvals: Iterable[Approval] = (),
    locked: Collection[str] = (),
) -> list[str]:
    """Ids of the nodes of ``plan`` that must be approved before the revision runs, in plan order.

    Empty when nothing needs asking: the mode is ``never``; or every node the mode covers (risky ones,
    or all for ``always``) is locked (reused, not run) or was approved earlier in the session with the
    same tool and params.
    """
    if mode == "never":
        return []
    if mode not in APPROVAL_MODES:
        raise ValueError(f"approval mode must be one of {APPROVAL_MODES}, not {mode!r}")
    approved = {
        (node_id, digest)
        for approval in approvals
        if approval.status == "granted"
        for node_id, digest in approval.calls.items()
    }
    return [
        node.id
        for node in plan.nodes
        if node.id not in locked
        and (mode == "always" or node.tool in risky_tools)
        and (node.id, call_digest(node)) not in approved
    ]


def _fence(text: str) -> str:
    """A Markdown code fence longer than any run of backticks in ``text`` (the text cannot close it)."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _cell(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").replace("`", "'")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text) - limit} more characters)"


def request_text(
    plan: Plan,
    asked: Sequence[str],
    *,
    risky_tools: Collection[str],
    revision: int = 0,
    run_id: str = "",
    locked: Collection[str] = (),
    redact: Callable[[Any, str], Any] | None = None,
) -> tuple[str, str]:
    """The subject and Markdown body of an approval request for the nodes ``asked``.

    The body names the goal and revision, lists every node of the plan (its tool, whether it is risky,
    asked about, locked or approved earlier), then shows each asked node's params as JSON. Params pass
    through ``redact(value, key)`` first (the caller's secrets masker), and a param whose key looks like
    a secret is hidden even without one. Plan text is untrusted: it is escaped in table cells and
    fenced so it cannot close its code block.
    """
    asked_set = set(asked)
    subject = (
        f"Approve {len(asked)} node(s) of revision {revision} before they run"
        if revision
        else f"Approve {len(asked)} node(s) of this plan before they run"
    )
    lines = [f"**Goal:** {_cell(plan.goal) or '(none)'}", ""]
    lines.append(f"Revision {revision}" + (f" (run `{_cell(run_id)}`)" if run_id else "") + ".")
    lines += [
        "Approve to run the plan; reject (or no answer before the timeout) ends the session as "
        "`rejected` and no node runs.",
        "",
        "| node | action | tool | approval |",
        "|---|---|---|---|",
    ]
    for node in plan.nodes:
        if node.id in asked_set:
            flag = "**approval needed**" + (" (risky)" if node.tool in risky_tools else "")
        elif node.id in locked:
            flag = "locked (reused, not run)"
        elif node.tool in risky_tools:
            flag = "risky, approved earlier"
        else:
            flag = "not needed"
        lines.append(f"| {_cell(node.id)} | {_cell(node.action)} | {_cell(node.tool)} | {flag} |")
    for node_id in asked:
        node = plan.node(node_id)
        params = _clip(json.dumps(hide_secrets(node.params, redact), indent=2, default=str), MAX_PARAMS_CHARS)
        fence = _fence(params)
        lines += ["", f"### Node {_cell(node.id)}: {_cell(node.action)} ({_cell(node.tool)})", ""]
        lines += [f"{fence}json", params, fence]
    return subject, _clip("\n".join(lines), MAX_BODY_CHARS)


SENSITIVE_KEY_PARTS = (
    "access_token",
    "api_key",
    "apikey",
    "authorization",
    "credential",
    "passphrase",
    "passwd",
    "password",
    "private_key",
    "secret",
    "token",
    "keyfile_dict",
    "service_account",
)
HIDDEN = "***"


def is_sensitive_key(key: str) -> bool:
    """Whether a param named ``key`` likely holds a secret (the names Airflow's secrets masker hides)."""
    lowered = key.lower().replace("-", "_")
    return any(part in lowered for part in SENSITIVE_KEY_PARTS)


def hide_secrets(value: Any, redact: Callable[[Any, str], Any] | None = None, key: str = "") -> Any:
    """``value`` with secrets hidden: values under sensitive keys become ``***`` (recursively), and the
    rest pass through ``redact(value, key)`` when given (which hides registered secret values)."""
    if key and is_sensitive_key(key):
        return HIDDEN
    if isinstance(value, Mapping):
        return {k: hide_secrets(v, redact, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [hide_secrets(v, redact, key) for v in value]
    return redact(value, key) if redact is not None else value


__all__ = [
    "APPROVAL_MODES",
    "Approval",
    "ApprovalMode",
    "approved_calls",
    "call_digest",
    "hide_secrets",
    "is_sensitive_key",
    "nodes_to_approve",
    "request_text",
]
