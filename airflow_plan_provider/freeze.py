"""Freeze a finished plan session into a readable, scheduled DAG file that runs that plan again.

The file holds the session's final plan as a Python literal and builds the DAG with
:func:`~airflow_plan_provider.dag_factory.build_plan_dag` (``plan=PLAN``, no planner, replanning off):
every run validates and executes exactly that plan, with no planner or LLM call. Its strings are
Jinja templates rendered with each run's context by the planning task, so a param frozen as
``"{{ ds }}"`` gives each scheduled (or backfilled) run its own day. The module docstring, the DAG's
docs in Airflow, is a Markdown list: the goal, the run and DAG the plan was frozen from (and the day
that run was made), the revision and the schedule; then the nodes.

No secret is written: a param whose name looks like a secret must be given as a template (say
``"{{ var.value.report_api_key }}"``, rendered at run time) or the freeze fails; API credentials used
to read the session never reach the file. The command line is ``airflow-plan freeze`` (see
:mod:`airflow_plan_provider.cli`). This module imports no Airflow.
"""

from __future__ import annotations

import json
import re
import shlex
import textwrap
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import date
from typing import Any

from airflow_plan_provider.contract import (
    PLAN_KEY,
    PLAN_TASK,
    RESULT_KEY,
    SESSION_KEY,
    session_outcome,
)
from airflow_plan_provider.exceptions import FreezeError, PlanValidationError
from airflow_plan_provider.plan.approval import APPROVAL_MODES, is_sensitive_key
from airflow_plan_provider.plan.model import Plan, ValidatedPlan
from airflow_plan_provider.plan.validate import Limits, validate_plan

DAG_ID_PATTERN = re.compile(r"^[A-Za-z0-9_.\-]{1,250}$")
SPEC_PATTERN = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):([A-Za-z_]\w*)$")
ASSIGNMENT_PATTERN = re.compile(
    r"^(?:(?P<node>[A-Za-z0-9_\-]{1,64})\.)?(?P<name>[A-Za-z_][\w\-]*)=(?P<value>.*)$", re.S
)
WHOLE_TEMPLATE = re.compile(r"^\s*\{\{(?:(?!\}\}).)*\}\}\s*$", re.S)  # one expression, nothing else
DAY_PATTERN = re.compile(r"^\d{4}-\d{2}-\d{2}")
WIDTH = 100
DESCRIPTION_CHARS = 120  # the DAG's one-line description in Airflow's DAG list


@dataclass(frozen=True)
class FrozenSource:
    """A plan to freeze and where it came from (written into the file's docstring)."""

    plan: dict[str, Any]  # goal, nodes, edges
    origin: str  # "DAG D, session run R" or "plan file F"
    revision: int | None = None
    replans: int | None = None
    final_run: str | None = None  # the run that executed the final revision, when not the session's first
    dropped: tuple[dict[str, Any], ...] = ()  # nodes left out of ``plan`` (see drop_answered)
    dag_id: str | None = None  # the session's DAG and root run, when frozen from a session
    run_id: str | None = None
    run_date: str | None = None  # the day the session's root run was made (YYYY-MM-DD), when known


@dataclass(frozen=True)
class ParamTemplate:
    """``[NODE.]NAME=VALUE``: set param NAME of node NODE (of every node that has it) to VALUE."""

    name: str
    value: str
    node: str | None = None

    @classmethod
    def parse(cls, text: str) -> ParamTemplate:
        match = ASSIGNMENT_PATTERN.match(text)
        if not match:
            raise FreezeError(f"--param {text!r} is not [NODE.]NAME=VALUE")
        return cls(name=match["name"], value=match["value"], node=match["node"])

    def __str__(self) -> str:
        return f"{self.node + '.' if self.node else ''}{self.name}={self.value}"


def apply_templates(plan: Mapping[str, Any], templates: Sequence[ParamTemplate]) -> dict[str, Any]:
    """A copy of ``plan`` with each template's param replaced; a template that matches no param of any
    node (or of the node it names) raises :class:`FreezeError`."""
    result: dict[str, Any] = json.loads(json.dumps(plan))
    nodes = {str(node["id"]): node for node in result.get("nodes", [])}
    for template in templates:
        if template.node is not None and template.node not in nodes:
            raise FreezeError(f"--param {template}: the plan has no node {template.node!r}")
        targets = [nodes[template.node]] if template.node else list(nodes.values())
        hit = [node for node in targets if template.name in (node.get("params") or {})]
        if not hit:
            where = f"node {template.node}" if template.node else "any node"
            raise FreezeError(f"--param {template}: {where} has no param {template.name!r}")
        for node in hit:
            node["params"][template.name] = template.value
    return result


