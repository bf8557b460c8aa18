"""What the plan view shows, assembled from a session's runs: plain data in, a JSON document out.

A session is a chain of runs of one DAG: the root run (revision 0) and one replan run per revision,
``<root>__replan_<n>``. For each run the view needs what its tasks left behind: the ``plan`` task's
XComs ``plan`` and ``session``, each node task's ``node`` record, ``finalize``'s result and replan
conf, and the state of every task instance. :class:`RunData` holds that for one run (the API server
reads it from the metadata database, see :mod:`.store`); :func:`session_chain` picks the runs that
belong to the session; :func:`plan_view` turns them into the document the page draws.

Only what the provider itself recorded joins the chain: a run whose id looks like a replan run's joins
only when its own verified session (or, before its planning task ran, its parent's prepared replan)
names the same root, revision and parent.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import quote

from pydantic import ValidationError

from airflow_plan_provider.contract import (
    FINALIZE_TASK,
    NODE_KEY,
    PLAN_KEY,
    PLAN_TASK,
    PLANNING_ERROR_KEY,
    REPLAN_CONF_KEY,
    REPLAN_TASK,
    RESULT_KEY,
    SESSION_KEY,
    TOOLS_KEY,
    node_location,
    session_outcome,
)
from airflow_plan_provider.plan.budgets import Budgets
from airflow_plan_provider.plan.decisions import NodeStatus
from airflow_plan_provider.plan.model import ValidatedPlan
from airflow_plan_provider.plan.phases import node_phase
from airflow_plan_provider.plan.references import MissingInput, UnresolvedReference, resolve
from airflow_plan_provider.plan.result import summarize
from airflow_plan_provider.plan.session import RunContext, replan_run_id
from airflow_plan_provider.plugins.document import document_of
from airflow_plan_provider.tools.sources import ToolListing, listing_of
from airflow_plan_provider.tools.tool import ToolOrigin

#: The XComs the view reads, as (task id, key); node records are every ``node`` XCom of the run.
XCOM_KEYS: tuple[tuple[str, str], ...] = (
    (PLAN_TASK, PLAN_KEY),
    (PLAN_TASK, SESSION_KEY),
    (PLAN_TASK, PLANNING_ERROR_KEY),
    (PLAN_TASK, TOOLS_KEY),
    (FINALIZE_TASK, RESULT_KEY),
    (FINALIZE_TASK, REPLAN_CONF_KEY),
    (REPLAN_TASK, RESULT_KEY),
)
MAX_CHAIN = 50  # replan runs looked for after a root, whatever its budget says
PARAM_CHARS = 2000  # a resolved param longer than this (as JSON) is shown summarized
FINISHED_RUN_STATES = frozenset({"success", "failed"})
#: A mapped task in one of these states before it expanded has no instance for any node: none of them runs.
UNEXPANDED_END_STATES = frozenset({"skipped", "upstream_failed", "removed"})
#: The state shown for a node whose task instance never ran: the run is over (or its node task ended
#: before it expanded, e.g. upstream_failed after a rejected approval) and the node has no state of its
#: own.
NOT_RUN = "not_run"

Redact = Callable[[Any], Any]


@dataclass
class RunData:
    """What one run of a plan DAG left behind, as read from Airflow.

    ``xcoms`` maps ``(task_id, map_index, key)`` to the value as the task pushed it; ``tis`` maps
    ``(task_id, map_index)`` to the task instance's ``state``, ``try_number``, ``start_date``,
    ``end_date``, ``duration`` (seconds) and ``hostname``. ``xcom`` and ``ti`` take the plan's own task
    ids (``plan``, ``nodes``) and add ``prefix`` when the plan runs in a task group.
    """

    run_id: str
    prefix: str = ""  # the plan's task group prefix (``triage.``), "" for a plan DAG
    state: str | None = None
    start_date: str | None = None
    end_date: str | None = None
    note: str | None = None
    xcoms: dict[tuple[str, int, str], Any] = field(default_factory=dict)
    tis: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)

    def xcom(self, task_id: str, key: str) -> Any:
        return self.xcoms.get((self.prefix + task_id, -1, key))

    def ti(self, task_id: str, map_index: int = -1) -> dict[str, Any] | None:
        return self.tis.get((self.prefix + task_id, map_index))

    @property
    def session(self) -> dict[str, Any] | None:
        value = self.xcom(PLAN_TASK, SESSION_KEY)
        return value if isinstance(value, dict) else None

    @property
    def records(self) -> dict[str, dict[str, Any]]:
        """Node id → the record its task pushed."""
        found: dict[str, dict[str, Any]] = {}
        for (task, _index, key), value in sorted(self.xcoms.items(), key=lambda item: item[0][:2]):
            if not task.startswith(self.prefix):  # another plan group's node
                continue
            if key == NODE_KEY and isinstance(value, dict) and isinstance(value.get("node_id"), str):
                found[value["node_id"]] = value
        return found


def root_of(run: RunData) -> tuple[str, int]:
    """The root run id the run's own session names, and how many replan runs to look for after it."""
    session = run.session or {}
    root = session.get("root_run_id") or run.run_id
    budgets = session.get("budgets") or {}
    max_replans = budgets.get("max_replans") if isinstance(budgets, dict) else None
    count = max_replans if isinstance(max_replans, int) and max_replans >= 0 else Budgets().max_replans
    return str(root), min(count, MAX_CHAIN)


