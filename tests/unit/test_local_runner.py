"""The local runner (local_runner.py): a plan run on threads by the node tasks' rules, no Airflow."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_plan_provider.local_runner import retry_delay, run_plan
from airflow_plan_provider.plan.budgets import Budgets
from airflow_plan_provider.plan.result import Event, SessionResult
from airflow_plan_provider.plan.validate import validate_plan
from airflow_plan_provider.settings import NodeExecution
from airflow_plan_provider.testing.scripted import CallLog, ScriptedPlanner, ScriptedTool, scripted_registry
from harness.seed import seed_plan, seed_replan_story, seed_tools

NO_WAIT = NodeExecution(retry_delay=timedelta(0))


@pytest.fixture
def log(tmp_path: Path) -> CallLog:
    return CallLog(tmp_path / "calls")


def run_seed(log: CallLog, *, optional_4_to_5: bool = False, **overrides: dict[str, Any]) -> SessionResult:
    tools = scripted_registry(*seed_tools(log, **overrides))
    return run_plan(validate_plan(seed_plan(optional_4_to_5), tools), tools, execution=NO_WAIT)


def records(result: SessionResult) -> dict[str, Any]:
    return {record.node_id: record for record in result.history}


def at(result: SessionResult, type_: str, node_id: str) -> str:
    """When ``node_id``'s (last) event of ``type_`` happened."""
    found = [e for e in result.events if e.type == type_ and e.node_id == node_id]
    assert found, f"no {type_} event of node {node_id}"
    return found[-1].at


def node_events(result: SessionResult, node_id: str) -> list[Event]:
    return [e for e in result.events if e.node_id == node_id]


def test_seed_plan_completes_with_every_output(log: CallLog) -> None:
    result = run_seed(log)
    assert (result.status, result.reason) == ("completed", "goal_met")
    assert result.outputs["5"] == {"inputs": ["latency", "logs"]}
    assert result.outputs["6"] == {"report": {"inputs": ["latency", "logs"]}}
    assert result.usage.steps == 6 and log.count() == 6
    assert [e.type for e in node_events(result, "1")] == ["node.started", "node.succeeded"]
    assert result.events[-1].type == "session.finished"


def test_independent_nodes_overlap_and_a_child_starts_when_its_own_parents_finish(log: CallLog) -> None:
    """a and b sleep side by side; c (after a only) starts while b still runs: b waits until c has run,
    and would give up waiting (False) if c waited for b's layer to end."""
    c_ran = threading.Event()
    registry = scripted_registry(ScriptedTool("short", log=log, sleep=0.3, returns=1))

    @registry.tool
    def wait_for_c() -> bool:
        time.sleep(0.3)
        return c_ran.wait(timeout=30)

    @registry.tool
    def signal() -> bool:
        c_ran.set()
        return True

    plan = {
        "nodes": [
            {"id": "a", "action": "short", "tool": "short"},
            {"id": "b", "action": "long", "tool": "wait_for_c"},
            {"id": "c", "action": "after a", "tool": "signal"},
            {"id": "d", "action": "after b and c", "tool": "short"},
        ],
        "edges": [{"from": "a", "to": "c"}, {"from": "b", "to": "d"}, {"from": "c", "to": "d"}],
    }
    result = run_plan(validate_plan(plan, registry), registry, execution=NodeExecution(max_active_nodes=3))
    assert result.status == "completed" and result.outputs["b"] is True
    assert at(result, "node.started", "b") < at(result, "node.succeeded", "a")  # a and b overlap
    assert at(result, "node.started", "a") < at(result, "node.succeeded", "b")
    assert at(result, "node.started", "c") >= at(result, "node.succeeded", "a")
    assert at(result, "node.started", "c") <= at(result, "node.succeeded", "b")
    assert at(result, "node.started", "d") >= max(at(result, "node.succeeded", n) for n in "bc")


def test_one_worker_runs_one_node_at_a_time(log: CallLog) -> None:
    result = run_plan(
        validate_plan(seed_plan(), tools := scripted_registry(*seed_tools(log))),
        tools,
        execution=NodeExecution(max_active_nodes=1),
    )
    assert result.status == "completed" and log.max_concurrency() == 1


def test_no_cap_runs_every_ready_node_at_once(log: CallLog) -> None:
    """Seven independent nodes that each wait until all seven have started: more than the default cap
    of five, so only ``max_active_nodes=None`` lets them all return True."""
    started = threading.Barrier(7)
    registry = scripted_registry()

    @registry.tool
    def meet() -> bool:
        try:
            started.wait(timeout=2)
        except threading.BrokenBarrierError:
            return False
        return True

    plan = {"nodes": [{"id": f"n{i}", "action": "meet the others", "tool": "meet"} for i in range(7)]}
    validated = validate_plan(plan, registry)
    result = run_plan(validated, registry, execution=NodeExecution(max_active_nodes=None))
    assert result.status == "completed" and result.outputs == {f"n{i}": True for i in range(7)}
    started.reset()
    capped = run_plan(validated, registry, execution=NodeExecution(max_active_nodes=5))
    assert set(capped.outputs.values()) == {False}