def secret_params(plan: Mapping[str, Any]) -> list[str]:
    """Where the plan holds a value under a secret-looking key that is not a whole Jinja template:
    ``node N param a.b`` for each (what the file would expose)."""
    found: list[str] = []

    def walk(value: Any, path: list[str], node_id: str) -> None:
        if isinstance(value, Mapping):
            for key, item in value.items():
                here = [*path, str(key)]
                if is_sensitive_key(str(key)) and not (
                    item in (None, "") or (isinstance(item, str) and WHOLE_TEMPLATE.match(item))
                ):
                    found.append(f"node {node_id} param {'.'.join(here)}")
                else:
                    walk(item, here, node_id)
        elif isinstance(value, list):
            for index, item in enumerate(value):
                walk(item, [*path, str(index)], node_id)

    for node in plan.get("nodes", []):
        walk(node.get("params") or {}, [], str(node.get("id")))
    return found


def drop_answered(plan: Mapping[str, Any], requested: Iterable[str]) -> tuple[dict[str, Any], list[str]]:
    """The plan without the nodes whose replan request the session already answered, and their ids.

    The rule: a node that requested a replan in the source session (``requested``) is dropped when no
    node of the final plan depends on it. The revision that answered its request stopped reading its
    output, so in a frozen plan (never replanned) each scheduled run would call it only to report a
    request nobody can answer. A node that other nodes still depend on is kept: its output is used.
    """
    result: dict[str, Any] = json.loads(json.dumps(plan))
    wanted, has_children = set(requested), {str(edge["from"]) for edge in result.get("edges", [])}
    dropped = [
        str(node["id"])
        for node in result.get("nodes", [])
        if str(node["id"]) in wanted and str(node["id"]) not in has_children
    ]
    result["nodes"] = [node for node in result.get("nodes", []) if str(node["id"]) not in dropped]
    result["edges"] = [edge for edge in result.get("edges", []) if str(edge["to"]) not in dropped]
    return result, dropped


def replan_requests(result: Mapping[str, Any]) -> list[str]:
    """The nodes whose record in a session result's history requested a replan."""
    history = result.get("history") or []
    return [str(r.get("node_id")) for r in history if isinstance(r, Mapping) and r.get("replan_requested")]


# --------------------------------------------------------------------------------------------- sources


def source_from_plan(raw: Any, name: str) -> FrozenSource:
    """A plan file's plan (JSON text or data with ``nodes``, as ``airflow-plan validate`` reads)."""
    try:
        data = json.loads(raw) if isinstance(raw, str | bytes) else raw
        plan = Plan.model_validate(data)
    except ValueError as error:  # JSONDecodeError and pydantic's ValidationError are ValueErrors
        raise FreezeError(f"{name} is not a plan: {str(error).splitlines()[0]}") from None
    return FrozenSource(plan=plan.to_json_dict(), origin=f"plan file {name}")


