"""The local runner: a validated plan run in this process, on threads, without Airflow, by the rules the
plan DAG's node tasks follow (it is what ``airflow-plan run`` runs).

Nodes run on a thread pool (``NodeExecution.max_active_nodes`` threads, one per node when ``None``); each
starts as soon as its own parents have finished (there is no layer barrier). Each try of a node is the
plan DAG's node step (:class:`~airflow_plan_provider.plan.node_step.NodeStep`: decide, reuse a locked
output or a checkpoint, the step budget, params, the call, the outcome); this module only loops over the
tries: a failed try that is not a :class:`~airflow_plan_provider.exceptions.PermanentToolError` is
retried up to ``NodeExecution.retries`` times, after Airflow's delays; an asynchronous tool's job is
polled in the node's thread by the trigger's rules. The run ends with
:func:`~airflow_plan_provider.plan.conclusion.conclude` and a :class:`SessionResult`; the session moves
through the same transitions as the plan DAG's (:mod:`airflow_plan_provider.plan.session`,
:mod:`airflow_plan_provider.plan.conclusion`)::

    plan = validate_plan(raw, tools)
    result = run_plan(plan, tools, execution=NodeExecution(max_active_nodes=8))
    print(result.summary_text())

Every try's events are kept, in order (the plan DAG keeps a retried node's earlier tries in its task log).
Outputs stay in memory, checkpoints too (in ``run_plan``'s ``checkpoints``): nothing is written to an
artifact store.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import UTC, datetime
from graphlib import TopologicalSorter
from typing import Any

from airflow_plan_provider.exceptions import PlanningError
from airflow_plan_provider.plan.budgets import Budgets
from airflow_plan_provider.plan.calls import key_scope
from airflow_plan_provider.plan.conclusion import conclude, fail_session, finish_session, prepare_replan
from airflow_plan_provider.plan.decisions import NodeStatus
from airflow_plan_provider.plan.merge import merge_replan
from airflow_plan_provider.plan.model import ValidatedPlan
from airflow_plan_provider.plan.node_step import (
    JobWait,
    NodeInputs,
    NodeStep,
    StoredOutputError,
    TryContext,
)
from airflow_plan_provider.plan.result import ArtifactRef, Event, NodeRecord, SessionResult
from airflow_plan_provider.plan.session import (
    LockedOutput,
    PlanSource,
    SessionState,
    continue_session,
    record_node_outcomes,
    record_plan,
    record_planning_failure,
    replan_run_id,
    run_context,
    start_session,
)
from airflow_plan_provider.plan.validate import Limits, validate_plan
from airflow_plan_provider.planners.base import Planner, plan_with_repairs, replan_request
from airflow_plan_provider.problems import capped
from airflow_plan_provider.settings import NodeExecution
from airflow_plan_provider.tools.jobs import JobOutcome, poll_once
from airflow_plan_provider.tools.registry import ToolRegistry
from airflow_plan_provider.tools.tool import Tool, ToolContext

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())  # a library logs only where its user configured logging

LOCAL_DAG_ID = "local"  # what a local run's events and idempotency keys name as their DAG


def _local_session(
    plan: ValidatedPlan,
    budgets: Budgets | None = None,
    source: PlanSource = "conf",
    run_id: str | None = None,
) -> SessionState:
    """A new session that has recorded ``plan`` (from ``source``: ``conf`` for a ready plan, which no
    planner replans), begun by run ``run_id`` (by default ``local__<UTC time>``)."""
    run_id = run_id or f"local__{datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%S.%f')}"
    state = start_session(goal=plan.goal, budgets=budgets, dag_id=LOCAL_DAG_ID, run_id=run_id)
    return record_plan(state, plan, source=source)


def run_plan(
    plan: ValidatedPlan,
    tools: ToolRegistry,
    *,
    planner: Planner | None = None,
    budgets: Budgets | None = None,
    limits: Limits | None = None,
    repair_attempts: int = 2,
    execution: NodeExecution | None = None,
    run_id: str | None = None,
    checkpoints: MutableMapping[str, dict[str, Any]] | None = None,
) -> SessionResult:
    """Run ``plan`` (validated against ``tools``) to the end of its session and report the result.

    Without a ``planner`` the plan is a ready plan: a replan request or a failure ends the session. With
    one, a run that concludes "replan" asks it for the affected subgraph (the locked nodes are reused,
    not run again) and runs the next revision, within ``budgets`` (steps and replans), as the plan
    DAG's replan runs do; ``limits`` and ``repair_attempts`` apply to its replies.

    ``execution`` are the node settings a plan DAG uses: ``max_active_nodes`` threads (``None``: one per
    node); ``retries`` more tries after a failed try (not a permanent failure), ``retry_delay`` growing
    by ``retry_exponential_backoff`` up to ``max_retry_delay`` (or the delay the tool asked for,
    ``retry_after``); ``timeout`` bounds an asynchronous tool's job when the tool sets none (a thread
    running a tool cannot be stopped, so it bounds nothing else). ``mode`` and ``pool`` do not apply.

    ``run_id`` names the session's root run (by default ``local__<UTC time>``); with it, the nodes'
    idempotency keys. ``checkpoints`` maps idempotency keys to what a node's succeeded call saved: a node
    whose key has one is reused, not called again, and each succeeded call adds its own (by default a
    new dict: give the same ``run_id`` and ``checkpoints`` again to resume a run without repeating calls).
    """
    execution = execution or NodeExecution()
    checkpoints = {} if checkpoints is None else checkpoints
    state = _local_session(plan, budgets, "planner" if planner is not None else "conf", run_id)
    while True:
        runner = _NodeRunner(plan, tools, state, execution, checkpoints)
        records = _run_nodes(plan, runner, execution.max_active_nodes or len(plan.node_ids))
        state = record_node_outcomes(state, plan, records)
        conclusion = conclude(plan, records, state)
        shown = {n: r.output for n, r in records.items() if r.status is NodeStatus.SUCCESS}
        if conclusion.kind != "replan" or planner is None:
            return finish_session(state, conclusion, shown)[1]
        _, following = prepare_replan(state, conclusion, records, shown)
        run_id = replan_run_id(following.root_run_id, following.revision)
        state = continue_session(following, dag_id=LOCAL_DAG_ID, run_id=run_id)
        try:
            outcome = plan_with_repairs(
                planner,
                replan_request(state, plan, tools, limits),
                _replacement_check(plan, state.locked, tools, limits),
                repair_attempts=repair_attempts,
            )
        except PlanningError as error:
            shown_problems, more = capped(error.problems)
            state = record_planning_failure(
                state,
                reason=error.reason,
                message=(str(error).splitlines() or [""])[0],
                problems=[p.to_dict() for p in shown_problems],
                more_problems=more,
                usage=error.usage,
            )
            return fail_session(state, "replan_failed", str(error))[1]
        plan = outcome.plan
        state = record_plan(state, plan, usage=outcome.usage, attempts=outcome.attempts)


def _replacement_check(
    current: ValidatedPlan, locked: Iterable[str], tools: ToolRegistry, limits: Limits | None
) -> Callable[[Any], ValidatedPlan]:
    """How a planner's replacement subgraph becomes the next revision's plan (or a problem list)."""
    kept = set(locked)
    return lambda raw: validate_plan(merge_replan(current, raw, kept)[0], tools, limits)


def _run_nodes(plan: ValidatedPlan, runner: _NodeRunner, max_workers: int) -> dict[str, NodeRecord]:
    """Every node's record (with its output when it succeeded); a node is submitted the moment its last
    parent's outcome is in."""
    records: dict[str, NodeRecord] = {}
    order = TopologicalSorter(plan.parents)
    order.prepare()
    running: dict[Future[NodeRecord], str] = {}
    with ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="plan-node") as pool:
        while order.is_active():
            for node_id in order.get_ready():
                parents = {p: records[p] for p in plan.parents[node_id]}
                running[pool.submit(runner.run, node_id, parents)] = node_id
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                node_id = running.pop(future)
                records[node_id] = future.result()
                order.done(node_id)
    return {n: records[n] for n in plan.node_ids}


