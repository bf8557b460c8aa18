"""One plan node as one mapped task instance: decide, resolve inputs, call the tool, record the outcome."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowRescheduleException, AirflowSkipException

from airflow_plan_provider import artifacts
from airflow_plan_provider.contract import NODE_KEY, POLLING_KEY, node_label
from airflow_plan_provider.exceptions import (
    PermanentToolError,
    ReplanRequested,
    TransientToolError,
    TriggerEventError,
)
from airflow_plan_provider.operators._telemetry import emit, span
from airflow_plan_provider.operators.layout import (
    group_prefix,
    pull_locked,
    pull_node_records,
    pull_plan,
    pull_run_context,
)
from airflow_plan_provider.operators.node_wait import SlotWait
from airflow_plan_provider.plan.budgets import step_refused
from airflow_plan_provider.plan.calls import CallRefused, call_params, idempotency_key
from airflow_plan_provider.plan.decisions import NodeStatus, decide
from airflow_plan_provider.plan.events import EventSource, make_event, outcome_event
from airflow_plan_provider.plan.model import Node, ValidatedPlan
from airflow_plan_provider.plan.result import Event, NodeRecord, now, summarize
from airflow_plan_provider.plan.session import RunContext
from airflow_plan_provider.plan.waiting import Wait, WaitingPolicy
from airflow_plan_provider.settings import DEFAULT_SLOT_WAIT
from airflow_plan_provider.tools.registry import Tool, ToolContext, ToolRegistry, load_tools
from airflow_plan_provider.triggers.payloads import JobOutcome, validate_job_event, validate_parents_event

if TYPE_CHECKING:
    from airflow.sdk import Context

NODE_LABEL = "plan_node_label"
PARAMS_LOG_CHARS = 2000  # of the resolved params in a node's log line
# what a checkpoint gives back to a node's record (the rest describes the current try)
CHECKPOINT_FIELDS = ("output", "artifact", "output_summary", "replan_requested", "error", "polling")


@dataclass
class NodeRun:
    """What one node instance knows while it runs: the node, the run's context, its record's fields
    so far (``start``) and its events.

    ``started`` (epoch seconds) is set when the tool is called. The node's duration is the tool call's:
    from ``started`` to ``ended``, which the first :meth:`duration` after the call sets (across a
    deferral too: a job's polling time is part of the node's duration). The log line of the outcome, its
    event and the record all carry that one figure.
    """

    ti: Any
    plan: ValidatedPlan
    node: Node
    run_context: RunContext
    start: dict[str, Any]
    log: Any
    missing: list[str] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    started: float | None = None
    ended: float | None = None

    @property
    def source(self) -> EventSource:
        return EventSource(
            self.ti.dag_id, self.ti.run_id, self.run_context.root_run_id, self.run_context.revision
        )

    def event(self, type_: str, /, **data: Any) -> Event:
        """Record and publish one event of this node (log line, metrics, span event)."""
        return self._publish(make_event(type_, self.source, self.node.id, tool=self.node.tool, **data))

    def _publish(self, event: Event) -> Event:
        self.events.append(event)
        emit(self.log, event)
        return event

    def duration(self) -> float | None:
        """Seconds from the tool call to the end of the call (fixed when first read after it), or None
        before the tool is called."""
        if self.started is None:
            return None
        if self.ended is None:
            self.ended = time.time()
        return round(self.ended - self.started, 3)

    def push(self, status: NodeStatus, **fields: Any) -> None:
        """Push the node's record (its outcome) and record the outcome's event."""
        record = NodeRecord.model_validate(
            {
                **self.start,
                "status": status,
                "ended_at": now(),
                "missing_inputs": self.missing,
                **fields,
                "duration_s": self.duration(),
            }
        )
        self._publish(outcome_event(record, self.source, self.ti.try_number))
        record.events = list(self.events)
        self.ti.xcom_push(key=NODE_KEY, value=record.pushed())

    def fail(self, reason: str) -> AirflowFailException:
        self.log.error("node %s failed after %s s: %s", self.node.id, self.duration(), reason)
        self.push(NodeStatus.FAILED, error=reason)
        return AirflowFailException(f"node {self.node.id}: {reason}")

    def key(self, node: Node | None = None) -> str:
        """The idempotency key of ``node`` (default: this run's node) in this session (a plan in a task
        group has its own sessions: ``dag:group``, so two groups' nodes never share a key)."""
        node = node or self.node
        root = self.run_context.root_run_id or self.ti.run_id
        group = group_prefix(getattr(self.ti, "task", None)).rstrip(".")
        scope = f"{self.ti.dag_id}:{group}" if group else self.ti.dag_id
        return idempotency_key(scope, root, node.id, node.tool, node.params)


class PlanNodeOperator(BaseOperator):
    """Run node ``plan_node`` of the plan published by the planning task (one instance per mapped node).

    Starts when its own parents have finished (no layer barrier): while they run it waits in its slot,
    then on the triggerer, and it gives its slot back to a parent that needs one (see
    :mod:`airflow_plan_provider.triggers.parents` for the rules and why they cannot deadlock; at most
    ``slot_wait`` seconds in the slot). Skips when a hard parent failed or was skipped, or a parent's
    result made it moot; runs with the missing inputs named when an optional parent failed; reuses a
    locked node's output without calling its tool. Transient tool errors are retried by Airflow;
    permanent ones fail at once. An asynchronous tool's job is waited for on the triggerer (deferred, no
    worker slot held). A node that already succeeded in this revision (checkpoint keyed by its
    idempotency key) is not run again, even when its task is cleared, so clearing a failed node with its
    downstream re-runs only what had not succeeded. Outputs larger than ``artifact_threshold`` bytes go
    to the artifact store, and XCom holds a reference.
    Every outcome is pushed as XCom ``node`` for the nodes downstream and for finalize.

    The task log tells the node's decision (runs, runs without which inputs, reused, skipped because
    ...), its resolved params (through Airflow's secrets masker), the duration and the output summary
    or artifact URI, plus one JSON line per event. The resolved params are also the templated field
    ``resolved_params``, so the task's "Rendered Templates" shows them.
    """

    template_fields = ("plan_node", "resolved_params")
    ui_color = "#e8f4e4"
    overwrite_rtif_after_execution = True  # resolved_params is set while executing

    def __init__(
        self,
        *,
        plan_node: str,
        tools: ToolRegistry | str | None = None,
        artifact_store: str | None = None,
        artifact_threshold: int = artifacts.DEFAULT_THRESHOLD,
        checkpoints: bool = True,
        slot_wait: float = DEFAULT_SLOT_WAIT.total_seconds(),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.checkpoints = checkpoints
        self.slot_wait = slot_wait
        self.plan_node = plan_node
        self.tools = tools
        self.artifact_store = artifact_store
        self.artifact_threshold = artifact_threshold
        self.resolved_params: Any = None

    def _start(self, context: Context) -> NodeRun:
        ti = context["ti"]
        plan = pull_plan(ti)
        if plan is None:
            raise AirflowFailException("no plan was published by the planning task")
        run_context = pull_run_context(ti)
        node = plan.node(self.plan_node)
        # not one of Airflow's context keys: the task's map_index_template reads it
        cast(dict[str, Any], context)[NODE_LABEL] = node_label(node.id, node.action)
        start = {
            "node_id": node.id,
            "revision": run_context.revision,
            "action": node.action,
            "tool": node.tool,
            "attempts": ti.try_number,
            "started_at": now(),
            "hostname": _hostname(ti),
        }
        return NodeRun(ti, plan, node, run_context, start, self.log)

    def execute(self, context: Context) -> None:
        run = self._start(context)
        ti, plan, node, run_ctx = run.ti, run.plan, run.node, run.run_context
        picked = self._await_parents(run, context)  # a parent still running has no record yet
        unpicked = [p for p in plan.parents[node.id] if p not in picked]
        records = {**pull_node_records(ti, plan, run_ctx, unpicked), **picked}
        parents = {p: records.get(p) for p in plan.parents[node.id]}
        statuses = {p: r.status if r else NodeStatus.FAILED for p, r in parents.items()}
        moot = [p for p, r in parents.items() if r and r.replan_requested]
        decision = decide(plan, node.id, statuses, moot)
        if decision.action != "run":
            self.log.info("node %s skipped because %s", node.id, decision.reason)
            run.push(NodeStatus.SKIPPED, error=decision.reason)
            raise AirflowSkipException(f"node {node.id}: {decision.reason}")

        if node.id in run_ctx.reused:
            locked = pull_locked(ti, node.id)
            self.log.info(
                "node %s reused: it succeeded in an earlier revision; output: %s", node.id, locked.summary
            )
            run.push(
                NodeStatus.SUCCESS,
                reused=True,
                attempts=0,
                output=locked.output,
                artifact=locked.artifact,
                output_summary=locked.summary,
            )
            return
        key = run.key()
        saved = artifacts.load_checkpoint(key, self.artifact_store) if self.checkpoints else None
        if saved is not None:
            # this node's call already succeeded (its task was cleared, or crashed after the call)
            self.log.info(
                "node %s reused: it already succeeded (checkpoint %s), its tool is not called again; "
                "output: %s",
                node.id,
                key,
                saved.get("output_summary"),
            )
            run.push(
                NodeStatus.SUCCESS,
                **_checkpointed(saved),
                reused=True,
                checkpoint=True,
            )
            return

        position = run_ctx.execution_order.index(node.id)
        reason = step_refused(run_ctx.budgets, run_ctx.steps_used, position, node.id)
        if reason is not None:
            self.log.info("node %s skipped because the %s", node.id, reason)
            run.push(NodeStatus.SKIPPED, budget_exhausted=True, error=reason)
            raise AirflowSkipException(reason)

        run.missing = list(decision.missing)
        if run.missing:
            self.log.warning(
                "node %s runs with missing inputs: optional parent(s) %s did not succeed",
                node.id,
                ", ".join(run.missing),
            )
        else:
            self.log.info("node %s runs: every parent succeeded", node.id)
        outputs = {
            p: self._parent_output(run, p, r)
            for p, r in parents.items()
            if r and r.status is NodeStatus.SUCCESS
        }
        tool = load_tools(self.tools).get(node.tool)
        if tool is None:
            raise run.fail(f"unknown tool {node.tool!r}")
        try:
            params = call_params(node, tool, outputs)
        except CallRefused as error:
            raise run.fail(str(error)) from error
        ctx = ToolContext(
            node_id=node.id,
            idempotency_key=key,
            attempt=ti.try_number,
            missing_inputs=tuple(run.missing),
            run_id=ti.run_id,
            revision=run_ctx.revision,
        )
        self._log_params(node.id, params)
        self.log.info(
            "node %s: calling %s (try %s, key %s)", node.id, tool.name, ti.try_number, ctx.idempotency_key
        )
        run.started = time.time()
        run.event("node.started", attempt=ti.try_number, key=key, missing_inputs=run.missing)
        try:
            with span("plan.node", node_id=node.id, tool=tool.name, revision=run_ctx.revision):
                output = tool.call(params, ctx)
        except ReplanRequested as request:
            self.log.warning("node %s requests a replan: %s", node.id, request.reason)
            self._succeed(run, key, request.output, replan_requested=True, error=request.reason)
            return
        except PermanentToolError as error:
            raise run.fail(error.reason) from error
        except Exception as error:
            reason = (
                error.reason if isinstance(error, TransientToolError) else f"{type(error).__name__}: {error}"
            )
            if ti.try_number > self.retries:
                run.push(NodeStatus.FAILED, error=reason)
            else:
                self.log.warning(
                    "node %s: try %s failed after %s s (%s); Airflow retries it",
                    node.id,
                    ti.try_number,
                    run.duration(),
                    reason,
                )
                run.event("node.retrying", attempt=ti.try_number, duration_s=run.duration(), error=reason)
            raise
        if tool.is_async:
            self._defer_to_job(run, tool, ctx, output)
        self._succeed(run, key, output)

    def _log_params(self, node_id: str, params: Any) -> None:
        """Log the resolved params (secrets masked) and keep them as the templated ``resolved_params``."""
        from airflow_plan_provider.compat import redact

        shown = redact(params)
        self.resolved_params = shown
        self.log.info("node %s params: %s", node_id, summarize(shown, PARAMS_LOG_CHARS))

    def _parent_output(self, run: NodeRun, parent_id: str, record: NodeRecord) -> Any:
        """A succeeded parent's output: the tool's data as pushed, or the output the provider stored for
        that parent (its record's ``artifact``), verified. A stored output that fails verification
        fails this node for good: retrying cannot repair it."""
        if record.artifact is None:
            return record.output
        parent = run.plan.node(parent_id)
        try:
            return artifacts.load(record.artifact, key=run.key(parent), base_url=self.artifact_store)
        except artifacts.ArtifactError as error:
            raise run.fail(f"output of parent node {parent_id}: {error}") from error

    def _await_parents(self, run: NodeRun, context: Context) -> dict[str, NodeRecord]:
        """Return once every parent has finished, with the records of the parents whose result was
        picked up from their checkpoints (the others' records are in XCom by then); or defer, step
        aside or make way as the waiting policy decides (:class:`~.node_wait.SlotWait` reads the states
        and applies :mod:`airflow_plan_provider.plan.waiting`, which says when and why)."""
        waiting = SlotWait(
            ti=run.ti,
            plan=run.plan,
            run_context=run.run_context,
            node_id=run.node.id,
            policy=WaitingPolicy(slot_wait=self.slot_wait),
            log=self.log,
            pick_up=lambda node_ids: self._checkpoints_of_this_run(run, node_ids),
            checkpoints=self.checkpoints,
            made_way=int(context.get("task_reschedule_count") or 0),
            task_cap=self.max_active_tis_per_dagrun,
        )
        move = waiting.wait()
        if move.kind is Wait.READY:
            return waiting.picked
        if move.kind is Wait.MAKE_WAY:
            self.log.info(
                "node %s: a parent waits for a slot or a retry; this node makes way and looks again in %s s",
                run.node.id,
                move.after,
            )
            raise AirflowRescheduleException(datetime.now(UTC) + timedelta(seconds=move.after))
        if move.kind is Wait.STEP_ASIDE:
            self.log.info(
                "node %s: a node ready to run waits for a slot; this node gives it its own and waits for "
                "its parents on the triggerer",
                run.node.id,
            )
        else:
            self.log.info("node %s: parents still running; waiting on the triggerer", run.node.id)
        self.defer(trigger=waiting.trigger(), method_name="resume_after_parents")

    def _checkpoints_of_this_run(self, run: NodeRun, node_ids: Iterable[str]) -> dict[str, NodeRecord]:
        """The records of the nodes among ``node_ids`` whose checkpoint was saved in this run. A store
        that cannot be read just now tells nothing: the parents' states still do."""
        records = {}
        for node_id in node_ids:
            try:
                saved = artifacts.load_checkpoint(run.key(run.plan.node(node_id)), self.artifact_store)
            except Exception as error:  # an object store's hiccup must not fail a waiting node
                self.log.debug("node %s: checkpoint of %s not read (%s)", run.node.id, node_id, error)
                continue
            if saved is not None and saved.get("run_id") == run.ti.run_id:
                records[node_id] = NodeRecord(
                    node_id=node_id, status=NodeStatus.SUCCESS, **_checkpointed(saved)
                )
        return records

    def resume_after_parents(self, context: Context, event: dict[str, Any] | None = None, **_: Any) -> None:
        """Resumed by :class:`ParentsFinishedTrigger` (parents finished, or one needs a slot again):
        look at the parents again. An event the trigger cannot have sent fails the node, naming the fault."""
        try:
            validate_parents_event(event)
        except TriggerEventError as error:
            raise self._start(context).fail(str(error)) from error
        self.execute(context)

    def _succeed(self, run: NodeRun, key: str, output: Any, **fields: Any) -> None:
        """Record a successful call: store a large output, save the checkpoint, then push the record.

        The checkpoint comes first, right after the tool returned: if the worker dies before the push,
        the next try finds it and does not call the tool again.
        """
        try:
            text = json.dumps(output, sort_keys=True)  # the one encoding: size, artifact and summary
        except (TypeError, ValueError) as error:
            raise run.fail(f"tool output is not JSON-serialisable: {error}") from error
        summary = summarize(output if isinstance(output, str) else text)
        artifact = artifacts.store(
            text.encode(),
            summary=summary,
            key=key,
            base_url=self.artifact_store,
            threshold=self.artifact_threshold,
        )
        if artifact is not None:
            self.log.info(
                "node %s output (%s bytes) stored at %s", run.node.id, artifact["size"], artifact["uri"]
            )
        outcome = {
            "output": None if artifact is not None else output,
            "artifact": artifact,
            "output_summary": summary,
            **fields,
        }
        self.log.info(
            "node %s succeeded in %s s; output: %s",
            run.node.id,
            run.duration(),
            artifact["uri"] if artifact is not None else outcome["output_summary"],
        )
        if self.checkpoints:
            try:
                artifacts.save_checkpoint(
                    key,
                    {**outcome, "attempts": run.ti.try_number, "run_id": run.ti.run_id},
                    self.artifact_store,
                )
            except Exception as error:  # the record below is what counts; a checkpoint only saves work
                self.log.warning("node %s: could not save its checkpoint (%s)", run.node.id, error)
        run.push(NodeStatus.SUCCESS, **outcome)

    def _defer_to_job(self, run: NodeRun, tool: Tool, ctx: ToolContext, handle: Any) -> None:
        timeout = tool.timeout or (self.execution_timeout.total_seconds() if self.execution_timeout else None)
        polling = {
            "handle": handle,
            "since": now(),
            "timeout": timeout,
            "missing": run.missing,
            "key": ctx.idempotency_key,
        }
        run.event("node.polling", handle=summarize(handle, 200), timeout=timeout)
        # visible while the node waits, and read back when it resumes (same try, so the XCom stays)
        run.ti.xcom_push(
            key=POLLING_KEY,
            value={
                **polling,
                "started": run.started,
                "events": [event.model_dump(mode="json") for event in run.events],
            },
        )
        self.log.info(
            "node %s: job started (%s); polling every %s s on the triggerer",
            run.node.id,
            handle,
            tool.poll_interval,
        )
        assert tool.poll is not None
        from airflow_plan_provider.tools.jobs import callable_path  # only asynchronous tools need these
        from airflow_plan_provider.triggers.job import ToolJobTrigger

        self.defer(
            trigger=ToolJobTrigger(
                poll_path=callable_path(tool.poll),
                handle=handle,
                poll_interval=tool.poll_interval,
                deadline=time.time() + timeout if timeout else None,
                node_id=run.node.id,
            ),
            method_name="resume_after_job",
            timeout=timedelta(seconds=timeout * 2) if timeout else None,
        )

    def resume_after_job(self, context: Context, event: dict[str, Any] | None = None, **_: Any) -> None:
        """Resumed by :class:`~airflow_plan_provider.triggers.job.ToolJobTrigger`: record the job's result,
        or fail the node with its reason. An event the trigger cannot have sent (none, an unknown status,
        a done event without its result) fails the node too, naming the fault."""
        run = self._start(context)
        ti = run.ti
        polling = ti.xcom_pull(task_ids=ti.task_id, key=POLLING_KEY, map_indexes=ti.map_index) or {}
        run.missing = list(polling.get("missing", []))
        run.started = polling.get("started")
        run.events = [Event.model_validate(e) for e in polling.get("events", [])]
        try:
            job = validate_job_event(event)
        except TriggerEventError as error:
            job = JobOutcome("failed", reason=str(error))
            outcome = "malformed"
        else:
            outcome = job.status
        polling = {**polling, "until": now(), "outcome": outcome}
        for internal in ("missing", "started", "events"):
            polling.pop(internal, None)
        if job.status != "done":
            reason = job.reason if outcome == "malformed" else f"job {job.status}: {job.reason}"
            self.log.error("node %s failed after %s s: %s", run.node.id, run.duration(), reason)
            run.push(NodeStatus.FAILED, error=reason, polling=polling)
            raise AirflowFailException(f"node {run.node.id}: {reason}")
        self._succeed(run, run.key(), job.result, polling=polling)


def _hostname(ti: Any) -> str:
    """The worker's name, as Airflow's task runner set it (from ``[core] hostname_callable``)."""
    hostname = getattr(ti, "hostname", None)
    if hostname:
        return str(hostname)
    from airflow.sdk.api.client import get_hostname

    return str(get_hostname())


def _checkpointed(saved: dict[str, Any]) -> dict[str, Any]:
    """The fields of a node's record that its checkpoint gives back (:data:`CHECKPOINT_FIELDS`)."""
    return {k: saved[k] for k in CHECKPOINT_FIELDS if k in saved}