def test_a_failed_hard_parent_skips_its_descendants(log: CallLog) -> None:
    result = run_seed(log, query_deploys={"permanent": "403 forbidden"})
    by_id = records(result)
    assert by_id["3"].status == "failed" and by_id["3"].error == "query_deploys: 403 forbidden"
    assert (by_id["5"].status, by_id["5"].error) == ("skipped", "parent 3 failed")
    assert (by_id["6"].status, by_id["6"].error) == ("skipped", "parent 5 skipped")
    assert log.count("analyze") == 0 and log.count("report") == 0
    assert (result.status, result.reason) == ("failed", "node_failed")
    skipped = [e for e in node_events(result, "5") if e.type == "node.skipped"]
    assert skipped[0].data["reason"] == "parent 3 failed"


def test_an_optional_parent_that_failed_is_a_missing_input(log: CallLog) -> None:
    result = run_seed(log, optional_4_to_5=True, query_error_logs={"permanent": "log store down"})
    by_id = records(result)
    assert by_id["4"].status == "failed"
    assert by_id["5"].status == "success" and by_id["5"].missing_inputs == ["4"]
    assert result.outputs["5"] == {"inputs": ["latency"]}  # ${4} reached the tool as None
    assert (result.status, result.reason) == ("completed", "goal_met")
    assert "failed optional input(s) 4" in result.message


def test_a_transient_failure_is_retried(log: CallLog) -> None:
    result = run_seed(log, query_metrics={"transient_failures": 2})
    record = records(result)["1"]
    assert (record.status, record.attempts) == ("success", 3)
    assert log.count("query_metrics") == 3
    retrying = [e for e in node_events(result, "1") if e.type == "node.retrying"]
    assert [e.data["attempt"] for e in retrying] == [1, 2]
    assert retrying[0].data["error"] == "query_metrics: transient failure 1"
    keys = {call["key"] for call in log.calls("query_metrics")}
    assert len(keys) == 1  # every try carries the same idempotency key
    assert result.status == "completed"


def test_retries_run_out(log: CallLog) -> None:
    tools = scripted_registry(*seed_tools(log, query_metrics={"transient_failures": 5}))
    result = run_plan(
        validate_plan(seed_plan(), tools), tools, execution=NodeExecution(retries=1, retry_delay=timedelta(0))
    )
    record = records(result)["1"]
    assert (record.status, record.attempts) == ("failed", 2)
    assert record.error == "query_metrics: transient failure 2"
    assert log.count("query_metrics") == 2 and result.status == "failed"


def test_a_permanent_failure_is_not_retried(log: CallLog) -> None:
    result = run_seed(log, query_metrics={"permanent": "unknown service"})
    record = records(result)["1"]
    assert (record.status, record.attempts) == ("failed", 1)
    assert log.count("query_metrics") == 1
    assert result.message.startswith("node 1 failed: query_metrics: unknown service")


def test_the_step_budget_stops_execution(log: CallLog) -> None:
    tools = scripted_registry(*seed_tools(log))
    plan = validate_plan(seed_plan(), tools)
    result = run_plan(plan, tools, budgets=Budgets(max_steps=3), execution=NO_WAIT)
    by_id = records(result)
    assert [n for n in "1234" if by_id[n].status == "success"] == ["1", "2", "3"]
    assert by_id["4"].budget_exhausted and by_id["4"].status == "skipped"
    assert "would be step 4 of 3" in (by_id["4"].error or "")
    assert log.count("query_error_logs") == 0 and log.count() == 3
    assert (result.status, result.reason) == ("failed", "step_budget")
    exhausted = [e for e in result.events if e.type == "budget.exhausted"]
    assert exhausted[0].data["limit"] == 3


def test_a_replan_request_skips_the_moot_part_and_concludes(log: CallLog) -> None:
    result = run_seed(log, query_deploys={"replan": "no deploys yesterday"})
    by_id = records(result)
    assert by_id["3"].status == "success" and by_id["3"].replan_requested
    assert result.outputs["3"] == []  # the output the request carried is kept
    assert (by_id["5"].status, by_id["5"].error) == ("skipped", "parent 3 requested a replan")
    assert by_id["6"].status == "skipped"
    # a ready plan has no planner to answer the request
    assert (result.status, result.reason) == ("failed", "replan_unavailable")
    assert result.message.startswith("node 3 requested a replan: query_deploys: no deploys yesterday")