def chain_candidates(root: str, max_replans: int) -> list[str]:
    """The run ids a session rooted at ``root`` may have, in order."""
    return [root] + [replan_run_id(root, revision) for revision in range(1, max_replans + 1)]


def session_chain(opened: str, runs: Mapping[str, RunData]) -> list[RunData]:
    """The runs of the session ``opened`` belongs to, root first, as far as they are verified.

    ``runs`` holds the opened run and the candidates of its root (:func:`chain_candidates`). A run
    that is not part of a verified chain is shown alone.
    """
    root_id, _count = root_of(runs[opened])
    root = runs.get(root_id)
    chain: list[RunData] = []
    if root is not None and (root.session or {}).get("root_run_id", root_id) == root_id:
        chain.append(root)
        revision = 1
        while (child := runs.get(replan_run_id(root_id, revision))) is not None:
            if not _is_child(chain[-1], child, root_id, revision):
                break
            chain.append(child)
            revision += 1
    if all(run.run_id != opened for run in chain):
        return [runs[opened]]
    return chain


def _is_child(parent: RunData, child: RunData, root: str, revision: int) -> bool:
    session = child.session
    if session is not None:
        return (
            session.get("root_run_id") == root
            and session.get("revision") == revision
            and session.get("parent_run_id") == parent.run_id
        )
    # not planned yet: the run its parent's replan task starts
    prepared = parent.xcom(FINALIZE_TASK, REPLAN_CONF_KEY)
    prepared_session = prepared.get("session") if isinstance(prepared, dict) else None
    return isinstance(prepared_session, dict) and prepared_session.get("revision") == revision


