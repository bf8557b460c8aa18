"""Plans run as Airflow tasks (dag.test on SQLite): nodes, failure containment, soft deps, retries, caps."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from airflow_plan_provider import ArtifactStore, Limits, NodeExecution
from airflow_plan_provider.contract import FINALIZE_TASK, NODE_KEY, NODES_TASK, PLAN_TASK
from airflow_plan_provider.testing import CallLog, ScriptedPlanner, scripted_registry
from airflow_plan_provider.testing.in_process import run_plan_dag
from harness.seed import seed_plan, seed_tools
from tests.airflow.support import task_states, xcom

pytestmark = pytest.mark.airflow


def build(dag_id: str, log: CallLog, *, plan_=None, overrides=None, **options):
    from airflow_plan_provider.dag_factory import build_plan_dag

    tools = scripted_registry(*seed_tools(log, **(overrides or {})))
    options.setdefault("execution", NodeExecution(retry_delay=timedelta(0)))
    options.setdefault("replan", False)
    return build_plan_dag(dag_id, planner=ScriptedPlanner(plan_), tools=tools, **options)


@pytest.mark.parametrize("cap", [5, None], ids=["capped", "no cap of its own"])
def test_seed_plan_completes(tmp_path, cap):
    log = CallLog(tmp_path)
    dag = build("seed_ok", log, plan_=seed_plan(), execution=NodeExecution(max_active_nodes=cap))
    assert dag.get_task(NODES_TASK).max_active_tis_per_dagrun == cap
    run = run_plan_dag(dag)
    states = task_states(run)
    assert str(run.state) == "success"
    assert [states[f"{NODES_TASK}[{i}]"] for i in range(4)] == ["success"] * 4
    assert states[f"{NODES_TASK}[4]"] == states[f"{NODES_TASK}[5]"] == "success"
    result = xcom(run, FINALIZE_TASK)
    assert (result["status"], result["reason"]) == ("completed", "goal_met")
    assert result["outputs"]["6"] == {"report": {"inputs": ["latency", "logs"]}}
    assert {n: log.count(node=n) for n in "123456"} == dict.fromkeys("123456", 1)


def test_permanent_failure_skips_dependents_only(tmp_path):
    log = CallLog(tmp_path)
    dag = build(
        "seed_fail", log, plan_=seed_plan(), overrides={"query_deploys": {"permanent": "deploy API says 403"}}
    )
    run = run_plan_dag(dag)
    states = task_states(run)
    assert str(run.state) == "failed"
    assert [states[f"{NODES_TASK}[{i}]"] for i in range(4)] == ["success", "success", "failed", "success"]
    assert states[f"{NODES_TASK}[4]"] == "skipped" and states[f"{NODES_TASK}[5]"] == "skipped"
    assert log.count("query_deploys") == 1  # a permanent error is not retried
    result = xcom(run, FINALIZE_TASK)
    assert (result["status"], result["reason"]) == ("failed", "node_failed")
    by_node = {r["node_id"]: r for r in result["history"]}
    assert by_node["3"]["status"] == "failed" and "403" in by_node["3"]["error"]
    assert by_node["5"]["status"] == "skipped" and by_node["6"]["status"] == "skipped"


def test_optional_parent_failure_names_missing_input(tmp_path):
    log = CallLog(tmp_path)
    dag = build(
        "seed_soft",
        log,
        plan_=seed_plan(optional_4_to_5=True),
        overrides={"query_error_logs": {"permanent": "log service down"}},
    )
    run = run_plan_dag(dag)
    states = task_states(run)
    assert states[f"{NODES_TASK}[3]"] == "failed"
    assert states[f"{NODES_TASK}[4]"] == "success" and states[f"{NODES_TASK}[5]"] == "success"
    record5 = xcom(run, NODES_TASK, key=NODE_KEY, map_index=4)
    assert record5["missing_inputs"] == ["4"]
    assert record5["output"] == {"inputs": ["latency"]}  # the missing input reached the tool as None
    # the failure was contained: everything downstream ran, so the session completed without a replan
    result = xcom(run, FINALIZE_TASK)
    assert str(run.state) == "success"
    assert (result["status"], result["reason"]) == ("completed", "goal_met")
    assert "4" in result["message"]


def test_transient_failure_is_retried_by_airflow(tmp_path):
    log = CallLog(tmp_path)
    dag = build("seed_retry", log, plan_=seed_plan(), overrides={"query_metrics": {"transient_failures": 1}})
    run = run_plan_dag(dag)
    assert str(run.state) == "success"
    assert log.count("query_metrics") == 2
    assert xcom(run, NODES_TASK, key=NODE_KEY, map_index=0)["attempts"] == 2


def test_invalid_plan_fails_planning_and_runs_nothing(tmp_path):
    log = CallLog(tmp_path)
    bad = seed_plan()
    bad["edges"].append({"from": "6", "to": "1"})
    dag = build("seed_cycle", log, plan_=bad)
    run = run_plan_dag(dag)
    states = task_states(run)
    assert str(run.state) == "failed"
    assert states[PLAN_TASK] == "failed"
    assert log.count() == 0
    result = xcom(run, FINALIZE_TASK)
    assert result["reason"] == "invalid_plan" and "cycle" in result["message"]


def test_the_node_tasks_retry_backoff_is_the_multiplier_where_airflow_takes_one(tmp_path):
    from airflow_plan_provider import airflow_features

    for multiplier, switch in ((3.0, True), (0, False)):
        execution = NodeExecution(retries=3, retry_exponential_backoff=multiplier)
        node_task = build(f"backoff_{switch}", CallLog(tmp_path), execution=execution).get_task(NODES_TASK)
        backoff = node_task.partial_kwargs["retry_exponential_backoff"]
        if airflow_features.retry_backoff_multiplier():
            assert backoff == multiplier and not isinstance(backoff, bool)
        else:  # Airflow 3.1: a switch; on, each retry waits twice as long as the one before
            assert backoff is switch


def test_a_rate_limited_node_waits_as_long_as_its_tool_asks_where_airflow_has_retry_policies(tmp_path):
    from airflow_plan_provider import airflow_features

    execution = NodeExecution(retries=3, retry_delay=timedelta(seconds=7))
    node_task = build("retry_policy", CallLog(tmp_path), execution=execution).get_task(NODES_TASK)
    assert node_task.partial_kwargs["retry_delay"] == timedelta(seconds=7)
    if not airflow_features.retry_policies():
        # Airflow before 3.3: no policy; a rate-limited node waits the task's retry_delay like any retry
        assert node_task.partial_kwargs.get("retry_policy") is None
        return
    from airflow.sdk import RetryAction

    from airflow_plan_provider.exceptions import TransientToolError
    from airflow_plan_provider.operators.retry import ToolRetryPolicy

    policy = node_task.partial_kwargs["retry_policy"]
    assert isinstance(policy, ToolRetryPolicy)
    limited = policy.evaluate(TransientToolError("429 Too Many Requests", retry_after=42), 1, 3)
    assert limited.action is RetryAction.RETRY and limited.retry_delay == timedelta(seconds=42)
    assert policy.evaluate(TransientToolError("timeout"), 1, 3).action is RetryAction.DEFAULT


@pytest.mark.parametrize("checkpoints", [False, True], ids=["without checkpoints", "with checkpoints"])
def test_a_node_reads_only_its_parents_records(tmp_path, monkeypatch, checkpoints):
    """Without checkpoints, node 5's four parents are the node task's first four instances: one
    request, a slice of four records; node 6's one parent is instance 4: one request for its record
    alone, not a slice of the five records before it (in a wide plan such slices made what a node reads
    grow with the plan). With checkpoints, a node whose parents all saved theirs in this run starts on
    those and reads no record from XCom. Finalize reads all six in one slice either way."""
    from airflow.sdk.execution_time.supervisor import InProcessSupervisorComms

    send = InProcessSupervisorComms.send
    reads: list[tuple[str, Any]] = []

    def recording(self: Any, msg: Any) -> Any:
        if getattr(msg, "key", None) == NODE_KEY and type(msg).__name__.startswith("GetXCom"):
            reads.append((type(msg).__name__, getattr(msg, "stop", getattr(msg, "map_index", None))))
        return send(self, msg)

    monkeypatch.setattr(InProcessSupervisorComms, "send", recording)
    artifacts = ArtifactStore(url=(tmp_path / "store").as_uri(), checkpoints=checkpoints)
    run = run_plan_dag(build("seed_reads", CallLog(tmp_path), plan_=seed_plan(), artifacts=artifacts))
    assert str(run.state) == "success"
    by_nodes = [] if checkpoints else [("GetXCom", 4), ("GetXComSequenceSlice", 4)]
    assert sorted(reads) == sorted([*by_nodes, ("GetXComSequenceSlice", 6)])


def test_max_nodes_beyond_what_airflow_maps_in_one_task_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"max_nodes=5000 is more than .*\[core\] max_map_length=1024"):
        build("too_many_to_map", CallLog(tmp_path), plan_=seed_plan(), limits=Limits(max_nodes=5000))
    assert build("as_many_as_mapped", CallLog(tmp_path), plan_=seed_plan(), limits=Limits(max_nodes=1024))


def test_a_free_deferral_run_by_dag_test_makes_way_for_a_parent_in_another_lane(tmp_path):
    """``dag.test()`` runs a deferred task's trigger inline, to its first event, before any other task
    runs. A node whose deferral is free (``pools_count_deferred=False``) and whose parent, in a pooled
    lane, has not run yet makes way there instead of waiting for ever: its trigger is not on a
    triggerer, so it does not wait through a parent that needs a slot."""
    from airflow_plan_provider.dag_factory import build_plan_dag
    from airflow_plan_provider.testing import ScriptedTool, scripted_registry

    log = CallLog(tmp_path)
    registry = scripted_registry(
        ScriptedTool("fetch", log=log, returns={"rows": 3}, pool="default_pool"),
        ScriptedTool("report", log=log, returns={"report": "done"}),
    )
    plan_ = {
        "goal": "fetch, then report",
        "nodes": [
            {"id": "b", "action": "report", "tool": "report", "params": {}},
            {"id": "a", "action": "fetch", "tool": "fetch", "params": {}},
        ],
        "edges": [{"from": "a", "to": "b"}],
    }
    execution = NodeExecution(retry_delay=timedelta(0), pools_count_deferred=False)
    dag = build_plan_dag(
        "free_lane", planner=ScriptedPlanner(plan_), tools=registry, execution=execution, replan=False
    )
    run = run_plan_dag(dag)
    assert str(run.state) == "success"
    assert (log.count("fetch"), log.count("report")) == (1, 1)
    assert xcom(run, FINALIZE_TASK)["outputs"]["b"] == {"report": "done"}
