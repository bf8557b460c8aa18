"""Approval: which nodes must be approved (pure core), the request's text, the session's record of
answers, and the approve task in the DAG (its place, its trigger rules, a run that needs no approval).

A request granted, and one rejected, through Airflow's REST API while ``dag.test()`` runs the plan in
this process (on Airflow 3.3 the approve task parks in ``awaiting_input`` and the answer resumes it;
before, it defers to the standard provider's HITL trigger, which reads the answer). The same on a real
scheduler, with timeouts and replans: tests/e2e/test_approval.py.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_plan_provider import ApprovalPolicy, Budgets, NodeExecution
from airflow_plan_provider.contract import (
    APPROVAL_KEY,
    APPROVE_TASK,
    FINALIZE_TASK,
    NODES_TASK,
    PLAN_TASK,
    lane_task_id,
    select_task_id,
)
from airflow_plan_provider.plan.approval import (
    Approval,
    approved_calls,
    call_digest,
    hide_secrets,
    nodes_to_approve,
    request_text,
)
from airflow_plan_provider.plan.conclusion import conclude
from airflow_plan_provider.plan.decisions import NodeStatus
from airflow_plan_provider.plan.merge import merge_replan
from airflow_plan_provider.plan.result import NodeRecord
from airflow_plan_provider.plan.session import SessionState, record_approval
from airflow_plan_provider.plan.validate import validate_plan
from airflow_plan_provider.testing import CallLog, ScriptedPlanner, ScriptedTool, scripted_registry
from airflow_plan_provider.tools.registry import ToolRegistry

RISKY = {"purge", "notify"}


def plan_of(*nodes: tuple[str, str, dict[str, Any]], edges: list[dict[str, Any]] | None = None) -> Any:
    return validate_plan(
        {
            "goal": "tidy up",
            "nodes": [{"id": i, "action": f"step {i}", "tool": t, "params": p} for i, t, p in nodes],
            "edges": edges or [],
        }
    )


PLAN = plan_of(("1", "read", {}), ("2", "purge", {"table": "t", "rows": "${1}"}), ("3", "read", {}))


def granted(plan: Any, nodes: list[str], revision: int = 0) -> Approval:
    return Approval(status="granted", nodes=nodes, calls=approved_calls(plan, nodes), revision=revision)


# --- which nodes are asked about ----------------------------------------------------------------------


def test_modes_ask_for_risky_nodes_every_node_or_none() -> None:
    assert nodes_to_approve(PLAN, risky_tools=RISKY, mode="risky") == ["2"]
    assert nodes_to_approve(PLAN, risky_tools=RISKY, mode="always") == ["1", "2", "3"]
    assert nodes_to_approve(PLAN, risky_tools=RISKY, mode="never") == []
    assert nodes_to_approve(plan_of(("1", "read", {})), risky_tools=RISKY, mode="risky") == []
    with pytest.raises(ValueError, match="approval mode"):
        nodes_to_approve(PLAN, risky_tools=RISKY, mode="sometimes")  # type: ignore[arg-type]


def test_an_approved_call_is_not_asked_again_a_rejected_one_is() -> None:
    assert nodes_to_approve(PLAN, risky_tools=RISKY, mode="risky", approvals=[granted(PLAN, ["2"])]) == []
    rejected = Approval(status="rejected", nodes=["2"], calls=approved_calls(PLAN, ["2"]))
    assert nodes_to_approve(PLAN, risky_tools=RISKY, mode="risky", approvals=[rejected]) == ["2"]
    # in "always" mode, the approval of node 2 covers node 2 only
    assert nodes_to_approve(PLAN, risky_tools=RISKY, mode="always", approvals=[granted(PLAN, ["2"])]) == [
        "1",
        "3",
    ]


def test_locked_nodes_are_reused_not_run_so_never_asked_about() -> None:
    assert nodes_to_approve(PLAN, risky_tools=RISKY, mode="risky", locked={"2"}) == []
    assert nodes_to_approve(PLAN, risky_tools=RISKY, mode="always", locked={"1", "2"}) == ["3"]


def test_a_replan_that_revises_or_adds_a_risky_node_asks_again_for_those_only() -> None:
    before = [granted(PLAN, ["2"])]
    # revision 1 keeps node 2 as approved and adds risky node 4: only node 4 is asked about
    merged, _ = merge_replan(
        PLAN.as_plan(),
        {
            "nodes": [
                PLAN.node("2").model_dump(exclude_none=True),
                {"id": "4", "action": "tell", "tool": "notify", "params": {"to": "owners"}},
            ],
            "edges": [{"from": "2", "to": "4"}],
        },
        locked={"1"},
    )
    assert nodes_to_approve(validate_plan(merged), risky_tools=RISKY, mode="risky", approvals=before) == ["4"]
    # the same node 2 with other params is another call: asked again
    revised = plan_of(("1", "read", {}), ("2", "purge", {"table": "everything", "rows": "${1}"}))
    assert nodes_to_approve(revised, risky_tools=RISKY, mode="risky", approvals=before) == ["2"]
    # the same call under another id is another node: asked again
    renamed = plan_of(("1", "read", {}), ("2b", "purge", {"table": "t", "rows": "${1}"}))
    assert nodes_to_approve(renamed, risky_tools=RISKY, mode="risky", approvals=before) == ["2b"]
    # a replan that only reuses what was approved (and the locked node) asks nothing
    assert nodes_to_approve(PLAN, risky_tools=RISKY, mode="risky", approvals=before, locked={"1"}) == []


def test_call_digest_is_the_tool_and_declared_params_in_any_key_order() -> None:
    a = plan_of(("n", "purge", {"a": 1, "b": [1, {"c": 2}]})).node("n")
    b = plan_of(("n", "purge", {"b": [1, {"c": 2}], "a": 1})).node("n")
    c = plan_of(("n", "notify", {"a": 1, "b": [1, {"c": 2}]})).node("n")
    assert call_digest(a) == call_digest(b) != call_digest(c)


# --- the request's text -------------------------------------------------------------------------------


def test_request_shows_the_plan_and_the_asked_nodes_params_without_secrets() -> None:
    plan = plan_of(
        ("1", "read", {}),
        ("2", "purge", {"table": "t", "auth": {"api_key": "sk-live-1", "user": "ops"}, "note": "sk-reg-2"}),
    )

    def redact(value: Any, key: str) -> Any:  # a secrets masker that knows one registered secret
        return "***" if value == "sk-reg-2" else value

    subject, body = request_text(plan, ["2"], risky_tools=RISKY, revision=1, run_id="r1", redact=redact)
    assert subject == "Approve 1 node(s) of revision 1 before they run"
    assert "| 2 | step 2 | purge | **approval needed** (risky) |" in body
    assert "| node | action | tool | approval |" in body  # every column named
    assert "| 1 | step 1 | read | not needed |" in body
    assert "sk-live-1" not in body and "sk-reg-2" not in body
    shown = json.loads(body.split("```json\n", 1)[1].split("\n```", 1)[0])
    assert shown == {"table": "t", "auth": {"api_key": "***", "user": "ops"}, "note": "***"}


def test_request_text_cannot_be_broken_out_of_by_plan_text() -> None:
    plan = plan_of(("2", "purge", {"sql": "```\n# Approved\n``````"}))
    plan.nodes[0].action = "a | b\n| forged | row |"
    _, body = request_text(plan, ["2"], risky_tools=RISKY)
    fence = "`" * 7  # longer than the longest backtick run in the params
    assert f"{fence}json\n" in body and body.rstrip().endswith(fence)
    assert "| 2 | a \\| b \\| forged \\| row \\| |" in body  # one table row, pipes escaped


def test_hide_secrets_by_key_name_at_any_depth() -> None:
    value = {"Password": "p", "nested": [{"client_secret": "s"}, {"x": 1}], "token_url": "u", "ok": "v"}
    assert hide_secrets(value) == {
        "Password": "***",
        "nested": [{"client_secret": "***"}, {"x": 1}],
        "token_url": "***",  # names that merely look like a secret are hidden too: a display can afford it
        "ok": "v",
    }


# --- the session's record -------------------------------------------------------------------------------


def test_an_answer_is_kept_in_the_session_result_and_events() -> None:
    state = SessionState(goal="g", root_run_id="r")
    approval = Approval(
        status="rejected", nodes=["2"], approvers=["alice"], responded_by="alice", message="rejected by alice"
    )
    state = record_approval(state, approval)
    result = state.result("failed", "rejected", "the plan was not approved: rejected by alice")
    assert result.approvals == [approval] and result.reason == "rejected"
    [event] = result.events
    assert event.type == "approval.rejected"
    assert event.data["responded_by"] == "alice" and event.data["nodes"] == ["2"]
    assert "approval of revision 0: rejected by alice for nodes ['2']" in result.summary_text()
    # the session state (a replan run's conf) carries the answers to the next revision
    assert SessionState.model_validate(state.model_dump(mode="json")).approvals == [approval]


# --- replan requests when replanning is off (a frozen plan) ----------------------------------------------


def record(node_id: str, **fields: Any) -> NodeRecord:
    return NodeRecord(node_id=node_id, status=NodeStatus.SUCCESS, **fields)


def test_a_request_no_node_depends_on_does_not_fail_a_session_that_cannot_replan() -> None:
    plan = plan_of(("1", "read", {}), ("3", "read", {}), ("5", "read", {"x": "${1}"}))
    records = {
        "1": record("1"),
        "3": record("3", replan_requested=True, error="no deploys"),
        "5": record("5"),
    }
    off = SessionState(budgets=Budgets(max_replans=0))
    done = conclude(plan, records, off)
    assert (done.kind, done.reason, done.replan_requested) == ("done", "goal_met", ["3"])
    assert "node 3 requested a replan: no deploys" in done.message
    # with replans left, the request is answered by a replan as before
    assert conclude(plan, records, SessionState()).kind == "replan"
    # a request that made a dependant moot still ends the session when it cannot replan
    moot = {"1": record("1", replan_requested=True, error="moot"), "3": record("3")}
    moot["5"] = NodeRecord(node_id="5", status=NodeStatus.SKIPPED)
    assert conclude(plan, moot, off).kind == "give_up"
    # the plan built into a DAG (frozen) is never replanned, whatever the budget says
    frozen = SessionState(plan_source="dag")
    assert conclude(plan, records, frozen).kind == "done"
    gave_up = conclude(plan, moot, frozen)
    assert (gave_up.kind, gave_up.reason) == ("give_up", "replan_unavailable")
    assert "built into this DAG" in gave_up.message


# --- the approve task in the DAG -------------------------------------------------------------------------


def registry(log: CallLog, risky: bool = True) -> ToolRegistry:
    return scripted_registry(
        ScriptedTool("read", log=log, returns=1),
        ScriptedTool("purge", log=log, returns=2, needs_approval=risky),
    )


def build(dag_id: str, tools: Any, **options: Any) -> Any:
    from airflow_plan_provider.dag_factory import build_plan_dag

    options.setdefault("execution", NodeExecution(retries=0, retry_delay=timedelta(0)))
    plan = {"goal": "g", "nodes": [{"id": "1", "action": "read", "tool": "read", "params": {}}]}
    return build_plan_dag(dag_id, planner=ScriptedPlanner(plan), tools=tools, **options)


@pytest.mark.airflow
def test_the_approve_task_sits_between_plan_and_the_first_nodes_only_when_it_can_be_needed(tmp_path) -> None:
    log = CallLog(tmp_path)
    dag = build(
        "apv_layers",
        registry(log),
        approval=ApprovalPolicy(approvers=["alice"], timeout=timedelta(minutes=3)),
    )
    approve = dag.get_task(APPROVE_TASK)
    assert approve.upstream_task_ids == {PLAN_TASK}
    assert approve.downstream_task_ids == {NODES_TASK}
    assert approve.assigned_users == [{"id": "alice", "name": "alice"}]
    assert approve.response_timeout == timedelta(minutes=3) and approve.defaults is None  # two equal buttons
    # a skipped approval (none needed) lets the nodes run; a failed plan or approval does not
    assert dag.get_task(NODES_TASK).upstream_task_ids == {PLAN_TASK, APPROVE_TASK}
    assert dag.get_task(NODES_TASK).trigger_rule == "none_failed_min_one_success"

    # with a pooled tool, every lane's node task waits for the answer, and so does the lane's select
    pooled = build(
        "apv_pooled",
        scripted_registry(
            ScriptedTool("read", log=log, returns=1, pool="ticket_api"),
            ScriptedTool("purge", log=log, returns=2, needs_approval=True),
        ),
    )
    assert pooled.get_task(APPROVE_TASK).downstream_task_ids == {
        NODES_TASK,
        lane_task_id("ticket_api"),
        select_task_id(lane_task_id("ticket_api")),
    }
    assert pooled.get_task(lane_task_id("ticket_api")).trigger_rule == "none_failed_min_one_success"
    assert (
        pooled.get_task(select_task_id(lane_task_id("ticket_api"))).trigger_rule
        == "none_failed_min_one_success"
    )
    assert pooled.get_task(select_task_id(lane_task_id("ticket_api"))).approval_task_id == APPROVE_TASK

    assert APPROVE_TASK not in build("apv_safe", registry(log, risky=False)).task_ids
    assert (
        APPROVE_TASK not in build("apv_never", registry(log), approval=ApprovalPolicy(mode="never")).task_ids
    )
    always = build("apv_always", registry(log, risky=False), approval=ApprovalPolicy(mode="always"))
    assert APPROVE_TASK in always.task_ids
    # tools named by a spec string are loaded when the DAG is built: the demo's tools are not risky
    assert APPROVE_TASK not in build("apv_spec", "plan_demo.tools:registry").task_ids
    assert build("apv_none", registry(log, risky=False)).get_task(NODES_TASK).trigger_rule == "all_success"
    with pytest.raises(ValueError, match=r"ApprovalPolicy\.mode must be one of"):
        build("apv_bad", registry(log), approval=ApprovalPolicy(mode="maybe"))
    with pytest.raises(ValueError, match=r"ApprovalPolicy\.timeout must be a timedelta > 0"):
        build("apv_bad_timeout", registry(log), approval=ApprovalPolicy(timeout=timedelta(0)))
    with pytest.raises(ValueError, match="approver"):
        build("apv_bad_approver", registry(log), approval=ApprovalPolicy(approvers=[{"name": "no id"}]))


@pytest.mark.airflow
def test_a_plan_without_risky_nodes_does_not_wait_and_its_nodes_run(tmp_path) -> None:
    from airflow_plan_provider.testing.in_process import run_plan_dag
    from tests.airflow.support import task_states, xcom

    log = CallLog(tmp_path)
    run = run_plan_dag(build("apv_not_needed", registry(log)), {"goal": "g"})
    states = task_states(run)
    assert str(run.state) == "success"
    assert states[APPROVE_TASK] == "skipped" and states[f"{NODES_TASK}[0]"] == "success"
    assert xcom(run, APPROVE_TASK, key=APPROVAL_KEY) == {
        "status": "not_needed",
        "revision": 0,
        "approved_earlier": [],
    }
    result = xcom(run, FINALIZE_TASK)
    assert result["status"] == "completed" and result["approvals"] == []
    types = [e["type"] for e in result["events"]]
    assert types[:3] == ["plan.created", "plan.validated", "approval.not_needed"]
    assert types.index("approval.not_needed") < types.index("node.started")
    assert log.count("read") == 1


# --- a request answered through Airflow's REST API, in-process ------------------------------------------

#: a plan whose node 2 runs a risky tool (``purge``), so the approve task asks before any node runs
PURGE_PLAN = {
    "goal": "purge the stale rows",
    "nodes": [
        {"id": "1", "action": "count stale rows", "tool": "read", "params": {}},
        {"id": "2", "action": "purge stale rows", "tool": "purge", "params": {"table": "payments_stale"}},
    ],
    "edges": [{"from": "1", "to": "2"}],
}
#: how long the answering user waits for the request to appear: the approve task asks within seconds
#: on an idle machine, but before it the planning task and then the approve task itself start the DAG's
#: tool sources (an MCP server's process each), which a niced CI run beside the slow tier has taken over
#: a minute to do. Only a failing run waits this long
REQUEST_WAIT = 300.0


@pytest.fixture(scope="module")
def hitl_api() -> Any:
    """Airflow's public REST API (``/api/v2``) with its auth manager, as the API server serves it, on the
    test process's database: a user answers the approval request through it, as from the UI's
    "Required actions" page."""
    from airflow.api_fastapi.app import init_auth_manager
    from airflow.api_fastapi.core_api.routes.public import public_router
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    app = FastAPI()
    app.include_router(public_router)
    try:  # the routes read DAGs through the app's DAG bag, as in the API server (3.3 and later)
        from airflow.api_fastapi.common.dagbag import create_dag_bag

        app.state.dag_bag = create_dag_bag()
    except ImportError:
        pass
    manager = init_auth_manager(app)
    with TestClient(app) as client:
        yield client, manager


class Answer(threading.Thread):
    """A user who answers a run's approval request through the REST API once it waits for an answer.

    ``dag.test()`` holds the test's thread while the approve task waits, so the user answers from this
    thread. Where the running Airflow has the ``awaiting_input`` state, the request is answered once the
    task is parked in it (the API resumes the task); elsewhere the operator defers to the standard
    provider's HITL trigger, which reads the answer from the request's record, so the request's
    existence is enough. If nothing is answered in time, the request is rejected all the same (so that
    the run ends) and :attr:`problem` says why the test must fail.
    """

    def __init__(self, api: Any, dag_id: str, run_id: str, option: str, intruder: str | None = None) -> None:
        super().__init__(name=f"answer-{run_id}", daemon=True)
        self.client, self.manager = api
        self.dag_id, self.run_id = dag_id, run_id
        self.path = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{APPROVE_TASK}/-1/hitlDetails"
        self.option, self.intruder = option, intruder
        self.request: dict[str, Any] | None = None  # the request as the API showed it before the answer
        self.intruder_status: int | None = None  # what the API said to a user who may not answer
        self.status: int | None = None
        self.problem: str | None = None

    def headers(self, user: str) -> dict[str, str]:
        from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

        token = self.manager.generate_jwt(SimpleAuthManagerUser(username=user, role="admin"))
        return {"Authorization": f"Bearer {token}"}

    def waits_for_an_answer(self, request: dict[str, Any]) -> bool:
        from airflow_plan_provider import airflow_features

        if airflow_features.awaiting_input():
            return request["task_instance"]["state"] == "awaiting_input"
        return True  # the request is recorded: the HITL trigger reads the answer from it

    def run(self) -> None:
        try:
            self.answer()
        except Exception as error:  # the test fails naming it, and the run ends rather than waits on
            self.problem = f"the answering user failed: {error!r}"
            self.end_the_wait()
            raise

    def end_the_wait(self) -> None:
        """Fail the run's approve task once it waits for its answer, so that ``dag.test()`` stops waiting
        (where the task waits in ``awaiting_input``; a deferred one ends by its own timeout)."""
        from airflow.models.taskinstance import TaskInstance
        from airflow.utils.session import create_session
        from airflow.utils.state import TaskInstanceState

        deadline = time.monotonic() + REQUEST_WAIT
        while time.monotonic() < deadline:
            with create_session() as session:
                ti = (
                    session.query(TaskInstance)
                    .filter_by(dag_id=self.dag_id, run_id=self.run_id, task_id=APPROVE_TASK)
                    .one_or_none()
                )
                if ti is not None and str(getattr(ti.state, "value", ti.state)) == "awaiting_input":
                    ti.state = TaskInstanceState.FAILED
                    return
            time.sleep(0.2)

    def answer(self) -> None:
        deadline = time.monotonic() + REQUEST_WAIT
        while time.monotonic() < deadline:
            shown = self.client.get(self.path, headers=self.headers("alice"))
            if shown.status_code == 200 and self.waits_for_an_answer(shown.json()):
                self.request = shown.json()
                if self.intruder:
                    refused = self.client.patch(
                        self.path, json={"chosen_options": ["Approve"]}, headers=self.headers(self.intruder)
                    )
                    self.intruder_status = refused.status_code
                answered = self.client.patch(
                    self.path, json={"chosen_options": [self.option]}, headers=self.headers("alice")
                )
                self.status = answered.status_code
                if answered.status_code != 200:
                    self.problem = f"the answer was refused: {answered.status_code} {answered.text}"
                return
            time.sleep(0.2)
        self.problem = f"no request waited for an answer within {REQUEST_WAIT} s"
        self.client.patch(self.path, json={"chosen_options": ["Reject"]}, headers=self.headers("alice"))


def run_answered(dag: Any, api: Any, option: str, intruder: str | None = None) -> tuple[Any, Answer]:
    """Run ``dag`` once in-process while a user answers its approval request with ``option``."""
    from airflow_plan_provider.testing.in_process import run_plan_dag

    run_id = f"manual__approval_{option.lower()}_{time.time_ns()}"
    answer = Answer(api, dag.dag_id, run_id, option, intruder=intruder)
    answer.start()
    try:
        run = run_plan_dag(dag, {"goal": PURGE_PLAN["goal"]}, run_id=run_id)
    finally:
        answer.join(REQUEST_WAIT + 30)
    assert answer.problem is None, answer.problem
    return run, answer


def purge_dag(dag_id: str, log: CallLog) -> Any:
    from airflow_plan_provider.dag_factory import build_plan_dag

    tools = scripted_registry(
        ScriptedTool("read", log=log, returns={"rows": 3}),
        ScriptedTool("purge", log=log, returns={"purged": 3}, side_effect=True, needs_approval=True),
    )
    return build_plan_dag(
        dag_id,
        planner=ScriptedPlanner(PURGE_PLAN),
        tools=tools,
        approval=ApprovalPolicy(approvers=["alice"], timeout=timedelta(minutes=10)),
        execution=NodeExecution(retries=0, retry_delay=timedelta(0)),
    )


@pytest.mark.airflow
def test_an_approval_granted_through_the_api_lets_the_nodes_run(tmp_path, hitl_api) -> None:
    from tests.airflow.support import task_states, xcom

    log = CallLog(tmp_path)
    run, answer = run_answered(purge_dag("apv_granted", log), hitl_api, "Approve", intruder="mallory")
    # what the user was shown, and a user who is not an approver may not answer
    assert answer.request is not None and answer.request["options"] == ["Approve", "Reject"]
    assert [user["id"] for user in answer.request["assigned_users"]] == ["alice"]
    assert "purge stale rows" in answer.request["body"] and answer.request["chosen_options"] is None
    assert answer.intruder_status == 403 and answer.status == 200

    states = task_states(run)
    assert str(run.state) == "success", states
    assert states[APPROVE_TASK] == "success"
    assert [states[f"{NODES_TASK}[{i}]"] for i in (0, 1)] == ["success", "success"], states
    assert log.count("read") == 1 and log.count("purge") == 1  # nothing ran twice

    recorded = xcom(run, APPROVE_TASK, key=APPROVAL_KEY)
    assert (recorded["status"], recorded["responded_by"], recorded["nodes"]) == ("granted", "alice", ["2"])
    assert recorded["approvers"] == ["alice"] and not recorded["timed_out"]
    result = xcom(run, FINALIZE_TASK)
    assert (result["status"], result["reason"]) == ("completed", "goal_met")
    [approval] = result["approvals"]
    assert (approval["status"], approval["responded_by"]) == ("granted", "alice")
    assert result["outputs"]["2"] == {"purged": 3}
    types = [e["type"] for e in result["events"]]
    assert types.index("approval.granted") < types.index("node.started")

    # Airflow's own record of the answer
    shown = answer.client.get(answer.path, headers=answer.headers("alice")).json()
    assert shown["chosen_options"] == ["Approve"] and shown["responded_by_user"]["id"] == "alice"


@pytest.mark.airflow
def test_an_approval_rejected_through_the_api_runs_no_node_and_fails_the_session(tmp_path, hitl_api) -> None:
    from tests.airflow.support import task_states, xcom

    log = CallLog(tmp_path)
    run, answer = run_answered(purge_dag("apv_rejected", log), hitl_api, "Reject")
    assert answer.status == 200

    states = task_states(run)
    assert str(run.state) == "failed", states
    assert states[APPROVE_TASK] == "failed"  # it recorded the answer, and its state says it: rejected
    nodes = {task: state for task, state in states.items() if task.startswith(NODES_TASK)}
    assert nodes and set(nodes.values()) == {"upstream_failed"}, states
    assert log.calls() == []  # no tool was called, the risky one least of all

    recorded = xcom(run, APPROVE_TASK, key=APPROVAL_KEY)
    assert (recorded["status"], recorded["responded_by"], recorded["nodes"]) == ("rejected", "alice", ["2"])
    assert recorded["calls"] == {} and not recorded["timed_out"]
    result = xcom(run, FINALIZE_TASK)
    assert (result["status"], result["reason"]) == ("failed", "rejected")
    assert "rejected by alice" in result["message"]
    [approval] = result["approvals"]
    assert (approval["status"], approval["responded_by"]) == ("rejected", "alice")
    assert [e["type"] for e in result["events"] if e["type"].startswith("approval.")] == ["approval.rejected"]
    assert not [e for e in result["events"] if e["type"].startswith("node.")]

    shown = answer.client.get(answer.path, headers=answer.headers("alice")).json()
    assert shown["chosen_options"] == ["Reject"] and shown["responded_by_user"]["id"] == "alice"


@pytest.mark.airflow
def test_a_destructive_mcp_tool_waits_for_approval_and_a_rejection_runs_no_node(
    tmp_path, hitl_api, monkeypatch
):
    """A tool its MCP server annotates as destructive counts as risky: the approve task asks before any
    node runs (the read-only lookup is not asked about), and a rejection runs nothing on the server."""
    import sys

    from airflow_plan_provider.dag_factory import build_plan_dag
    from airflow_plan_provider.tools.mcp import McpServer
    from tests.airflow.support import task_states, xcom

    ledger = tmp_path / "ledger.jsonl"
    server = str(Path(__file__).resolve().parents[1] / "mcp_server.py")
    extra = {"transport": "stdio", "command": sys.executable, "args": [server, "--ledger", str(ledger)]}
    monkeypatch.setenv("AIRFLOW_CONN_APV_MCP", json.dumps({"conn_type": "mcp", "extra": extra}))
    plan = {
        "goal": PURGE_PLAN["goal"],
        "nodes": [
            {"id": "1", "action": "count stale rows", "tool": "apv_mcp.lookup", "params": {"key": "stale"}},
            {"id": "2", "action": "purge stale rows", "tool": "apv_mcp.purge", "params": {"table": "stale"}},
        ],
        "edges": [{"from": "1", "to": "2"}],
    }
    dag = build_plan_dag(
        "apv_mcp_rejected",
        planner=ScriptedPlanner(plan),
        tools=ToolRegistry(sources=[McpServer("apv_mcp")]),
        approval=ApprovalPolicy(approvers=["alice"], timeout=timedelta(minutes=10)),
        execution=NodeExecution(retries=0, retry_delay=timedelta(0)),
    )

    run, answer = run_answered(dag, hitl_api, "Reject")

    assert answer.request is not None and "purge stale rows" in answer.request["body"]
    recorded = xcom(run, APPROVE_TASK, key=APPROVAL_KEY)
    assert (recorded["status"], recorded["nodes"]) == ("rejected", ["2"])
    assert all(state != "success" for task, state in task_states(run).items() if task.startswith(NODES_TASK))
    assert not ledger.exists()  # nothing ran on the server
