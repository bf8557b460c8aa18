"""One try of a plan node's life, written once for every host that runs nodes.

A try decides (skip below a failed or skipped hard parent or a replan request; run, naming the optional
parents that did not succeed), reuses what is already known (a locked output of an earlier revision; a
checkpoint of this call's idempotency key), keeps the step budget, resolves the params' references and
checks them (:func:`~airflow_plan_provider.plan.calls.call_params`), calls the tool and classifies what
happened into a :class:`StepOutcome`: a :class:`~airflow_plan_provider.plan.result.NodeRecord` that
succeeded (a replan request included), was skipped or failed; ``retry`` (a failed try with tries left);
or ``poll`` (an asynchronous tool started a job: :meth:`NodeStep.job_ended` classifies its end).

What differs between hosts reaches the step through a :class:`NodeHost` (checkpoints, the artifact
store, logging and events, how the tool is called) and a :class:`TryContext` (run, try number, retries,
the key's scope). The node operator (:class:`~airflow_plan_provider.operators.node.PlanNodeOperator`)
and the local runner (:mod:`airflow_plan_provider.local_runner`) are adapters: they gather the inputs,
run the step, and act on its outcome in their own terms (Airflow's skip, fail, retry and deferral; a
loop of tries in a thread)::

    inputs = NodeInputs(plan, "3", run, run.position("3"), parents, tools)
    outcome = NodeStep(inputs, TryContext(...), host).run()
    if outcome.kind == "retry": ...
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from airflow_plan_provider.exceptions import (
    ArtifactStoreError,
    PermanentToolError,
    ReplanRequested,
    TransientToolError,
)
from airflow_plan_provider.plan.budgets import step_refused
from airflow_plan_provider.plan.calls import CallRefused, call_params, node_key
from airflow_plan_provider.plan.decisions import NodeStatus, decide
from airflow_plan_provider.plan.events import EventSource, make_event, outcome_event
from airflow_plan_provider.plan.model import ValidatedPlan
from airflow_plan_provider.plan.result import ArtifactRef, Event, NodeRecord, now, summarize
from airflow_plan_provider.plan.session import LockedOutput, RunContext
from airflow_plan_provider.tools.tool import Tool, ToolContext

if TYPE_CHECKING:
    from airflow_plan_provider.tools.jobs import JobOutcome

# what a checkpoint gives back to a node's record (the rest describes the current try)
CHECKPOINT_FIELDS = ("output", "artifact", "output_summary", "replan_requested", "error", "polling")

PARAMS_LOG_CHARS = 2000  # of the resolved params in a node's log line

OutcomeKind = Literal["succeeded", "skipped", "failed", "retry", "poll"]

OUTCOME_KINDS: dict[NodeStatus, OutcomeKind] = {
    NodeStatus.SUCCESS: "succeeded",
    NodeStatus.SKIPPED: "skipped",
    NodeStatus.FAILED: "failed",
}


def checkpointed(saved: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a node's record that its checkpoint gives back (:data:`CHECKPOINT_FIELDS`)."""
    return {k: saved[k] for k in CHECKPOINT_FIELDS if k in saved}


class StoredOutputError(Exception):
    """A parent's stored output cannot be used (malformed reference, missing, altered): retrying cannot
    repair it, so the node fails. A host's :meth:`NodeHost.load_output` raises it."""


@dataclass(frozen=True)
class TryContext:
    """Where and which try runs: the run's id, the key's scope
    (:func:`~airflow_plan_provider.plan.calls.key_scope`), the events' source, the try number (from 1),
    how many tries may follow a failed one, the worker's name, the timeout of an asynchronous job whose
    tool sets none, and when the try began."""

    run_id: str
    scope: str
    source: EventSource
    try_number: int = 1
    retries: int = 0
    hostname: str | None = None
    job_timeout: float | None = None
    started_at: str = field(default_factory=now)


class NodeHost(Protocol):
    """What a host does for the step. ``load_checkpoint`` returns ``None`` when there is none (or the host
    keeps none); ``store_output`` stores an output's JSON ``text`` when the host keeps it out of the
    record (returns its :class:`ArtifactRef` as a dict) or returns ``None``; ``load_output`` reads a
    parent's stored output back (raising :class:`StoredOutputError`); ``shown_params`` is the resolved
    params as they may be shown (secrets masked); ``call`` calls the tool (inside a tracing span, say)."""

    def log(self, level: int, message: str, *args: Any) -> None: ...
    def publish(self, event: Event) -> None: ...
    def locked(self, node_id: str) -> LockedOutput: ...
    def load_checkpoint(self, key: str) -> dict[str, Any] | None: ...
    def save_checkpoint(self, key: str, saved: dict[str, Any]) -> None: ...
    def store_output(self, text: str, summary: str, key: str) -> dict[str, Any] | None: ...
    def load_output(self, artifact: ArtifactRef, key: str) -> Any: ...
    def shown_params(self, params: Any) -> Any: ...
    def call(self, tool: Tool, params: Any, ctx: ToolContext) -> Any: ...