def plan_view(
    dag_id: str,
    opened: str,
    chain: Sequence[RunData],
    *,
    redact: Redact = lambda value: value,
    ui_base: str = "",
    view_base: str = "",
    tab_route: str | None = None,
) -> dict[str, Any]:
    """The plan view's document for run ``opened`` of ``dag_id``, from the session's runs (root first).

    ``redact`` hides secrets in params (Airflow's secrets masker in the API server); ``ui_base`` and
    ``view_base`` prefix the links to a run's page in the Airflow UI and to its plan view; with
    ``tab_route`` (the Plan tab's route under a run's page), each run also links to its page with the
    Plan tab open (``tab_url``): the page inside the tab leads there, the whole window following.
    """
    runs: list[dict[str, Any]] = []
    previous_plan: ValidatedPlan | None = None
    for index, run in enumerate(chain):
        view = _run_view(run, index, previous_plan, redact)
        view["parent_run_id"] = chain[index - 1].run_id if index else None
        view["child_run_id"] = chain[index + 1].run_id if index + 1 < len(chain) else None
        view["ui_url"] = f"{ui_base}/dags/{quote(dag_id, safe='')}/runs/{quote(run.run_id, safe='')}"
        view["view_url"] = f"{view_base}/dags/{quote(dag_id, safe='')}/runs/{quote(run.run_id, safe='')}" + (
            f"?group={quote(run.prefix.removesuffix('.'), safe='')}" if run.prefix else ""
        )
        view["tab_url"] = f"{view['ui_url']}/plugin/{tab_route}" if tab_route else None
        for node in view["nodes"]:  # a node's Markdown document (a report) opens on a page of its own
            wrote = node.pop("document")
            node["document_url"] = _document_url(view_base, dag_id, run, node) if wrote else None
        runs.append(view)
        previous_plan = _plan_of(run) or previous_plan
    first_session = chain[0].session or {}
    return {
        "dag_id": dag_id,
        "run_id": opened,
        "root_run_id": chain[0].run_id,
        "goal": first_session.get("goal") or _goal_of(chain),
        "outcome": _outcome(chain),
        # a run that replans waits for its child, so the chain is over once every run of it is
        "finished": all(run["state"] in FINISHED_RUN_STATES for run in runs),
        "runs": runs,
    }


def _document_url(view_base: str, dag_id: str, run: RunData, node: Mapping[str, Any]) -> str:
    url = f"{view_base}/dags/{quote(dag_id, safe='')}/runs/{quote(run.run_id, safe='')}"
    url += f"/nodes/{quote(str(node['id']), safe='')}/markdown"
    return url + (f"?group={quote(run.prefix.removesuffix('.'), safe='')}" if run.prefix else "")


def _goal_of(chain: Sequence[RunData]) -> str:
    for run in chain:
        plan = run.xcom(PLAN_TASK, PLAN_KEY)
        if isinstance(plan, dict) and plan.get("goal"):
            return str(plan["goal"])
    return ""


def _outcome(chain: Sequence[RunData]) -> dict[str, Any] | None:
    """The session's outcome (:func:`~airflow_plan_provider.contract.session_outcome`), summarized."""
    result = session_outcome(*(lambda task_id, run=run: run.xcom(task_id, RESULT_KEY) for run in chain))
    return None if result is None else _result_summary(result.model_dump(mode="json"))


def _result_summary(result: Mapping[str, Any]) -> dict[str, Any]:
    usage = result.get("usage") if isinstance(result.get("usage"), dict) else {}
    return {
        "status": result.get("status"),
        "reason": result.get("reason"),
        "message": summarize(result.get("message") or "", 1000),
        "usage": usage,
    }


def _plan_of(run: RunData) -> ValidatedPlan | None:
    raw = run.xcom(PLAN_TASK, PLAN_KEY)
    if not isinstance(raw, dict):
        return None
    try:
        return ValidatedPlan.model_validate(raw)
    except ValidationError:
        return None


def _run_view(run: RunData, index: int, previous: ValidatedPlan | None, redact: Redact) -> dict[str, Any]:
    """One run of a session: its revision's summary, then (when it planned) its nodes and edges."""
    session = run.session or {}
    revision = session.get("revision", index)
    plan = _plan_of(run)
    tools = _tool_listing(run)
    view = _revision_summary(run, session, revision, plan, tools)
    if plan is None:
        return view
    diff = view["diff"]
    view["changes"] = _changes(previous, plan, (diff or {}).get("revised") or [], redact)
    view["nodes"] = _plan_nodes(run, session, plan, tools, _diff_marks(diff), redact)
    view["edges"] = [
        {"from": parent, "to": child, "optional": plan.is_optional(parent, child)}
        for child, parents in plan.parents.items()
        for parent in parents
    ]
    _add_phases(view["nodes"], plan, run)
    if previous is not None:
        view["nodes"] += _removed_nodes(previous, plan, diff, redact)
    return view