@dataclass
class _LocalHost:
    """The node step's host in this process: outputs stay in the records, checkpoints in ``checkpoints``,
    log lines go to this module's logger, events to the node's record."""

    state: SessionState
    checkpoints: MutableMapping[str, dict[str, Any]]

    def log(self, level: int, message: str, *args: Any) -> None:
        log.log(level, message, *args)

    def publish(self, event: Event) -> None:
        """Events reach the session through the node's record."""

    def locked(self, node_id: str) -> LockedOutput:
        return self.state.locked[node_id]

    def load_checkpoint(self, key: str) -> dict[str, Any] | None:
        return self.checkpoints.get(key)

    def save_checkpoint(self, key: str, saved: dict[str, Any]) -> None:
        self.checkpoints[key] = saved

    def store_output(self, text: str, summary: str, key: str) -> dict[str, Any] | None:
        return None  # outputs stay in memory

    def load_output(self, artifact: ArtifactRef, key: str) -> Any:
        raise StoredOutputError(f"artifact {artifact.uri}: a local run reads no artifact store")

    def shown_params(self, params: Any) -> Any:
        return params

    def call(self, tool: Tool, params: Any, ctx: ToolContext) -> Any:
        return tool.call(params, ctx)


@dataclass
class _NodeRunner:
    plan: ValidatedPlan
    tools: ToolRegistry
    state: SessionState
    execution: NodeExecution
    checkpoints: MutableMapping[str, dict[str, Any]]

    def run(self, node_id: str, parents: Mapping[str, NodeRecord]) -> NodeRecord:
        """One node's tries (in a pool thread), each a :class:`NodeStep`, until one ends the node; the
        record keeps every try's events, in order."""
        state, host = self.state, _LocalHost(self.state, self.checkpoints)
        run = run_context(state)
        inputs = NodeInputs(self.plan, node_id, run, run.position(node_id), parents, self.tools)
        timeout = self.execution.timeout.total_seconds() if self.execution.timeout else None
        earlier: list[Event] = []
        for try_number in itertools.count(1):
            ctx = TryContext(
                run_id=state.source.run_id,
                scope=key_scope(LOCAL_DAG_ID),
                source=state.source,
                try_number=try_number,
                retries=self.execution.retries,
                job_timeout=timeout,
            )
            step = NodeStep(inputs, ctx, host)
            outcome = step.run()
            if outcome.kind == "poll":
                assert outcome.job is not None
                outcome = step.job_ended(outcome.job, wait_for_job(outcome.job))
            if outcome.record is not None:
                outcome.record.events = earlier + outcome.record.events
                return outcome.record
            delay = outcome.retry_after or retry_delay(self.execution, try_number)
            log.warning(
                "node %s: try %s failed (%s); retried in %s s", node_id, try_number, outcome.error, delay
            )
            earlier += outcome.events
            time.sleep(delay)
        raise AssertionError("unreachable: the tries end with a record")


def wait_for_job(job: JobWait) -> JobOutcome:
    """Poll an asynchronous tool's job in this thread until it ends or its timeout passes, by the rules
    the plan DAG's trigger follows (:func:`~airflow_plan_provider.tools.jobs.poll_once`)."""
    assert job.tool is not None and job.tool.poll is not None
    deadline = job.deadline()
    while (outcome := poll_once(job.tool.poll, job.handle, deadline)) is None:
        time.sleep(job.tool.poll_interval)
    return outcome


def retry_delay(execution: NodeExecution, attempt: int) -> float:
    """Seconds before the try after ``attempt``: ``retry_delay * retry_exponential_backoff **
    (attempt - 1)``, at most ``max_retry_delay`` (Airflow's rule, without its jitter)."""
    delay = execution.retry_delay.total_seconds()
    if execution.retry_exponential_backoff:
        delay *= execution.retry_exponential_backoff ** (attempt - 1)
    return min(delay, execution.max_retry_delay.total_seconds())