@dataclass(frozen=True)
class NodeInputs:
    """What the node knows of its session: the plan (the whole plan, or only the node and its parents:
    :meth:`~airflow_plan_provider.plan.model.ValidatedPlan.around`), the node, the run's context
    (revision, reused nodes, step budget), the node's place in the revision's execution order (what the
    step budget counts; None for a node the revision does not execute), its parents' records (``None``:
    a parent without one counts as failed) and the tools."""

    plan: ValidatedPlan
    node_id: str
    run: RunContext
    position: int | None
    parents: Mapping[str, NodeRecord | None] = field(default_factory=dict)
    tools: Mapping[str, Tool] = field(default_factory=dict)


@dataclass
class JobWait:
    """An asynchronous tool's job the node waits for: its ``polling`` fields (handle, since, timeout,
    key: what the record keeps), when the call began, the missing inputs and the try's events so far.
    :meth:`saved` and :meth:`from_saved` carry it across a host's pause (Airflow's deferral)."""

    handle: Any
    polling: dict[str, Any]
    started: float | None
    missing: list[str]
    events: list[Event]
    tool: Tool | None = None

    @property
    def timeout(self) -> float | None:
        timeout = self.polling.get("timeout")
        return None if timeout is None else float(timeout)

    def deadline(self) -> float | None:
        """The epoch time after which the job has timed out (set when the wait begins)."""
        return None if self.timeout is None else time.time() + self.timeout

    def saved(self) -> dict[str, Any]:
        return {
            **self.polling,
            "missing": self.missing,
            "started": self.started,
            "events": [event.model_dump(mode="json") for event in self.events],
        }

    @classmethod
    def from_saved(cls, saved: Mapping[str, Any]) -> JobWait:
        polling = {k: v for k, v in saved.items() if k not in ("missing", "started", "events")}
        return cls(
            handle=saved.get("handle"),
            polling=polling,
            started=saved.get("started"),
            missing=list(saved.get("missing", [])),
            events=[Event.model_validate(e) for e in saved.get("events", [])],
        )


@dataclass
class StepOutcome:
    """How a try ended. ``record`` for ``succeeded``, ``skipped`` and ``failed``; ``events`` are the
    try's events in order; ``error`` the tool's exception when a try failed by one that is not a
    permanent failure (``retry``, or ``failed`` when no try is left): a host that retries by exceptions
    raises it again; ``retry_after`` the delay the tool asked for; ``job`` for ``poll``."""

    kind: OutcomeKind
    events: list[Event]
    record: NodeRecord | None = None
    error: BaseException | None = None
    retry_after: float | None = None
    job: JobWait | None = None


