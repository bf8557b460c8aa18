"""Run a validated plan in this process, without Airflow, by the rules the plan DAG's node tasks follow.

Nodes run on a thread pool (``NodeExecution.max_active_nodes`` threads, one per node when ``None``); each
starts as soon as its own parents have finished (there is no layer barrier). A node decides with
:func:`~airflow_plan_provider.plan.decisions.decide` (skip below a failed hard parent or a replan request;
run with the missing optional inputs named), reuses a locked node's output, respects the step budget,
gets its params from :func:`~airflow_plan_provider.plan.calls.call_params`, and calls its tool: a
:class:`~airflow_plan_provider.exceptions.TransientToolError` (or any other exception) is retried up to
``NodeExecution.retries`` times, a :class:`~airflow_plan_provider.exceptions.PermanentToolError` fails
the node at once, a :class:`~airflow_plan_provider.exceptions.ReplanRequested` keeps the output and makes
the node's children moot. An asynchronous tool's job is polled in the node's thread. The run ends with
:func:`~airflow_plan_provider.plan.conclusion.conclude` and a :class:`SessionResult`; the session moves
through the same transitions as the plan DAG's (:mod:`airflow_plan_provider.plan.session`,
:mod:`airflow_plan_provider.plan.conclusion`)::

    plan = validate_plan(raw, tools)
    result = run_plan(plan, tools, execution=NodeExecution(max_active_nodes=8))
    print(result.summary_text())

Every try's events are kept, in order (the plan DAG keeps a retried node's earlier tries in its task log).
Outputs stay in memory: nothing is written to an artifact store or a checkpoint.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from graphlib import TopologicalSorter
from typing import Any

from airflow_plan_provider.exceptions import (
    PermanentToolError,
    PlanningError,
    ReplanRequested,
    TransientToolError,
)
from airflow_plan_provider.plan.budgets import Budgets, step_refused
from airflow_plan_provider.plan.calls import CallRefused, call_params, idempotency_key
from airflow_plan_provider.plan.conclusion import conclude, fail_session, finish_session, prepare_replan
from airflow_plan_provider.plan.decisions import NodeStatus, decide
from airflow_plan_provider.plan.events import make_event, outcome_event
from airflow_plan_provider.plan.merge import merge_replan
from airflow_plan_provider.plan.model import ValidatedPlan
from airflow_plan_provider.plan.problems import capped
from airflow_plan_provider.plan.result import Event, NodeRecord, SessionResult, now, summarize
from airflow_plan_provider.plan.session import (
    PlanSource,
    SessionState,
    continue_session,
    record_node_outcomes,
    record_plan,
    record_planning_failure,
    replan_run_id,
    start_session,
)
from airflow_plan_provider.plan.validate import Limits, validate_plan
from airflow_plan_provider.planners.base import Planner, plan_with_repairs, replan_request
from airflow_plan_provider.settings import NodeExecution
from airflow_plan_provider.tools.jobs import JobStatus
from airflow_plan_provider.tools.registry import Tool, ToolContext, ToolRegistry

LOCAL_DAG_ID = "local"  # what a local run's events and idempotency keys name as their DAG


def _local_session(
    plan: ValidatedPlan, budgets: Budgets | None = None, source: PlanSource = "conf"
) -> SessionState:
    """A new session that has recorded ``plan`` (from ``source``: ``conf`` for a ready plan, which no
    planner replans)."""
    run_id = f"local__{datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%S.%f')}"
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
    """
    execution = execution or NodeExecution()
    state = _local_session(plan, budgets, "planner" if planner is not None else "conf")
    while True:
        runner = _NodeRunner(plan, tools, state, execution)
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
                inputs = {p: r.output for p, r in parents.items() if r.status is NodeStatus.SUCCESS}
                running[pool.submit(runner.run, node_id, parents, inputs)] = node_id
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                node_id = running.pop(future)
                records[node_id] = future.result()
                order.done(node_id)
    return {n: records[n] for n in plan.node_ids}


@dataclass
class _NodeRunner:
    plan: ValidatedPlan
    tools: ToolRegistry
    state: SessionState
    execution: NodeExecution

    def run(self, node_id: str, parents: Mapping[str, NodeRecord], inputs: Mapping[str, Any]) -> NodeRecord:
        """Decide, call the tool and record the outcome of one node (in a pool thread)."""
        node, state = self.plan.node(node_id), self.state
        call = _Call(self, node_id, node.tool)
        statuses = {p: r.status for p, r in parents.items()}
        moot = [p for p, r in parents.items() if r.replan_requested]
        decision = decide(self.plan, node_id, statuses, moot)
        if decision.action != "run":
            return call.outcome(NodeStatus.SKIPPED, error=decision.reason)
        if node_id in state.locked:
            locked = state.locked[node_id]
            return call.outcome(
                NodeStatus.SUCCESS, locked.output, reused=True, attempts=0, output_summary=locked.summary
            )
        position = state.execution_order.index(node_id)
        refused = step_refused(state.budgets, state.usage.steps, position, node_id)
        if refused is not None:
            return call.outcome(NodeStatus.SKIPPED, budget_exhausted=True, error=refused)
        call.missing = list(decision.missing)
        tool = self.tools.get(node.tool)
        if tool is None:
            return call.outcome(NodeStatus.FAILED, error=f"unknown tool {node.tool!r}")
        try:
            params = call_params(node, tool, inputs)
        except CallRefused as error:
            return call.outcome(NodeStatus.FAILED, error=str(error))
        key = idempotency_key(state.dag_id, state.root_run_id, node_id, node.tool, node.params)
        return call.tries(tool, params, key)


