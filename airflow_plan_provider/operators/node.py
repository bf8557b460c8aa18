"""One plan node as one mapped task instance: wait for its parents, run the node's step
(:mod:`airflow_plan_provider.plan.node_step`), and act on its outcome in Airflow's terms."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NoReturn, cast

from airflow.sdk import BaseOperator
from pydantic import ValidationError

from airflow_plan_provider import artifacts
from airflow_plan_provider.airflow_features import (
    AirflowFailException,
    AirflowRescheduleException,
    AirflowSkipException,
)
from airflow_plan_provider.contract import NODE_KEY, POLLING_KEY, NodeBrief, labelled_node, mapped_label
from airflow_plan_provider.exceptions import TriggerEventError
from airflow_plan_provider.operators._telemetry import emit, span
from airflow_plan_provider.operators.layout import (
    group_prefix,
    pull_brief,
    pull_locked,
    pull_plan,
    pull_records_at,
    pull_run_context,
    pull_tools,
)
from airflow_plan_provider.plan.calls import key_scope, node_key
from airflow_plan_provider.plan.decisions import NodeStatus
from airflow_plan_provider.plan.events import EventSource
from airflow_plan_provider.plan.model import Node, ValidatedPlan
from airflow_plan_provider.plan.node_step import (
    JobWait,
    NodeInputs,
    NodeStep,
    StepOutcome,
    StoredOutputError,
    TryContext,
    checkpointed,
)
from airflow_plan_provider.plan.result import ArtifactRef, Event, NodeRecord, now
from airflow_plan_provider.plan.session import LockedOutput, RunContext
from airflow_plan_provider.settings import DEFAULT_SLOT_WAIT
from airflow_plan_provider.tools.registry import ToolRegistry, load_tools
from airflow_plan_provider.tools.tool import Tool, ToolContext

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_plan_provider.plan.waiting import WaitingPolicy

#: Seconds a node instance waits for its parents in its slot before it sends Airflow its label
#: (``id · action``) for the grid. A node sends it, from its own thread, as it calls its tool (the tool may
#: run long: the grid shows it running under its label), once it has waited this long, or as it defers,
#: makes way or waits for a retry (those states do not carry it); a node that is skipped, reused or fails
#: before its call has the label set with its final state.
LABEL_AFTER = 2.0

# The waiting policy and its reads, the triggers' payload checks and the asynchronous jobs' helpers are
# imported by the nodes that need them (a node with parents, a resumed node, a job's node): every task
# of a plan DAG parses the DAG file, which imports this module.


@dataclass
class NodeRun:
    """What one node instance knows while it runs: its task instance, its brief (the node, its parents,
    the run's context as the node needs it, where its parents' instances are), its operator, and when it
    began (``started_at``, before it waited for its parents)."""

    ti: Any
    brief: NodeBrief
    operator: PlanNodeOperator
    started_at: str = field(default_factory=now)

    @property
    def plan(self) -> ValidatedPlan:
        """The node and its parents as a plan of their own (:attr:`NodeBrief.plan
        <airflow_plan_provider.contract.NodeBrief.plan>`)."""
        return self.brief.plan

    @property
    def node(self) -> Node:
        return self.brief.node

    @property
    def run_context(self) -> RunContext:
        return self.brief.run

    @property
    def scope(self) -> str:
        """The scope of this session's keys (:func:`~airflow_plan_provider.plan.calls.key_scope`: a plan
        in a task group has its own)."""
        return key_scope(self.ti.dag_id, group_prefix(getattr(self.ti, "task", None)).rstrip("."))

    def key(self, node: Node | None = None) -> str:
        """The idempotency key of ``node`` (default: this run's node) in this session."""
        return node_key(self.scope, self.run_context.root_run_id or self.ti.run_id, node or self.node)

    def step(
        self, parents: Mapping[str, NodeRecord | None] | None = None, tools: Mapping[str, Tool] | None = None
    ) -> NodeStep:
        """This try's :class:`~airflow_plan_provider.plan.node_step.NodeStep`, hosted by the operator."""
        ti, op = self.ti, self.operator
        rc = self.run_context
        timeout = op.execution_timeout.total_seconds() if op.execution_timeout else None
        ctx = TryContext(
            run_id=ti.run_id,
            scope=self.scope,
            source=EventSource(ti.dag_id, ti.run_id, rc.root_run_id, rc.revision),
            try_number=ti.try_number,
            retries=op.retries or 0,
            hostname=_hostname(ti),
            job_timeout=timeout,
            started_at=self.started_at,
        )
        inputs = NodeInputs(self.plan, self.node.id, rc, self.brief.position, parents or {}, tools or {})
        return NodeStep(inputs, ctx, _OperatorHost(self))

    def fail(self, reason: str) -> AirflowFailException:
        """Record that the node failed for good (pushed), as the exception that fails its task."""
        record = self.step().fail(reason).record
        assert record is not None
        self.ti.xcom_push(key=NODE_KEY, value=record.pushed())
        return AirflowFailException(f"node {self.node.id}: {reason}")


@dataclass
class _OperatorHost:
    """The node step's host in a task instance: XCom, the artifact store, the task log, a span."""

    run: NodeRun

    def log(self, level: int, message: str, *args: Any) -> None:
        self.run.operator.log.log(level, message, *args)

    def publish(self, event: Event) -> None:
        emit(self.run.operator.log, event)

    def locked(self, node_id: str) -> LockedOutput:
        return pull_locked(self.run.ti, node_id)

    def load_checkpoint(self, key: str) -> dict[str, Any] | None:
        op = self.run.operator
        return artifacts.load_checkpoint(key, op.artifact_store) if op.checkpoints else None

    def save_checkpoint(self, key: str, saved: dict[str, Any]) -> None:
        if self.run.operator.checkpoints:
            artifacts.save_checkpoint(key, saved, self.run.operator.artifact_store)

    def store_output(self, text: str, summary: str, key: str) -> dict[str, Any] | None:
        op = self.run.operator
        return artifacts.store(
            text.encode(),
            summary=summary,
            key=key,
            base_url=op.artifact_store,
            threshold=op.artifact_threshold,
        )

    def load_output(self, artifact: ArtifactRef, key: str) -> Any:
        try:
            return artifacts.load(artifact, key=key, base_url=self.run.operator.artifact_store)
        except artifacts.ArtifactError as error:
            raise StoredOutputError(str(error)) from error

    def shown_params(self, params: Any) -> Any:
        """The params through Airflow's secrets masker, kept as the task's one rendered field
        (``resolved_params``: see :class:`PlanNodeOperator`)."""
        from airflow_plan_provider.compat import redact

        shown = redact(params)
        self.run.operator.show_resolved_params(shown)
        return shown

    def call(self, tool: Tool, params: Any, ctx: ToolContext) -> Any:
        self.run.operator.send_label()  # the tool may run long: the grid shows it running, labelled
        with span("plan.node", node_id=ctx.node_id, tool=tool.name, revision=ctx.revision):
            return tool.call(params, ctx)


class _ToolsWhenNeeded(Mapping[str, Tool]):
    """The operator's tools, loaded when the step first looks one up (a skipped or reused node loads none),
    with those its sources listed when the run planned (:func:`~.layout.pull_tools`)."""

    def __init__(self, spec: ToolRegistry | str | None, ti: Any) -> None:
        self.spec, self.ti, self._tools = spec, ti, cast(ToolRegistry | None, None)

    def _loaded(self) -> ToolRegistry:
        if self._tools is None:
            self._tools = pull_tools(self.ti, load_tools(self.spec))
        return self._tools

    def __getitem__(self, name: str) -> Tool:
        return self._loaded()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._loaded())

    def __len__(self) -> int:
        return len(self._loaded())