def _revision_summary(
    run: RunData, session: dict[str, Any], revision: Any, plan: ValidatedPlan | None, tools: ToolListing
) -> dict[str, Any]:
    """What the view shows of a run above its nodes: its state, why it planned, how, and its result."""
    error = run.xcom(PLAN_TASK, PLANNING_ERROR_KEY)
    reason, trigger, diff = None, None, None
    for entry in session.get("revisions") or []:
        if isinstance(entry, dict) and entry.get("revision") == revision:
            reason, trigger, diff = entry.get("reason"), entry.get("trigger_node"), entry.get("diff")
    plan_ti = run.ti(PLAN_TASK) or {}
    finalize = run.xcom(FINALIZE_TASK, RESULT_KEY)
    return {
        "run_id": run.run_id,
        "revision": revision,
        "state": run.state,
        "start_date": run.start_date,
        "end_date": run.end_date,
        "note": run.note,
        "plan_state": "planned" if plan else ("failed" if error else plan_ti.get("state") or "pending"),
        "planning_error": summarize(error.get("message", ""), 4000) if isinstance(error, dict) else None,
        "reason": reason,
        "trigger_node": trigger,
        "diff": diff,
        "planner_calls": _planner_calls(session, revision),
        "planner_attempts": _planner_attempts(session, revision),
        "plan_source": _plan_source(session, revision),
        "result": _result_summary(finalize) if isinstance(finalize, dict) else None,
        "replanned": bool(run.xcom(FINALIZE_TASK, REPLAN_CONF_KEY)),
        "changes": [],
        "tool_sources": tools.summary(),
        "layers": plan.layers if plan else [],
        "nodes": [],
        "edges": [],
    }


def _plan_nodes(
    run: RunData,
    session: dict[str, Any],
    plan: ValidatedPlan,
    tools: ToolListing,
    marks: dict[str, str],
    redact: Redact,
) -> list[dict[str, Any]]:
    """The plan's nodes, layer by layer, each with its task instance, record, resolved params and origin."""
    records = run.records
    outputs = {
        node_id: record.get("output")
        for node_id, record in records.items()
        if record.get("status") == NodeStatus.SUCCESS and record.get("artifact") is None
    }
    origins = {name: ToolOrigin.from_dict(origin).label() for name, origin in tools.origins.items()}
    lanes = session.get("lanes")
    layout = RunContext(  # where the run's nodes are: each pooled node's lane
        lanes={str(k): str(v) for k, v in lanes.items()} if isinstance(lanes, dict) else {},
    )
    nodes = []
    for layer_index, layer in enumerate(plan.layers):
        for node_id in layer:
            node = plan.node(node_id)
            task_id, map_index = node_location(plan, layout, node_id)
            nodes.append(
                _node_view(
                    node.model_dump(mode="json", exclude_none=True),
                    layer_index,
                    _node_ti(run, task_id, map_index),
                    records.get(node_id),
                    _resolved_params(plan, node_id, records.get(node_id), outputs),
                    marks.get(node_id),
                    redact,
                )
                | {"task_id": run.prefix + task_id, "map_index": map_index, "origin": origins.get(node.tool)}
            )
    return nodes


def _removed_nodes(
    previous: ValidatedPlan, plan: ValidatedPlan, diff: dict[str, Any] | None, redact: Redact
) -> list[dict[str, Any]]:
    """The nodes of the previous revision this one removed, marked so."""
    return [
        _node_view(
            previous.node(node_id).model_dump(mode="json", exclude_none=True),
            previous.layer_of(node_id),
            None,
            None,
            None,
            "removed",
            redact,
        )
        for node_id in (diff or {}).get("removed") or []
        if node_id in previous.node_ids and node_id not in plan.node_ids
    ]


def _tool_listing(run: RunData) -> ToolListing:
    """What each tool source listed when the run planned, and where each tool of its plan comes from;
    empty for a run whose planning task kept none (or kept one of another shape)."""
    try:
        return listing_of(run.xcom(PLAN_TASK, TOOLS_KEY))
    except ValueError:  # a listing of another shape: nothing to show
        return ToolListing()