def test_params_that_break_the_schema_after_resolving_fail_the_node(log: CallLog) -> None:
    plan = {
        "nodes": [
            {"id": "1", "action": "count", "tool": "count"},
            {"id": "2", "action": "echo", "tool": "echo", "params": {"text": "${1}"}},
        ]
    }
    schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    tools = scripted_registry(
        ScriptedTool("count", log=log, returns=3), ScriptedTool("echo", log=log, args_schema=schema)
    )
    result = run_plan(validate_plan(plan, tools), tools)
    record = records(result)["2"]
    assert record.status == "failed" and log.count("echo") == 0
    assert (
        record.error
        == "params for tool 'echo' are invalid after resolving references: text: 3 is not of type 'string'"
    )


def test_an_asynchronous_tool_is_polled_to_its_result(log: CallLog) -> None:
    plan = {
        "nodes": [
            {"id": "1", "action": "export", "tool": "export"},
            {"id": "2", "action": "x", "tool": "fail"},
        ]
    }
    tools = scripted_registry(
        ScriptedTool("export", log=log, returns={"rows": 7}, job_seconds=0.3, poll_interval=0.05),
        ScriptedTool("fail", log=log, job_seconds=0.1, job_fails="quota exceeded", poll_interval=0.05),
    )
    result = run_plan(validate_plan(plan, tools), tools)
    by_id = records(result)
    assert result.outputs["1"] == {"rows": 7}
    assert by_id["1"].polling is not None and by_id["1"].polling["outcome"] == "done"
    assert [e.type for e in node_events(result, "1")] == ["node.started", "node.polling", "node.succeeded"]
    assert (by_id["2"].status, by_id["2"].error) == ("failed", "job failed: quota exceeded")


def test_with_a_planner_a_replan_request_starts_a_revision_that_reuses_the_locked_nodes(log: CallLog) -> None:
    planner, scripted = seed_replan_story(log)
    tools = scripted_registry(*scripted)
    result = run_plan(validate_plan(seed_plan(), tools), tools, planner=planner, execution=NO_WAIT)
    assert (result.status, result.reason) == ("completed", "goal_met")
    assert len(result.run_ids) == 2 and result.usage.replans == 1
    assert result.revisions[0].diff.revised == ["5"] and result.revisions[0].trigger_node == "3"
    request = planner.requests[-1]
    assert request.failed_node == "3" and request.affected == ("5", "6")
    assert request.last_error == "node 3 requested a replan: query_deploys: no deploys yesterday"
    last = {r.node_id: r for r in result.history if r.revision == 1}
    assert all(last[n].reused and last[n].attempts == 0 for n in "1234")
    assert [log.count(node=n) for n in "123456"] == [1, 1, 1, 1, 1, 1]  # nothing ran twice
    assert result.outputs["5"] == {"inputs": ["health", "latency"]}
    assert result.usage.steps == 6  # 1-4 in revision 0, then 5 and 6
    types = [e.type for e in result.events]
    assert types.count("replan.requested") == 1 and types.count("plan.diff") == 1
    assert [e.type for e in node_events(result, "1")][-1] == "node.reused"


def test_a_replan_is_refused_when_the_replan_budget_is_spent(log: CallLog) -> None:
    planner, scripted = seed_replan_story(log)
    tools = scripted_registry(*scripted)
    plan = validate_plan(seed_plan(), tools)
    result = run_plan(plan, tools, planner=planner, budgets=Budgets(max_replans=0), execution=NO_WAIT)
    assert (result.status, result.reason) == ("failed", "replan_budget")
    assert planner.requests == [] and len(result.run_ids) == 1


def test_a_planner_with_no_replacement_fails_the_session(log: CallLog) -> None:
    _, scripted = seed_replan_story(log)
    tools = scripted_registry(*scripted)
    result = run_plan(
        validate_plan(seed_plan(), tools), tools, planner=ScriptedPlanner(seed_plan()), execution=NO_WAIT
    )
    assert (result.status, result.reason) == ("failed", "replan_failed")
    assert "the planner returned no plan" in result.message


def test_retry_delays_grow_as_airflow_s_do() -> None:
    execution = NodeExecution(retry_delay=timedelta(seconds=5), max_retry_delay=timedelta(seconds=30))
    assert [retry_delay(execution, attempt) for attempt in (1, 2, 3, 4)] == [5, 10, 20, 30]
    constant = NodeExecution(retry_delay=timedelta(seconds=5), retry_exponential_backoff=0)
    assert [retry_delay(constant, attempt) for attempt in (1, 2, 3)] == [5, 5, 5]