class PlanNodeOperator(BaseOperator):
    """Run node ``plan_node`` (its mapped value) of the plan published by the planning task (one instance
    per mapped node), from its brief (:class:`~airflow_plan_provider.contract.NodeBrief`: the node, its
    parents, where their instances are, the run's context as the node needs it). The mapped value is
    the brief itself, or in a node task of more than 32 instances the node's label (``id · action``),
    and the node then reads its brief from its group, the one XCom it reads to start
    (:func:`~airflow_plan_provider.contract.mapped_values`). Either way the instance's label in the grid
    is ``id · action`` (:attr:`instance_label`): sent to Airflow from the task's own thread once the
    instance has run for :data:`LABEL_AFTER` seconds (in its wait for its parents, or as it calls its
    tool) or as it stops to wait, and otherwise with its final state.

    Starts when its own parents have finished (no layer barrier): while they run it waits in its slot,
    then on the triggerer, and it gives its slot back to a parent that needs one (see
    :mod:`airflow_plan_provider.plan.waiting` for the rules and why they cannot deadlock; at most
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
    or artifact URI, plus one JSON line per event. The resolved params of a node that called its tool
    are also the rendered field ``resolved_params``, so the task's "Rendered Templates" shows them.
    Nothing of a node is rendered as a template (the plan's text is the planner's, not the DAG
    author's): the task has no template field when it starts, so Airflow sends no rendered fields then,
    and ``resolved_params`` becomes its one field when the params are known, sent once, when the try
    ends (``overwrite_rtif_after_execution``).
    """

    template_fields: Sequence[str] = ()
    ui_color = "#e8f4e4"
    overwrite_rtif_after_execution = True  # sends the rendered fields once the try ends: see above

    def __init__(
        self,
        *,
        plan_node: str | dict[str, Any],
        tools: ToolRegistry | str | None = None,
        artifact_store: str | None = None,
        artifact_threshold: int = artifacts.DEFAULT_THRESHOLD,
        checkpoints: bool = True,
        slot_wait: float = DEFAULT_SLOT_WAIT.total_seconds(),
        pools_count_deferred: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.checkpoints = checkpoints
        self.slot_wait = slot_wait
        self.pools_count_deferred = pools_count_deferred
        self.plan_node = plan_node
        self.tools = tools
        self.artifact_store = artifact_store
        self.artifact_threshold = artifact_threshold
        self.resolved_params: Any = None
        self._label = ""  # this instance's label, known once it starts (see instance_label)
        self._label_sent = False
        self._label_due = float("inf")  # time.monotonic() at which the label is sent, once it starts
        self._job: JobWait | None = None  # an asynchronous tool's job started by this try, until it defers
        self._trigger_made_way = False  # resumed by its parents trigger to make way (resume_after_parents)
        self._came_back = False  # resumed by its parents trigger to wait near them (resume_after_parents)

    def _policy(self) -> WaitingPolicy:
        """The waiting policy of this node task (its ``slot_wait``; every other number the default)."""
        from airflow_plan_provider.plan.waiting import WaitingPolicy

        return WaitingPolicy(slot_wait=self.slot_wait)

    def show_resolved_params(self, shown: Any) -> None:
        """Make the resolved params (secrets masked) this task's one rendered field, which Airflow
        sends when the try ends."""
        self.resolved_params = shown
        self.template_fields = ("resolved_params",)

    @property
    def instance_label(self) -> str:
        """This instance's label, ``id · action`` (its ``map_index_template``), from its mapped value; empty
        until the node starts, so that Airflow does not send it before ``execute`` (see
        :meth:`_labelled_when_seen`)."""
        return self._label

    @contextmanager
    def _labelled_when_seen(self) -> Iterator[None]:
        """Around what the instance does in its process: its label is sent as its tool is called
        (:meth:`send_label`), once it has waited :data:`LABEL_AFTER` seconds in its slot
        (:meth:`sleep_sending_label`), or when it stops to wait (deferred, rescheduled, up for retry:
        states whose message carries no label); a node that skips or fails before its call has the label
        set with its final state. Every send happens on this thread, the one that owns the task's
        channel to its supervisor."""
        self._label_due = time.monotonic() + LABEL_AFTER
        try:
            yield
        except (AirflowSkipException, AirflowFailException):
            raise  # a final state: its message carries the label
        except BaseException:
            self._send_label()
            raise

    def send_label(self) -> None:
        """Send this instance's label now (as its tool is called), unless it was sent already."""
        self._send_label()

    def sleep_sending_label(self, seconds: float) -> None:
        """``time.sleep(seconds)``, sending the label on the way if it falls due meanwhile: how the node
        pauses while it waits in its slot."""
        if not self._label_sent:
            due_in = self._label_due - time.monotonic()
            if due_in < seconds:
                time.sleep(max(due_in, 0.0))
                self._send_label()
                seconds -= max(due_in, 0.0)
        time.sleep(seconds)

    def _send_label(self) -> None:
        """Send this instance's label to Airflow, once. Never raises: at worst the grid shows the map
        index until the instance ends."""
        if self._label_sent or not self._label:
            return
        self._label_sent = True
        from airflow_plan_provider.compat import send_rendered_map_index

        try:
            sent = send_rendered_map_index(self._label)
        except Exception as error:
            sent = False
            self.log.debug("the node's label was not sent (%s)", error)
        if not sent:
            self.log.debug("the node's label comes with its final state")

    def _start(self, context: Context) -> NodeRun:
        ti = context["ti"]
        mapped = self.plan_node
        self._label = mapped_label(mapped) or ""
        if self._label and hasattr(ti, "rendered_map_index"):
            # what the final state's message carries; rendered again after execute, the same: not re-sent
            ti.rendered_map_index = self._label
        node_id = labelled_node(self._label)
        try:
            brief = NodeBrief.model_validate(mapped) if isinstance(mapped, dict) else pull_brief(ti)
        except ValidationError as error:
            raise AirflowFailException(
                f"node {node_id}: its brief is malformed ({error.error_count()} problem(s), first: "
                f"{error.errors()[0]['msg']})"
            ) from None
        if brief is None:
            raise AirflowFailException(f"node {node_id}: the planning task published no brief for it")
        if brief.node_id != node_id:
            raise AirflowFailException(f"node {node_id}: its brief is node {brief.node_id}'s")
        return NodeRun(ti, brief, self)

    def execute(self, context: Context) -> None:
        with self._labelled_when_seen():
            run = self._start(context)
            picked = self._await_parents(run, context)  # a parent still running has no record yet
            unpicked = {p.id: run.brief.location(p.id) for p in run.brief.parents if p.id not in picked}
            records = {**pull_records_at(run.ti, unpicked), **picked}
            step = run.step(records, _ToolsWhenNeeded(self.tools, run.ti))
            self._act(run, step.run())

    def _act(self, run: NodeRun, outcome: StepOutcome) -> None:
        """Do in Airflow's terms what the node's step ended with: push its record, then succeed, skip
        (``AirflowSkipException``), fail for good (``AirflowFailException``), raise the tool's error again
        for Airflow to retry (or fail, when no try is left), or defer to the job's trigger."""
        node_id = run.node.id
        if outcome.kind == "poll":
            assert outcome.job is not None
            self._defer_to_job(run, outcome.job)
        if outcome.kind == "retry":
            assert outcome.error is not None
            retrying = outcome.events[-1].data
            self.log.warning(
                "node %s: try %s failed after %s s (%s); Airflow retries it",
                node_id,
                run.ti.try_number,
                retrying["duration_s"],
                retrying["error"],
            )
            raise outcome.error
        record = outcome.record
        assert record is not None
        run.ti.xcom_push(key=NODE_KEY, value=record.pushed())
        if outcome.kind == "skipped":
            reason = record.error or ""
            raise AirflowSkipException(reason if record.budget_exhausted else f"node {node_id}: {reason}")
        if outcome.kind == "failed":
            if outcome.error is not None:
                raise outcome.error
            raise AirflowFailException(f"node {node_id}: {record.error}")

    def _await_parents(self, run: NodeRun, context: Context) -> dict[str, NodeRecord]:
        """Return once every parent has finished, with the records of the parents whose result was
        picked up from their checkpoints (the others' records are in XCom by then); or defer, step
        aside or make way as the waiting policy decides (:class:`~.node_wait.SlotWait` reads the states
        and applies :mod:`airflow_plan_provider.plan.waiting`, which says when and why)."""
        ti = run.ti
        if not run.brief.parents:
            return {}
        from airflow_plan_provider.operators.node_wait import SlotWait
        from airflow_plan_provider.plan.waiting import Wait

        waiting = SlotWait(
            ti=ti,
            brief=run.brief,
            whole=lambda: (pull_plan(ti), pull_run_context(ti)),
            policy=self._policy(),
            log=self.log,
            pick_up=lambda node_ids: self._checkpoints_of_this_run(run, node_ids),
            sleep=self.sleep_sending_label,
            checkpoints=self.checkpoints,
            made_way=int(context.get("task_reschedule_count") or 0),
            trigger_made_way=self._trigger_made_way,
            came_back=self._came_back,
            task_cap=self.max_active_tis_per_dagrun,
            pools_count_deferred=self.pools_count_deferred,
            checkpoint_keys=run.brief.parent_keys(run.scope, ti.run_id) if self.checkpoints else {},
            artifact_store=self.artifact_store,
        )
        if self._came_back:
            self.log.info("node %s: parents run their tools; waiting for them in its slot", run.node.id)
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
            key = run.key(run.plan.node(node_id))
            saved = artifacts.checkpoint_of_run(key, run.ti.run_id, self.artifact_store)
            if saved is not None:
                records[node_id] = NodeRecord(
                    node_id=node_id, status=NodeStatus.SUCCESS, **checkpointed(saved)
                )
        return records

    def resume_after_parents(
        self,
        context: Context,
        event: dict[str, Any] | None = None,
        started_on_triggerer: bool = False,
        **_: Any,
    ) -> None:
        """Resumed by :class:`ParentsFinishedTrigger` (parents finished, or one needs a slot again), or
        by :class:`~airflow_plan_provider.triggers.start.NodeStartTrigger` for a node Airflow started on
        the triggerer (``started_on_triggerer``, whose log line says why it came to a slot): look at the
        parents again (``execute`` sends the label when it must). An event the trigger cannot have sent
        fails the node, naming the fault (a final state: its message carries the label)."""
        try:
            from airflow_plan_provider.triggers.payloads import validate_parents_event

            validate_parents_event(event)
        except TriggerEventError as error:
            raise self._start(context).fail(str(error)) from error
        # the trigger let the node go for a parent that needs a slot: this try makes way, not defers again
        self._trigger_made_way = event is not None and event.get("status") == "make_way"
        # the trigger let the node go to wait near its parents, once a try: its next deferral waits to the end
        self._came_back = event is not None and event.get("status") == "wait"
        if started_on_triggerer:
            self.log.info("started on the triggerer; %s", _started_because(event))
        self.execute(context)

    def _defer_to_job(self, run: NodeRun, job: JobWait) -> NoReturn:
        """Wait for an asynchronous tool's job on the triggerer (:class:`ToolJobTrigger`), holding no
        worker slot; what the step knows of the try is kept in XCom ``polling`` until it resumes."""
        tool = job.tool
        assert tool is not None and tool.poll is not None
        self._job = job  # a kill from here on cancels it (on_kill; on the triggerer, the trigger's)
        # visible while the node waits, and read back when it resumes (same try, so the XCom stays)
        run.ti.xcom_push(key=POLLING_KEY, value=job.saved())
        self.log.info(
            "node %s: job started (%s); polling every %s s on the triggerer",
            run.node.id,
            job.handle,
            tool.poll_interval,
        )
        from airflow_plan_provider.tools.jobs import callable_path  # only asynchronous tools need these
        from airflow_plan_provider.triggers.job import ToolJobTrigger

        timeout = self._policy().job_timeout(job.timeout or None)
        self.defer(
            trigger=ToolJobTrigger(
                poll_path=callable_path(tool.poll),
                handle=job.handle,
                poll_interval=tool.poll_interval,
                deadline=job.deadline(),
                node_id=run.node.id,
                cancel_path=callable_path(tool.cancel) if tool.cancel else None,
            ),
            method_name="resume_after_job",
            timeout=timedelta(seconds=timeout) if timeout else None,
        )

    def on_kill(self) -> None:
        """The task is killed (marked failed, cleared, or out of time) while it runs: cancel the job its
        try started, when its tool can (:func:`~airflow_plan_provider.tools.jobs.cancel_job`). A job
        the task waits for deferred is cancelled by its trigger (:meth:`ToolJobTrigger.on_kill
        <airflow_plan_provider.triggers.job.ToolJobTrigger.on_kill>`)."""
        job, self._job = self._job, None
        if job is None or job.tool is None or job.tool.cancel is None:
            return
        from airflow_plan_provider.tools.jobs import cancel_job

        failed = cancel_job(job.tool.cancel, job.handle)
        if failed:
            self.log.warning("the job %s was not cancelled: %s", job.handle, failed)
        else:
            self.log.info("the job %s was cancelled", job.handle)

    def resume_after_job(self, context: Context, event: dict[str, Any] | None = None, **_: Any) -> None:
        """Resumed by :class:`~airflow_plan_provider.triggers.job.ToolJobTrigger`: record the job's result,
        or fail the node with its reason. An event the trigger cannot have sent (none, an unknown status,
        a done event without its result) fails the node too, naming the fault."""
        with self._labelled_when_seen():
            run = self._start(context)
            ti = run.ti
            saved = ti.xcom_pull(task_ids=ti.task_id, key=POLLING_KEY, map_indexes=ti.map_index) or {}
            try:
                from airflow_plan_provider.triggers.payloads import validate_job_event

                job, malformed = validate_job_event(event), False
            except TriggerEventError as error:
                from airflow_plan_provider.tools.jobs import JobOutcome

                job, malformed = JobOutcome("failed", reason=str(error)), True
            self._act(run, run.step().job_ended(JobWait.from_saved(saved), job, malformed=malformed))


def _hostname(ti: Any) -> str:
    """The worker's name, as Airflow's task runner set it (from ``[core] hostname_callable``)."""
    hostname = getattr(ti, "hostname", None)
    if hostname:
        return str(hostname)
    import socket

    from airflow_plan_provider.airflow_features import sdk_conf

    return str(sdk_conf().getimport("core", "hostname_callable", fallback=socket.getfqdn)())


def _started_because(event: Mapping[str, Any] | None) -> str:
    """Why a node started on the triggerer came to a slot, from its start trigger's (checked) event."""
    assert event is not None  # validate_parents_event refused a missing one
    if event.get("status") == "wait":
        return "its parents run their tools"
    if event.get("parents_read") is False:
        return "its trigger did not read its parents (its log says why); it reads them here"
    return "its parents finished or saved their results"