class SessionApi:
    """Reads a session from Airflow's REST API (``/api/v2``) with a bearer token, or a token fetched
    for ``user``/``password`` from ``/auth/token``; without either, anonymously."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        user: str | None = None,
        password: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise FreezeError(f"--api must be an http(s) URL, not {base_url!r}")
        if parsed.username or parsed.password:
            raise FreezeError("--api must not carry credentials; use --token or --user")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._token = token
        if token is None and user:
            self._token = self._login(user, password or "")

    def _send(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        request = urllib.request.Request(self.base_url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise FreezeError(f"cannot reach {self.base_url}: {reason}") from None

    def _login(self, user: str, password: str) -> str:
        status, data = self._send("POST", "/auth/token", {"username": user, "password": password})
        try:
            token = json.loads(data)["access_token"] if status in (200, 201) else None
        except (ValueError, KeyError, TypeError):
            token = None
        if not isinstance(token, str) or not token:
            raise FreezeError(f"login as {user!r} at {self.base_url}/auth/token failed (HTTP {status})")
        return token

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str) -> Any:
        """An XCom value, or ``None`` when there is none."""
        path = (
            f"/api/v2/dags/{_quote(dag_id)}/dagRuns/{_quote(run_id)}/taskInstances/{_quote(task_id)}"
            f"/xcomEntries/{_quote(key)}?map_index=-1"
        )
        status, data = self._send("GET", path)
        if status == 404:
            return None
        if status != 200:
            hint = " (give --token or --user)" if status in (401, 403) else ""
            raise FreezeError(f"GET {path} answered HTTP {status}{hint}")
        try:
            return json.loads(data)["value"]
        except (ValueError, KeyError, TypeError):
            raise FreezeError(f"GET {path} answered something that is not an XCom entry") from None

    def session(self, dag_id: str, run_id: str) -> FrozenSource:
        """The final plan of the completed session that run ``run_id`` of DAG ``dag_id`` belongs to."""
        state = self.xcom(dag_id, run_id, PLAN_TASK, SESSION_KEY)
        if not isinstance(state, Mapping):
            raise FreezeError(f"run {run_id!r} of DAG {dag_id!r} has no plan session (no XCom session)")
        root = str(state.get("root_run_id") or run_id)
        result = session_outcome(lambda task_id: self.xcom(dag_id, root, task_id, RESULT_KEY))
        if result is None:
            raise FreezeError(f"session {root!r} of DAG {dag_id!r} has no result (is it still running?)")
        if result.status != "completed":
            raise FreezeError(
                f"session {root!r} of DAG {dag_id!r} ended {result.status} ({result.reason}): only a "
                "completed session's plan can be frozen"
            )
        last = str((result.run_ids or [root])[-1])
        plan = self.xcom(dag_id, last, PLAN_TASK, PLAN_KEY)
        last_state = self.xcom(dag_id, last, PLAN_TASK, SESSION_KEY) or {}
        if not isinstance(plan, Mapping):
            raise FreezeError(f"run {last!r} of DAG {dag_id!r} published no plan")
        try:
            frozen = ValidatedPlan.model_validate(plan).as_plan().to_json_dict()
        except ValueError as error:
            raise FreezeError(
                f"the plan of run {last!r} is not a plan: {str(error).splitlines()[0]}"
            ) from None
        revision = last_state.get("revision") if isinstance(last_state, Mapping) else None
        kept, dropped = drop_answered(frozen, replan_requests(result.model_dump(mode="json")))
        return FrozenSource(
            plan=kept,
            dropped=tuple(n for n in frozen["nodes"] if str(n["id"]) in dropped),
            origin=f"DAG {dag_id}, session run {root}",
            revision=revision,
            replans=result.usage.replans,
            final_run=last if last != root else None,
            dag_id=dag_id,
            run_id=root,
            run_date=self.run_date(dag_id, root),
        )

    def run_date(self, dag_id: str, run_id: str) -> str | None:
        """The day (``YYYY-MM-DD``) run ``run_id`` was made (its ``run_after``), ``None`` when unknown."""
        status, data = self._send("GET", f"/api/v2/dags/{_quote(dag_id)}/dagRuns/{_quote(run_id)}")
        try:
            made = json.loads(data).get("run_after") if status == 200 else None
        except (ValueError, AttributeError):
            made = None
        return made[:10] if isinstance(made, str) and DAY_PATTERN.match(made) else None


# ------------------------------------------------------------------------------------------- rendering


def _quote(text: str) -> str:
    """``text`` as one path segment of an API URL."""
    return urllib.parse.quote(text, safe="")


def _string(text: str) -> str:
    """A Python string literal, double-quoted where that needs no escape (non-printable escaped)."""
    literal = repr(text)
    if literal.startswith("'") and '"' not in text:
        literal = '"' + literal[1:-1] + '"'
    return literal


def literal(value: Any, indent: int = 0) -> str:
    """``value`` (JSON data) as a Python literal, one item a line when it does not fit on one."""
    if isinstance(value, str):
        return _string(value)
    if value is None or isinstance(value, bool | int | float):
        return repr(value)
    pad = " " * (indent + 4)
    if isinstance(value, Mapping):
        items = [f"{_string(str(k))}: {literal(v, indent + 4)}" for k, v in value.items()]
        inline = "{" + ", ".join(items) + "}"
        if len(inline) + indent <= WIDTH - 10 and "\n" not in inline:
            return inline
        return "{\n" + "".join(f"{pad}{item},\n" for item in items) + " " * indent + "}"
    if isinstance(value, list | tuple):
        elements = [literal(v, indent + 4) for v in value]
        inline = "[" + ", ".join(elements) + "]"
        if len(inline) + indent <= WIDTH - 10 and "\n" not in inline:
            return inline
        return "[\n" + "".join(f"{pad}{item},\n" for item in elements) + " " * indent + "]"
    raise FreezeError(f"cannot write a {type(value).__name__} into a plan literal")


def _doc(text: str) -> str:
    """Untrusted text made safe for a triple-quoted docstring: one line, escapes kept visible."""
    shown = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    return shown.replace("\\", "\\\\").replace('"', '\\"')


def _doc_header(
    source: FrozenSource, *, goal: str, dag_id: str, schedule: str, start_date: date
) -> list[str]:
    """The docstring's first lines, the DAG's docs in Airflow (Markdown): what the DAG is, then its goal,
    where its plan was frozen from, its revision and its schedule, one item each."""
    revision = "unknown (a plan file)" if source.revision is None else str(source.revision)
    if source.replans:
        revision += f", after {source.replans} replan(s)"
    if source.final_run:
        revision += f"; it ran as {_doc(source.final_run)}"
    items = [
        f"**Goal:** {_doc(goal) or '(none)'}",
        f"**Frozen from:** {_frozen_from(source)}",
        f"**Revision:** {revision}",
        f"**Schedule:** {_doc(schedule)}, from {start_date.isoformat()} (UTC)",
    ]
    lines = [f"{_doc(dag_id)}: a frozen plan, run on a schedule with no planner call.", ""]
    for item in items:
        lines += textwrap.wrap(
            f"- {item}", WIDTH, subsequent_indent="  ", break_on_hyphens=False, break_long_words=False
        )
    return [*lines, ""]


def _frozen_from(source: FrozenSource) -> str:
    """Which run of which DAG, made on which day, the plan comes from: a run of another DAG, maybe of
    another Airflow, so named, not linked."""
    if source.dag_id is None or source.run_id is None:
        return _doc(source.origin)
    day = f", made on {source.run_date}" if source.run_date else ""
    return (
        f"run {_doc(source.run_id)} of DAG {_doc(source.dag_id)}{day} (a run of the Airflow the plan was "
        "read from, which may not be this one)"
    )


def render_dag_file(
    source: FrozenSource,
    *,
    dag_id: str,
    tools: str,
    schedule: str,
    start_date: date,
    templates: Sequence[ParamTemplate] = (),
    approval: str | None = None,
    import_tools: bool = True,
    limits: Limits | None = None,
) -> str:
    """The DAG file's text: docstring (goal, revision, source, schedule, nodes), imports, the plan as a
    literal, and one :func:`build_plan_dag` call. ``tools`` is ``module:attribute`` (imported when
    ``import_tools``, so the DAG knows at parse time whether any tool needs approval) or an
    entry-point name. The DAG checks a plan with ``limits`` (default ``Limits()``, as ``airflow-plan
    validate``); the limits other than the defaults are written into the call.
    Deterministic: the same inputs give the same text.

    Raises :class:`FreezeError` for a bad DAG id or approval mode, a template matching no param, or a
    secret-looking param that is not a template.
    """
    plan = _plan_to_write(source.plan, dag_id=dag_id, approval=approval, templates=templates)
    goal = str(plan.get("goal") or "")
    options = [("--tools", tools), ("--dag-id", dag_id), ("--schedule", schedule)]
    options += [("--start-date", start_date.isoformat()), *(("--param", str(t)) for t in templates)]
    options += [("--approval", approval)] if approval else []
    doc = _docstring(source, plan, dag_id=dag_id, schedule=schedule, start_date=start_date, options=options)
    spec = SPEC_PATTERN.match(tools)
    if spec and import_tools:
        imports = f"from {spec[1]} import {spec[2]} as tools\n"
        tools_arg = "tools"
    else:
        imports = ""
        tools_arg = _string(tools)
    limits = limits or Limits()
    try:
        validate_plan(plan, limits=limits)  # the structure: the caller checks tools
    except PlanValidationError as error:
        raise FreezeError(f"the plan is invalid: {error}") from None
    names, call = _build_call(dag_id, tools_arg, goal, schedule, start_date, approval, limits)
    variable = re.sub(r"\W", "_", dag_id)
    variable = variable if variable.isidentifier() and not variable[0].isdigit() else f"dag_{variable}"
    return (
        '"""' + "\n".join(doc) + '\n"""\n\n'
        "from __future__ import annotations\n\n"
        "from datetime import UTC, datetime\n\n"
        f"from airflow_plan_provider import {', '.join(names)}\n"
        f"{imports}\n"
        f"PLAN = {literal(plan)}\n\n"
        f"{variable} = build_plan_dag(\n{call})\n"
    )


def _plan_to_write(
    plan: Mapping[str, Any], *, dag_id: str, approval: str | None, templates: Sequence[ParamTemplate]
) -> dict[str, Any]:
    """The plan as the file writes it: the templates applied and default edge fields left out, once the
    DAG id, the approval mode, the templates and the params (no secret) are checked."""
    if not DAG_ID_PATTERN.match(dag_id):
        raise FreezeError(f"--dag-id {dag_id!r} is not a valid DAG id (letters, digits, _ . -)")
    if approval is not None and approval not in APPROVAL_MODES:
        raise FreezeError(f"--approval must be one of {', '.join(APPROVAL_MODES)}, not {approval!r}")
    written = apply_templates(plan, templates)
    for edge in written.get("edges", []):
        if edge.get("optional") is False:
            del edge["optional"]  # the default: less to read
    secrets = secret_params(written)
    if secrets:
        raise FreezeError(
            "the plan holds what looks like a secret; give it as a template rendered at run time "
            f"(--param NODE.NAME='{{{{ var.value.NAME }}}}'): {'; '.join(secrets)}"
        )
    return written


def _docstring(
    source: FrozenSource,
    plan: Mapping[str, Any],
    *,
    dag_id: str,
    schedule: str,
    start_date: date,
    options: Sequence[tuple[str, str]],
) -> list[str]:
    """The file's docstring, line by line (:func:`_doc_header`, then the nodes and those left out, and
    the ``airflow-plan freeze`` options that wrote it)."""
    goal = str(plan.get("goal") or "")
    doc = _doc_header(source, goal=goal, dag_id=dag_id, schedule=schedule, start_date=start_date)
    doc += [
        "**Nodes** (each run validates and executes exactly these, strings rendered as Jinja per run; a",
        "run's conf cannot replace them: a conf that gives a plan is refused):",
        "",
    ]
    doc += [_node_line(node) for node in plan.get("nodes", [])]
    if source.dropped:
        doc += [
            "",
            "**Left out** of the source's final plan: the nodes that requested a replan in the source",
            "session and that no node of the final plan depends on (a frozen plan is never replanned):",
            "",
            *(_node_line(node) for node in source.dropped),
        ]
    doc += ["", "**Written by** airflow-plan freeze (docs/plan-view-and-approval.md) with the options:", ""]
    doc += [f"    {flag} {_doc(shlex.quote(value))}" for flag, value in options]
    doc += ["", "To change the plan, freeze another session, or edit PLAN: each run validates it."]
    return doc


def _node_line(node: Mapping[str, Any]) -> str:
    return f"- {_doc(str(node['id']))} · {_doc(str(node.get('action', '')))} ({_doc(str(node['tool']))})"


def _build_call(
    dag_id: str,
    tools_arg: str,
    goal: str,
    schedule: str,
    start_date: date,
    approval: str | None,
    limits: Limits,
) -> tuple[list[str], str]:
    """The names the file imports from the provider, and the arguments of its ``build_plan_dag`` call
    (one a line): the limits other than the defaults are written, the others left out; the description
    (Airflow's DAG list) is cut to :data:`DESCRIPTION_CHARS`."""
    defaults = Limits()
    written = {
        f.name: getattr(limits, f.name)
        for f in fields(Limits)
        if getattr(limits, f.name) != getattr(defaults, f.name)
    }
    arguments = [
        _string(dag_id),
        "planner=None",
        "plan=PLAN",
        f"tools={tools_arg}",
        'goal=PLAN["goal"]',
        f"schedule={_string(schedule)}",
        f"start_date=datetime({start_date.year}, {start_date.month}, {start_date.day}, tzinfo=UTC)",
        "catchup=False",
        "replan=False",
        "budgets=Budgets(max_replans=0)",
    ]
    if written:
        arguments.append(f"limits=Limits({', '.join(f'{name}={value}' for name, value in written.items())})")
    if approval is not None:
        arguments.append(f"approval=ApprovalPolicy({_string(approval)})")
    description = f"Frozen plan, {schedule}: {goal}"
    description = (
        description if len(description) <= DESCRIPTION_CHARS else description[: DESCRIPTION_CHARS - 1] + "…"
    )
    arguments += ['tags=["plan", "frozen"]', f"description={_string(description)}", "doc_md=__doc__"]
    names = [
        *(["ApprovalPolicy"] if approval is not None else []),
        "Budgets",
        *(["Limits"] if written else []),
        "build_plan_dag",
    ]
    return names, "".join(f"    {argument},\n" for argument in arguments)