def _add_phases(nodes: Sequence[dict[str, Any]], plan: ValidatedPlan, run: RunData) -> None:
    """Each node's phase in the provider's words (:func:`~airflow_plan_provider.plan.phases.node_phase`):
    waiting for named parents, running its tool, polling its job, retrying, or its final state."""
    states = {node["id"]: node["state"] for node in nodes}
    for node in nodes:
        ti = run.ti(node["task_id"].removeprefix(run.prefix), node["map_index"]) or {}
        parents = {parent: states.get(parent) for parent in plan.parents.get(node["id"], [])}
        found = node_phase(node["state"], ti.get("next_method"), parents)
        node |= {"phase": found.phase, "waiting_for": list(found.waiting_for), "waiting_where": found.where}


def _node_ti(run: RunData, task_id: str, map_index: int) -> dict[str, Any] | None:
    """The node's task instance; its state is :data:`NOT_RUN` when it has none and never will."""
    ti = run.ti(task_id, map_index)
    if ti is not None and ti.get("state"):
        return ti
    unexpanded = (run.ti(task_id) or {}).get("state")
    if run.state in FINISHED_RUN_STATES or unexpanded in UNEXPANDED_END_STATES:
        return {**(ti or {}), "state": NOT_RUN}
    return ti


def _changes(
    previous: ValidatedPlan | None, plan: ValidatedPlan, revised: Sequence[Any], redact: Redact
) -> list[dict[str, Any]]:
    """What changed in each revised node: ``{"id", "changed": {field: {"before", "after"}}}`` for the
    fields that differ among action, tool and params (secrets in params redacted)."""
    if previous is None:
        return []
    changes = []
    for node_id in map(str, revised):
        if node_id not in previous.node_ids or node_id not in plan.node_ids:
            continue
        before, after = previous.node(node_id), plan.node(node_id)
        changed = {
            name: {
                "before": redact(old) if name == "params" else old,
                "after": redact(new) if name == "params" else new,
            }
            for name, old, new in (
                ("action", before.action, after.action),
                ("tool", before.tool, after.tool),
                ("params", before.params, after.params),
            )
            if old != new
        }
        changes.append({"id": node_id, "changed": changed})
    return changes


def _diff_marks(diff: Any) -> dict[str, str]:
    marks: dict[str, str] = {}
    if isinstance(diff, dict):
        for kind in ("added", "revised"):
            for node_id in diff.get(kind) or []:
                marks[str(node_id)] = kind
    return marks


def _planner_calls(session: Mapping[str, Any], revision: int) -> list[dict[str, Any]]:
    """Token usage of each planner call of this revision (``planner.usage`` events)."""
    calls = []
    for event in session.get("events") or []:
        if not isinstance(event, dict) or event.get("revision") != revision:
            continue
        if event.get("type") == "planner.usage":
            data = event.get("data") or {}
            calls.append(
                {
                    "prompt_tokens": data.get("prompt_tokens", 0),
                    "completion_tokens": data.get("completion_tokens", 0),
                    "at": event.get("at"),
                }
            )
    return calls


def _planner_attempts(session: Mapping[str, Any], revision: int) -> int | None:
    """How many plans the planner was asked for in this revision (the first plus its repairs)."""
    for event in session.get("events") or []:
        is_planning = isinstance(event, dict) and event.get("type") in ("plan.created", "plan.diff")
        if is_planning and event.get("revision") == revision:
            attempts = (event.get("data") or {}).get("attempts")
            return attempts if isinstance(attempts, int) else None
    return None


