"""The node step (plan/node_step.py) on its own: one try of a node, hosted by a small in-memory host.

The host here keeps checkpoints and stored outputs in dicts and records log lines and events; every rule
under test is the step's (its hosts are compared in tests/airflow/test_node_step_hosts.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from airflow_plan_provider.exceptions import PermanentToolError, ReplanRequested, TransientToolError
from airflow_plan_provider.plan.budgets import Budgets
from airflow_plan_provider.plan.calls import key_scope, node_key
from airflow_plan_provider.plan.decisions import NodeStatus
from airflow_plan_provider.plan.events import EventSource
from airflow_plan_provider.plan.node_step import (
    JobWait,
    NodeInputs,
    NodeStep,
    StoredOutputError,
    TryContext,
)
from airflow_plan_provider.plan.result import ArtifactRef, Event, NodeRecord
from airflow_plan_provider.plan.session import LockedOutput, RunContext
from airflow_plan_provider.plan.validate import validate_plan
from airflow_plan_provider.tools.jobs import JobOutcome, JobStatus, poll_once
from airflow_plan_provider.tools.registry import ToolRegistry
from airflow_plan_provider.tools.tool import Tool, ToolContext

SOURCE = EventSource("d", "r1", "r1", 0)
SHA = "0" * 64


@dataclass
class Host:
    """A host in memory; ``stored`` maps artifact URIs to outputs, ``store_over`` is its threshold."""

    checkpoints: dict[str, dict[str, Any]] = field(default_factory=dict)
    stored: dict[str, Any] = field(default_factory=dict)
    store_over: int | None = None
    locked_outputs: dict[str, LockedOutput] = field(default_factory=dict)
    lines: list[tuple[int, str]] = field(default_factory=list)
    published: list[Event] = field(default_factory=list)
    calls: list[ToolContext] = field(default_factory=list)
    checkpoint_fails: bool = False

    def log(self, level: int, message: str, *args: Any) -> None:
        self.lines.append((level, message % args))

    def publish(self, event: Event) -> None:
        self.published.append(event)

    def locked(self, node_id: str) -> LockedOutput:
        return self.locked_outputs[node_id]

    def load_checkpoint(self, key: str) -> dict[str, Any] | None:
        return self.checkpoints.get(key)

    def save_checkpoint(self, key: str, saved: dict[str, Any]) -> None:
        if self.checkpoint_fails:
            raise OSError("store is read-only")
        self.checkpoints[key] = saved

    def store_output(self, text: str, summary: str, key: str) -> dict[str, Any] | None:
        if self.store_over is None or len(text) <= self.store_over:
            return None
        uri = f"mem://{key}"
        self.stored[uri] = text
        return ArtifactRef(uri=uri, size=len(text), sha256=SHA, summary=summary).model_dump()

    def load_output(self, artifact: ArtifactRef, key: str) -> Any:
        if artifact.uri != f"mem://{key}":
            raise StoredOutputError(f"artifact {artifact.uri} was not stored for this node")
        if artifact.uri not in self.stored:
            raise StoredOutputError(f"artifact {artifact.uri} is missing from the store")
        return self.stored[artifact.uri]

    def shown_params(self, params: Any) -> Any:
        return params

    def call(self, tool: Tool, params: Any, ctx: ToolContext) -> Any:
        self.calls.append(ctx)
        return tool.call(params, ctx)

    def said(self, text: str) -> bool:
        return any(text in line for _, line in self.lines)


def registry(behaviour: Any = None, *, poll: Any = None, timeout: float | None = None) -> ToolRegistry:
    """Tools ``get`` (returns {"v": 1}), ``use`` (returns its params; ``behaviour`` replaces it)."""

    def use(ctx: ToolContext, **params: Any) -> Any:
        return behaviour(params, ctx) if behaviour else params

    return ToolRegistry(
        [
            Tool("get", "d", lambda: {"v": 1}, {"type": "object"}),
            Tool("use", "d", use, {"type": "object"}, poll=poll, poll_interval=0.01, timeout=timeout),
        ]
    )


PLAN = {
    "goal": "g",
    "nodes": [
        {"id": "a", "action": "get a", "tool": "get", "params": {}},
        {"id": "b", "action": "get b", "tool": "get", "params": {}},
        {"id": "c", "action": "use a and b", "tool": "use", "params": {"a": "${a.v}", "b": "${b}"}},
    ],
    "edges": [{"from": "a", "to": "c"}, {"from": "b", "to": "c", "optional": True}],
}


def step(
    tools: ToolRegistry,
    parents: dict[str, NodeRecord | None] | None = None,
    host: Host | None = None,
    *,
    try_number: int = 1,
    retries: int = 0,
    node_id: str = "c",
    around: bool = False,
    **run: Any,
) -> NodeStep:
    """A try of ``node_id`` of :data:`PLAN`; ``around``: given the node and its parents only, as a node
    task is (``ValidatedPlan.around`` and ``RunContext.for_node``), not the whole plan and context."""
    plan = validate_plan(PLAN, tools)
    context = RunContext(root_run_id="r1", execution_order=["a", "b", "c"], **run)
    position = context.position(node_id)
    if around:
        plan, context = plan.around(node_id), context.for_node(node_id)
    if parents is None:
        parents = {p: ok(p) for p in plan.parents[node_id]}
    ctx = TryContext(run_id="r1", scope="d", source=SOURCE, try_number=try_number, retries=retries)
    return NodeStep(NodeInputs(plan, node_id, context, position, parents, tools), ctx, host or Host())


def ok(node_id: str, output: Any = None) -> NodeRecord:
    record = NodeRecord(node_id=node_id, status=NodeStatus.SUCCESS)
    record.output = {"v": 1} if output is None else output
    return record


def test_a_node_whose_parents_succeeded_calls_its_tool_with_the_resolved_params_and_its_key() -> None:
    host = Host()
    this = step(registry(), host=host)
    outcome = this.run()
    assert outcome.kind == "succeeded" and outcome.record is not None
    record = outcome.record
    assert (record.status, record.output, record.attempts) == ("success", {"a": 1, "b": {"v": 1}}, 1)
    key = node_key("d", "r1", this.node)
    assert host.calls[0].idempotency_key == key == this.key and key.startswith("d/r1/c/")
    assert (
        [e.type for e in record.events]
        == ["node.started", "node.succeeded"]
        == [e.type for e in host.published]
    )
    assert record.events[0].data["key"] == key
    assert host.checkpoints[key]["output"] == {"a": 1, "b": {"v": 1}}  # saved before the record
    assert host.checkpoints[key]["attempts"] == 1 and host.checkpoints[key]["run_id"] == "r1"
    assert host.said("node c runs: every parent succeeded") and host.said("node c succeeded in ")


def test_a_failed_hard_parent_skips_the_node_and_a_missing_record_counts_as_failed() -> None:
    host = Host()
    outcome = step(registry(), {"a": None, "b": ok("b")}, host).run()
    assert outcome.kind == "skipped" and outcome.record is not None
    assert (outcome.record.status, outcome.record.error) == ("skipped", "parent a failed")
    assert host.calls == [] and [e.type for e in host.published] == ["node.skipped"]
    assert host.published[0].data["reason"] == "parent a failed"


def test_a_parent_that_requested_a_replan_skips_the_node() -> None:
    moot = ok("a").model_copy(update={"replan_requested": True})
    outcome = step(registry(), {"a": moot, "b": ok("b")}).run()
    assert outcome.record is not None and outcome.record.error == "parent a requested a replan"


def test_a_failed_optional_parent_is_a_missing_input_reaching_the_tool_as_none() -> None:
    host = Host()
    failed = NodeRecord(node_id="b", status=NodeStatus.FAILED)
    outcome = step(registry(), {"a": ok("a"), "b": failed}, host).run()
    assert outcome.record is not None and outcome.record.output == {"a": 1, "b": None}
    assert outcome.record.missing_inputs == ["b"] and host.calls[0].missing_inputs == ("b",)
    assert outcome.events[0].data["missing_inputs"] == ["b"]
    assert (
        logging.WARNING,
        "node c runs with missing inputs: optional parent(s) b did not succeed",
    ) in host.lines


def test_a_locked_node_is_reused_without_a_call_or_a_try() -> None:
    host = Host(locked_outputs={"c": LockedOutput(action="x", tool="use", output=[1], summary="[1]")})
    outcome = step(registry(), host=host, reused=["c"]).run()
    assert outcome.record is not None and host.calls == []
    assert (outcome.record.reused, outcome.record.attempts, outcome.record.output) == (True, 0, [1])
    assert [e.type for e in outcome.events] == ["node.reused"]


def test_a_checkpoint_of_the_key_stands_for_the_call() -> None:
    host = Host()
    this = step(registry(), host=host)
    host.checkpoints[this.key] = {"output": "done", "output_summary": "done", "attempts": 3, "run_id": "r0"}
    outcome = this.run()
    assert outcome.record is not None and host.calls == []
    record = outcome.record
    assert (record.status, record.output, record.reused, record.checkpoint) == ("success", "done", True, True)
    assert record.attempts == 1  # this try's number: the checkpoint's describes an earlier try
    assert outcome.events[-1].data["checkpoint"] is True


def test_the_step_budget_refuses_a_node_past_it() -> None:
    host = Host()
    outcome = step(registry(), host=host, budgets=Budgets(max_steps=3), steps_used=1).run()
    assert outcome.kind == "skipped" and outcome.record is not None and host.calls == []
    assert outcome.record.budget_exhausted
    assert outcome.record.error == "step budget spent: node c would be step 4 of 3"


def test_a_transient_failure_with_tries_left_asks_for_a_retry_with_the_delay_the_tool_asked() -> None:
    def rate_limited(params: Any, ctx: ToolContext) -> Any:
        raise TransientToolError("429", retry_after=7)

    outcome = step(registry(rate_limited), retries=1).run()
    assert (outcome.kind, outcome.record, outcome.retry_after) == ("retry", None, 7)
    assert isinstance(outcome.error, TransientToolError)
    assert [e.type for e in outcome.events] == ["node.started", "node.retrying"]
    assert outcome.events[-1].data["error"] == "429"


def test_the_last_try_s_failure_fails_the_node_and_keeps_the_error_to_raise() -> None:
    def broken(params: Any, ctx: ToolContext) -> Any:
        raise ConnectionError("reset")

    outcome = step(registry(broken), try_number=2, retries=1).run()
    assert outcome.kind == "failed" and outcome.record is not None
    assert (outcome.record.error, outcome.record.attempts) == ("ConnectionError: reset", 2)
    assert isinstance(outcome.error, ConnectionError)


def test_a_permanent_failure_fails_at_once_whatever_tries_are_left() -> None:
    def refused(params: Any, ctx: ToolContext) -> Any:
        raise PermanentToolError("403")

    host = Host()
    outcome = step(registry(refused), host=host, retries=3).run()
    assert outcome.kind == "failed" and outcome.error is None and outcome.record is not None
    assert outcome.record.error == "403" and host.said("node c failed after ")


def test_a_replan_request_keeps_the_output_and_is_checkpointed() -> None:
    def moot(params: Any, ctx: ToolContext) -> Any:
        raise ReplanRequested("nothing to do", output={"n": 0})

    host = Host()
    this = step(registry(moot), host=host)
    outcome = this.run()
    assert outcome.kind == "succeeded" and outcome.record is not None
    record = outcome.record
    assert (record.replan_requested, record.error, record.output) == (True, "nothing to do", {"n": 0})
    assert host.checkpoints[this.key]["replan_requested"] is True


def test_an_output_that_is_not_json_fails_the_node() -> None:
    outcome = step(registry(lambda params, ctx: {1, 2})).run()
    assert outcome.record is not None and outcome.record.status == "failed"
    assert (outcome.record.error or "").startswith("tool output is not JSON-serialisable")


def test_unknown_tool_and_invalid_params_fail_the_node() -> None:
    tools = registry()
    plan_tools = ToolRegistry([tools["get"], tools["use"]])
    this = step(plan_tools)
    this.inputs = NodeInputs(
        this.inputs.plan, "c", this.inputs.run, 2, this.inputs.parents, {"get": tools["get"]}
    )
    outcome = this.run()
    assert outcome.record is not None and outcome.record.error == "unknown tool 'use'"
    strict = Tool("use", "d", lambda a, b: 0, {"type": "object", "properties": {"a": {"type": "string"}}})
    refused = step(ToolRegistry([tools["get"], strict])).run()
    assert refused.record is not None and "params for tool 'use' are invalid" in (refused.record.error or "")


def test_a_large_output_goes_to_the_host_s_store_and_a_child_reads_it_back() -> None:
    host = Host(store_over=10)
    outcome = step(registry(lambda params, ctx: "x" * 50), host=host).run()
    record = outcome.record
    assert record is not None and record.artifact is not None and record.output is None
    assert host.said(f"node c output (52 bytes) stored at {record.artifact.uri}")
    # a parent's stored output is read back under the parent's key; one the store lacks fails the node
    a_key = node_key("d", "r1", validate_plan(PLAN, registry()).node("a"))
    artifact = ArtifactRef(uri=f"mem://{a_key}", size=1, sha256=SHA)
    parent = NodeRecord(node_id="a", status=NodeStatus.SUCCESS, artifact=artifact)
    reader = Host(stored={artifact.uri: {"v": "from the store"}})
    child = step(registry(), {"a": parent, "b": ok("b")}, reader).run()
    assert child.record is not None and child.record.output == {"a": "from the store", "b": {"v": 1}}
    lost = step(registry(), {"a": parent, "b": ok("b")}, Host()).run()
    assert lost.record is not None and lost.record.status == "failed"
    assert (lost.record.error or "").startswith("output of parent node a: artifact mem://")


def test_a_checkpoint_that_cannot_be_saved_does_not_fail_the_node() -> None:
    host = Host(checkpoint_fails=True)
    outcome = step(registry(), host=host).run()
    assert outcome.record is not None and outcome.record.status == "success"
    assert (logging.WARNING, "node c: could not save its checkpoint (store is read-only)") in host.lines


def poll_done(handle: Any) -> JobStatus:
    return JobStatus.done({"rows": handle["n"]})


def test_an_asynchronous_tool_s_job_is_waited_for_then_classified() -> None:
    tools = registry(lambda params, ctx: {"n": 3}, poll=poll_done, timeout=60)
    this = step(tools)
    started = this.run()
    assert started.kind == "poll" and started.job is not None
    job = JobWait.from_saved(started.job.saved())  # as a host keeps it across a pause
    assert (job.handle, job.timeout, job.polling["key"]) == ({"n": 3}, 60, this.key)
    assert [e.type for e in job.events] == ["node.started", "node.polling"]
    resumed = step(tools)  # a later try object of the same node (say, after a deferral)
    done = resumed.job_ended(job, JobOutcome("done", result={"rows": 3}))
    assert done.record is not None and done.record.output == {"rows": 3}
    assert done.record.polling is not None and done.record.polling["outcome"] == "done"
    assert [e.type for e in done.record.events] == ["node.started", "node.polling", "node.succeeded"]
    timeout = step(tools).job_ended(job, JobOutcome("timeout", reason="too slow"))
    assert timeout.record is not None and timeout.record.error == "job timeout: too slow"
    malformed = step(tools).job_ended(job, JobOutcome("failed", reason="no event"), malformed=True)
    assert malformed.record is not None and malformed.record.error == "no event"
    assert malformed.record.polling is not None and malformed.record.polling["outcome"] == "malformed"


def raises(handle: Any) -> Any:
    raise ConnectionError("down")


@pytest.mark.parametrize(
    ("poll", "seconds_left", "expected"),
    [
        (poll_done, None, JobOutcome("done", result={"rows": 1})),
        (lambda h: JobStatus.failed(""), None, JobOutcome("failed", reason="the job failed")),
        (raises, None, JobOutcome("failed", reason="polling raised ConnectionError: down")),
        (
            lambda h: {"state": "done"},
            None,
            JobOutcome("failed", reason="poll returned dict, expected JobStatus"),
        ),
        (
            lambda h: JobStatus.pending(),
            -1.0,
            JobOutcome("timeout", reason="the job did not finish before its timeout"),
        ),
        (lambda h: JobStatus.pending(), None, None),
        (lambda h: JobStatus.pending(), 3600.0, None),
    ],
)
def test_one_poll_of_a_job(poll: Any, seconds_left: float | None, expected: JobOutcome | None) -> None:
    """``seconds_left`` until the job's deadline (None: no deadline), counted from the poll, not from the
    test's collection (a suite may take longer than any fixed margin)."""
    deadline = None if seconds_left is None else time.time() + seconds_left
    assert poll_once(poll, {"n": 1}, deadline) == expected