@dataclass
class _Call:
    """One node's tries: its events and the record they end in."""

    runner: _NodeRunner
    node_id: str
    tool: str
    missing: list[str] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    attempt: int = 0
    started: float | None = None
    started_at: str = field(default_factory=now)

    def event(self, type_: str, /, **data: Any) -> None:
        self.events.append(make_event(type_, self.runner.state.source, self.node_id, tool=self.tool, **data))

    def duration(self) -> float | None:
        return None if self.started is None else round(time.time() - self.started, 3)

    def tries(self, tool: Tool, params: Any, key: str) -> NodeRecord:
        state = self.runner.state
        while True:
            self.attempt += 1
            ctx = ToolContext(
                node_id=self.node_id,
                idempotency_key=key,
                attempt=self.attempt,
                missing_inputs=tuple(self.missing),
                run_id=state.run_ids[-1] if state.run_ids else state.root_run_id,
                revision=state.revision,
            )
            self.started = time.time()
            self.event("node.started", attempt=self.attempt, key=key, missing_inputs=self.missing)
            try:
                output = tool.call(params, ctx)
                if tool.is_async:
                    return self.job(tool, output)
            except ReplanRequested as request:
                return self.succeed(request.output, replan_requested=True, error=request.reason)
            except PermanentToolError as error:
                return self.outcome(NodeStatus.FAILED, error=error.reason)
            except Exception as error:
                transient = error if isinstance(error, TransientToolError) else None
                reason = transient.reason if transient else f"{type(error).__name__}: {error}"
                if self.attempt > self.runner.execution.retries:
                    return self.outcome(NodeStatus.FAILED, error=reason)
                self.event("node.retrying", attempt=self.attempt, duration_s=self.duration(), error=reason)
                retry_after = transient.retry_after if transient else None
                time.sleep(retry_after or retry_delay(self.runner.execution, self.attempt))
                continue
            return self.succeed(output)

    def job(self, tool: Tool, handle: Any) -> NodeRecord:
        """Poll an asynchronous tool's job in this thread until it ends or its timeout passes (the plan
        DAG polls it on the triggerer, with the same outcomes)."""
        assert tool.poll is not None
        default = self.runner.execution.timeout
        timeout = tool.timeout or (default.total_seconds() if default else None)
        polling: dict[str, Any] = {"handle": handle, "since": now(), "timeout": timeout}
        self.event("node.polling", handle=summarize(handle, 200), timeout=timeout)
        deadline = None if timeout is None else time.time() + timeout
        while True:
            try:
                status = tool.poll(handle)
            except Exception as error:  # a poll that raises ends the job as failed, with the reason
                status = JobStatus.failed(f"polling raised {type(error).__name__}: {error}")
            if not isinstance(status, JobStatus):
                status = JobStatus.failed(f"poll returned {type(status).__name__}, expected JobStatus")
            outcome: str = status.state
            if outcome != "pending":
                reason = status.reason or "the job failed"
                break
            if deadline is not None and time.time() >= deadline:
                outcome, reason = "timeout", "the job did not finish before its timeout"
                break
            time.sleep(tool.poll_interval)
        polling = {**polling, "until": now(), "outcome": outcome}
        if outcome != "done":
            return self.outcome(NodeStatus.FAILED, error=f"job {outcome}: {reason}", polling=polling)
        return self.succeed(status.result, polling=polling)

    def succeed(self, output: Any, **fields: Any) -> NodeRecord:
        try:
            json.dumps(output)
        except (TypeError, ValueError) as error:
            return self.outcome(NodeStatus.FAILED, error=f"tool output is not JSON-serialisable: {error}")
        return self.outcome(NodeStatus.SUCCESS, output, output_summary=summarize(output), **fields)

    def outcome(self, status: NodeStatus, output: Any = None, **fields: Any) -> NodeRecord:
        """The node's record (and its outcome event)."""
        state = self.runner.state
        node = self.runner.plan.node(self.node_id)
        fields.setdefault("attempts", self.attempt)
        record = NodeRecord(
            node_id=node.id,
            revision=state.revision,
            action=node.action,
            tool=node.tool,
            status=status,
            missing_inputs=self.missing,
            duration_s=self.duration(),
            **fields,
        )
        self.events.append(outcome_event(record, self.runner.state.source, record.attempts))
        record.events = list(self.events)
        record.output = output if status is NodeStatus.SUCCESS else None
        return record


def retry_delay(execution: NodeExecution, attempt: int) -> float:
    """Seconds before the try after ``attempt``: ``retry_delay * retry_exponential_backoff **
    (attempt - 1)``, at most ``max_retry_delay`` (Airflow's rule, without its jitter)."""
    delay = execution.retry_delay.total_seconds()
    if execution.retry_exponential_backoff:
        delay *= execution.retry_exponential_backoff ** (attempt - 1)
    return min(delay, execution.max_retry_delay.total_seconds())