def _plan_source(session: Mapping[str, Any], revision: int) -> str | None:
    """Where this revision's plan came from: ``planner`` (asked for it; a replan always asks), ``conf`` (a
    ready plan in the run's conf) or ``dag`` (the DAG's own, frozen plan); None before it is planned."""
    for event in session.get("events") or []:
        if not isinstance(event, dict) or event.get("revision") != revision:
            continue
        if event.get("type") == "plan.diff":
            return "planner"
        if event.get("type") == "plan.created":
            source = (event.get("data") or {}).get("source")
            return source if source in ("planner", "conf", "dag") else "planner"
    return None


def _resolved_params(
    plan: ValidatedPlan, node_id: str, record: Mapping[str, Any] | None, outputs: Mapping[str, Any]
) -> Any:
    """The params the tool was called with: the record's own when it kept them, else the declared params
    with the references resolved from the parents' recorded outputs (None when a parent's output is
    not at hand, e.g. stored as an artifact)."""
    if record is not None and isinstance(record.get("params"), dict):
        return record["params"]
    parents = plan.parents.get(node_id, [])
    node = plan.node(node_id)
    if not parents:
        return node.params
    try:
        resolved = resolve(node.params, {p: outputs[p] for p in parents if p in outputs})
    except UnresolvedReference:
        return None
    if _has_missing(resolved):
        return None
    return {key: _bounded(value) for key, value in resolved.items()}


def _has_missing(value: Any) -> bool:
    if isinstance(value, MissingInput):
        return True
    if isinstance(value, dict):
        return any(_has_missing(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_missing(v) for v in value)
    return False


def _bounded(value: Any) -> Any:
    text = json.dumps(value, default=str)
    return value if len(text) <= PARAM_CHARS else summarize(text, PARAM_CHARS)


def _seconds_between(start: Any, end: Any) -> float | None:
    try:
        return round((datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds(), 3)
    except (TypeError, ValueError):
        return None


def _waited(record: Mapping[str, Any]) -> float | None:
    """Seconds the node's task spent before calling the tool: from its start to its ``node.started``."""
    for event in record.get("events") or []:
        if isinstance(event, dict) and event.get("type") == "node.started":
            return _seconds_between(record.get("started_at"), event.get("at"))
    return None


def _node_view(
    node: dict[str, Any],
    layer: int,
    ti: Mapping[str, Any] | None,
    record: Mapping[str, Any] | None,
    resolved: Any,
    mark: str | None,
    redact: Redact,
) -> dict[str, Any]:
    record = record or {}
    ti = ti or {}
    artifact = record.get("artifact") if isinstance(record.get("artifact"), dict) else None
    return {
        "id": node["id"],
        "action": node.get("action", ""),
        "tool": node.get("tool", ""),
        "expected_outcome": node.get("expected_outcome"),
        "layer": layer,
        "params": redact(node.get("params") or {}),
        "resolved_params": None if resolved is None else redact(resolved),
        "state": None if mark == "removed" else ti.get("state"),
        "status": record.get("status"),
        "reused": bool(record.get("reused")),
        "checkpoint": bool(record.get("checkpoint")),
        "replan_requested": bool(record.get("replan_requested")),
        "budget_exhausted": bool(record.get("budget_exhausted")),
        "missing_inputs": record.get("missing_inputs") or [],
        "error": redact(record.get("error")),
        "output_summary": redact(record.get("output_summary")),
        "artifact": {k: artifact.get(k) for k in ("uri", "size", "sha256")} if artifact else None,
        "document": document_of(record.get("output")) is not None,
        "polling": record.get("polling"),
        "attempts": record.get("attempts", ti.get("try_number")),
        "try_number": ti.get("try_number"),
        # the node's duration is its tool call's, as the node logged it and its outcome event says
        "duration_s": record.get("duration_s"),
        # apart: how long the node's task waited before the call (for its parents, or a slot), and the
        # task's own duration in Airflow (start to end, with the waiting)
        "waited_s": _waited(record),
        "task_seconds": ti.get("duration"),
        "started_at": ti.get("start_date") or record.get("started_at"),
        "ended_at": ti.get("end_date") or record.get("ended_at"),
        "hostname": record.get("hostname") or ti.get("hostname") or None,
        "diff": mark,
    }