def test_the_key_s_scope_is_the_dag_and_its_task_group() -> None:
    plan = validate_plan(PLAN, registry())
    assert key_scope("d") == "d" and key_scope("d", "g") == "d:g"
    keys = {node_key(key_scope("d", g), "r1", plan.node("c")) for g in ("", "g", "h")}
    assert len(keys) == 3


@pytest.mark.parametrize(
    "parents",
    [
        {"a": "success", "b": "success"},
        {"a": "success", "b": "failed"},
        {"a": "failed", "b": "success"},
        {"a": "success", "b": "replan"},
    ],
    ids=["both succeeded", "optional parent failed", "hard parent failed", "parent requested a replan"],
)
@pytest.mark.parametrize("budget", [3, 2], ids=["within the step budget", "past the step budget"])
def test_a_node_given_only_itself_and_its_parents_ends_as_with_the_whole_plan(
    parents: dict[str, str], budget: int
) -> None:
    """A node task gets the node and its parents (its brief), the local runner the whole plan: the same
    decision, params, key, call and record either way."""

    def record(node_id: str, how: str) -> NodeRecord:
        if how == "failed":
            return NodeRecord(node_id=node_id, status=NodeStatus.FAILED, error="boom")
        done = ok(node_id, {"v": node_id})
        done.replan_requested = how == "replan"
        return done

    ends = []
    for around in (False, True):
        host = Host()
        records: dict[str, NodeRecord | None] = {p: record(p, how) for p, how in parents.items()}
        outcome = step(registry(), records, host, around=around, budgets=Budgets(max_steps=budget)).run()
        assert outcome.record is not None
        ends.append(
            (
                outcome.kind,
                outcome.record.model_dump(exclude={"started_at", "ended_at", "duration_s", "events"}),
                [(c.idempotency_key, c.missing_inputs) for c in host.calls],
            )
        )
    assert ends[0] == ends[1]
    runs = parents["a"] == "success" and parents["b"] != "replan" and budget == 3
    kind, _, calls = ends[0]
    assert (kind, len(calls)) == (("succeeded", 1) if runs else ("skipped", 0))
    if runs and parents["b"] == "failed":
        assert calls[0][1] == ("b",)