class NodeStep:
    """One try of one node (see the module's docstring): :meth:`run`, then :meth:`job_ended` for a job."""

    def __init__(self, inputs: NodeInputs, ctx: TryContext, host: NodeHost) -> None:
        self.inputs, self.ctx, self.host = inputs, ctx, host
        self.node = inputs.plan.node(inputs.node_id)
        self.key = node_key(ctx.scope, inputs.run.root_run_id or ctx.run_id, self.node)
        self.missing: list[str] = []
        self.events: list[Event] = []
        self.started: float | None = None  # when the tool was called: a record's duration counts from it
        self.call_ended: float | None = None

    def run(self) -> StepOutcome:
        node, inputs, host = self.node, self.inputs, self.host
        parents = {p: inputs.parents.get(p) for p in inputs.plan.parents[node.id]}
        statuses = {p: r.status if r else NodeStatus.FAILED for p, r in parents.items()}
        moot = [p for p, r in parents.items() if r and r.replan_requested]
        decision = decide(inputs.plan, node.id, statuses, moot)
        if decision.action != "run":
            host.log(logging.INFO, "node %s skipped because %s", node.id, decision.reason)
            return self.ended(NodeStatus.SKIPPED, error=decision.reason)
        reused = self._reused()
        if reused is not None:
            return reused
        if inputs.position is None:
            return self.fail("not in this revision's execution order")
        refused = step_refused(inputs.run.budgets, inputs.run.steps_used, inputs.position, node.id)
        if refused is not None:
            host.log(logging.INFO, "node %s skipped because the %s", node.id, refused)
            return self.ended(NodeStatus.SKIPPED, budget_exhausted=True, error=refused)
        self.missing = list(decision.missing)
        if self.missing:
            host.log(
                logging.WARNING,
                "node %s runs with missing inputs: optional parent(s) %s did not succeed",
                node.id,
                ", ".join(self.missing),
            )
        else:
            host.log(logging.INFO, "node %s runs: every parent succeeded", node.id)
        try:
            outputs = {
                p: self._output_of(p, r) for p, r in parents.items() if r and r.status is NodeStatus.SUCCESS
            }
        except StoredOutputError as error:
            return self.fail(str(error))
        tool = inputs.tools.get(node.tool)
        if tool is None:
            return self.fail(f"unknown tool {node.tool!r}")
        try:
            params = call_params(node, tool, outputs)
        except CallRefused as error:
            return self.fail(str(error))
        return self._call(tool, params)

    def _reused(self) -> StepOutcome | None:
        """A locked node's output, or this call's checkpoint (its call already succeeded: its task was
        cleared, or its worker died after the call); None when there is neither."""
        node, host = self.node, self.host
        if node.id in self.inputs.run.reused:
            locked = host.locked(node.id)
            host.log(
                logging.INFO,
                "node %s reused: it succeeded in an earlier revision; output: %s",
                node.id,
                locked.summary,
            )
            return self.ended(
                NodeStatus.SUCCESS,
                reused=True,
                attempts=0,
                output=locked.output,
                artifact=locked.artifact,
                output_summary=locked.summary,
            )
        saved = host.load_checkpoint(self.key)
        if saved is None:
            return None
        host.log(
            logging.INFO,
            "node %s reused: it already succeeded (checkpoint %s), its tool is not called again; output: %s",
            node.id,
            self.key,
            saved.get("output_summary"),
        )
        return self.ended(NodeStatus.SUCCESS, **checkpointed(saved), reused=True, checkpoint=True)

    def _output_of(self, parent_id: str, record: NodeRecord) -> Any:
        """A succeeded parent's output: as its record carries it, or the output the host stored for it."""
        if record.artifact is None:
            return record.output
        parent = self.inputs.plan.node(parent_id)
        key = node_key(self.ctx.scope, self.inputs.run.root_run_id or self.ctx.run_id, parent)
        try:
            return self.host.load_output(record.artifact, key)
        except StoredOutputError as error:
            raise StoredOutputError(f"output of parent node {parent_id}: {error}") from error

    def _call(self, tool: Tool, params: Any) -> StepOutcome:
        node, ctx, host = self.node, self.ctx, self.host
        call = ToolContext(
            node_id=node.id,
            idempotency_key=self.key,
            attempt=ctx.try_number,
            missing_inputs=tuple(self.missing),
            run_id=ctx.run_id,
            revision=self.inputs.run.revision,
            dag_id=ctx.source.dag_id,
        )
        shown = host.shown_params(params)
        host.log(logging.INFO, "node %s params: %s", node.id, summarize(shown, PARAMS_LOG_CHARS))
        host.log(
            logging.INFO,
            "node %s: calling %s (%s; try %s, key %s)",
            node.id,
            tool.name,
            tool.origin.label(),
            ctx.try_number,
            self.key,
        )
        self.started = time.time()
        self.event("node.started", attempt=ctx.try_number, key=self.key, missing_inputs=self.missing)
        try:
            output = host.call(tool, params, call)
        except ReplanRequested as request:
            host.log(logging.WARNING, "node %s requests a replan: %s", node.id, request.reason)
            return self.succeed(request.output, replan_requested=True, error=request.reason)
        except PermanentToolError as error:
            return self.fail(error.reason)
        except Exception as error:
            return self._failed_try(error)
        if tool.is_async:
            return self._job_started(tool, output)
        return self.succeed(output)

    def _failed_try(self, error: Exception) -> StepOutcome:
        """A try that raised anything but a permanent failure: ``retry`` while tries are left."""
        transient = error if isinstance(error, TransientToolError) else None
        reason = transient.reason if transient else f"{type(error).__name__}: {error}"
        if self.ctx.try_number > self.ctx.retries:
            outcome = self.ended(NodeStatus.FAILED, error=reason)
            outcome.error = error
            return outcome
        # the host logs the retry in its own terms (who retries, when)
        self.event("node.retrying", attempt=self.ctx.try_number, duration_s=self.duration(), error=reason)
        retry_after = transient.retry_after if transient else None
        return StepOutcome("retry", list(self.events), error=error, retry_after=retry_after)

    def _job_started(self, tool: Tool, handle: Any) -> StepOutcome:
        timeout = tool.timeout or self.ctx.job_timeout
        polling = {"handle": handle, "since": now(), "timeout": timeout, "key": self.key}
        self.event("node.polling", handle=summarize(handle, 200), timeout=timeout)
        wait = JobWait(handle, polling, self.started, list(self.missing), list(self.events), tool)
        return StepOutcome("poll", list(self.events), job=wait)

    def job_ended(self, wait: JobWait, job: JobOutcome, *, malformed: bool = False) -> StepOutcome:
        """The outcome of the node whose job ``wait`` ended with ``job`` (``malformed``: the host got no
        valid report of the job's end, and ``job.reason`` says what was wrong)."""
        self.missing, self.started, self.events = list(wait.missing), wait.started, list(wait.events)
        self.call_ended = None
        polling = {**wait.polling, "until": now(), "outcome": "malformed" if malformed else job.status}
        if job.status != "done":
            return self.fail(job.reason if malformed else f"job {job.status}: {job.reason}", polling=polling)
        return self.succeed(job.result, polling=polling)

    def succeed(self, output: Any, **fields: Any) -> StepOutcome:
        """Record a successful call: store a large output, save the checkpoint, then the record.

        The checkpoint comes right after the tool returned, before the host publishes the record: if the
        host dies in between, the next try finds it and does not call the tool again.
        """
        node, host = self.node, self.host
        try:
            text = json.dumps(output, sort_keys=True)  # the one encoding: size, artifact and summary
        except (TypeError, ValueError) as error:
            return self.fail(f"tool output is not JSON-serialisable: {error}")
        summary = summarize(output if isinstance(output, str) else text)
        try:
            artifact = host.store_output(text, summary, self.key)
        except (
            ArtifactStoreError
        ) as error:  # the store's fault, not the node's: this try fails, a retry may not
            host.log(
                logging.ERROR, "node %s: its tool returned, but its output was not stored: %s", node.id, error
            )
            raise
        if artifact is not None:
            host.log(
                logging.INFO,
                "node %s output (%s bytes) stored at %s",
                node.id,
                artifact["size"],
                artifact["uri"],
            )
        outcome = {
            "output": None if artifact is not None else output,
            "artifact": artifact,
            "output_summary": summary,
            **fields,
        }
        shown = artifact["uri"] if artifact is not None else summary
        host.log(logging.INFO, "node %s succeeded in %s s; output: %s", node.id, self.duration(), shown)
        try:
            host.save_checkpoint(
                self.key, {**outcome, "attempts": self.ctx.try_number, "run_id": self.ctx.run_id}
            )
        except Exception as error:  # the record is what counts; a checkpoint only saves work
            host.log(logging.WARNING, "node %s: could not save its checkpoint (%s)", node.id, error)
        return self.ended(NodeStatus.SUCCESS, **outcome)

    def fail(self, reason: str, **fields: Any) -> StepOutcome:
        """The node failed for good (retrying cannot help): log why and record it."""
        self.host.log(logging.ERROR, "node %s failed after %s s: %s", self.node.id, self.duration(), reason)
        return self.ended(NodeStatus.FAILED, error=reason, **fields)

    def ended(self, status: NodeStatus, **fields: Any) -> StepOutcome:
        """The node's record, with its outcome's event published last."""
        node, ctx = self.node, self.ctx
        record = NodeRecord.model_validate(
            {
                "node_id": node.id,
                "revision": self.inputs.run.revision,
                "action": node.action,
                "tool": node.tool,
                "attempts": ctx.try_number,
                "started_at": ctx.started_at,
                "hostname": ctx.hostname,
                "status": status,
                "ended_at": now(),
                "missing_inputs": self.missing,
                **fields,
                "duration_s": self.duration(),
            }
        )
        self._publish(outcome_event(record, ctx.source, ctx.try_number))
        record.events = list(self.events)
        return StepOutcome(OUTCOME_KINDS[status], list(self.events), record=record)

    def event(self, type_: str, /, **data: Any) -> Event:
        """Record and publish one event of this node."""
        return self._publish(make_event(type_, self.ctx.source, self.node.id, tool=self.node.tool, **data))

    def _publish(self, event: Event) -> Event:
        self.events.append(event)
        self.host.publish(event)
        return event

    def duration(self) -> float | None:
        """Seconds from the tool call to its end, fixed when first read after the call (so the outcome's
        log line, event and record carry one figure); None before the tool is called."""
        if self.started is None:
            return None
        if self.call_ended is None:
            self.call_ended = time.time()
        return round(self.call_ended - self.started, 3)
