"""The contract between a plan DAG's tasks: its names, the shapes of what tasks publish, and their readers."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_plan_provider import contract
from airflow_plan_provider.contract import (
    FINALIZE_TASK,
    REPLAN_TASK,
    ApprovalRecord,
    PlanningErrorRecord,
    ReplanConf,
    approval_lets_nodes_run,
    labelled_node,
    lane_task_id,
    locked_key,
    mapped_label,
    node_label,
    select_task_id,
    session_outcome,
)
from airflow_plan_provider.exceptions import PlanningError
from airflow_plan_provider.plan.approval import Approval
from airflow_plan_provider.plan.session import replan_conf, start_session
from airflow_plan_provider.problems import Problem, describe


def test_the_names_are_those_users_see() -> None:
    """Task ids and keys are public: the grid, the REST API (``.../taskInstances/approve/-1/hitlDetails``,
    ``.../xcomEntries/return_value``) and runs made by an earlier version all use them. The literals here
    are what this test checks."""
    tasks = {
        name: getattr(contract, name)
        for name in ("PLAN_TASK", "APPROVE_TASK", "NODES_TASK", "FINALIZE_TASK", "REPLAN_TASK")
    }
    assert tasks == {
        "PLAN_TASK": "plan",
        "APPROVE_TASK": "approve",
        "NODES_TASK": "nodes",
        "FINALIZE_TASK": "finalize",
        "REPLAN_TASK": "replan",
    }
    keys = {name: value for name, value in vars(contract).items() if name.endswith("_KEY")}
    assert keys == {
        "RESULT_KEY": "return_value",
        "PLAN_KEY": "plan",
        "SESSION_KEY": "session",
        "TOOLS_KEY": "tools",
        "PLACES_KEY": "places",
        "RUN_CONTEXT_KEY": "run",
        "PLANNING_ERROR_KEY": "planning_error",
        "APPROVAL_KEY": "approval",
        "NODE_KEY": "node",
        "POLLING_KEY": "polling",
        "REPLAN_CONF_KEY": "replan_conf",
    }
    assert lane_task_id(None) == "nodes" and lane_task_id("ticket_api") == "nodes__ticket_api"
    assert select_task_id(lane_task_id("ticket_api")) == "select_nodes__ticket_api"
    assert locked_key("3") == "locked__3"
    assert node_label("3", "query deploys") == "3 · query deploys"


def test_a_label_names_its_node() -> None:
    assert labelled_node(node_label("n-1", "a · b")) == "n-1"
    assert labelled_node(None) is None and labelled_node("") is None


def test_a_node_instances_label_comes_from_its_mapped_value_a_brief_or_a_label() -> None:
    assert mapped_label("3 · query deploys") == "3 · query deploys"
    brief = {"node": {"id": "3", "action": "query {{ deploys }}", "tool": "t"}, "at": {}, "plan_size": 1}
    assert mapped_label(brief) == "3 · query {{ deploys }}"
    for malformed in ({}, {"node": "3"}, {"node": {"id": 3}}, ["3"], None, 3):
        assert mapped_label(malformed) is None


def approval(status: str = "granted", **fields: object) -> Approval:
    return Approval.model_validate({"revision": 1, "run_id": "r", "status": status, **fields})


def test_an_approval_record_lets_nodes_run_only_when_granted_or_not_needed() -> None:
    asked = approval("rejected", nodes=["2"], calls={"2": "d" * 64}, approvers=["ops"])
    requested = ApprovalRecord.requested(asked).model_dump(mode="json")
    granted = ApprovalRecord.model_validate(approval(nodes=["2"]).model_dump(mode="json"))
    not_needed = ApprovalRecord.not_needed(2, ["1"]).model_dump(mode="json")
    assert requested["status"] == "requested" and requested["approvers"] == ["ops"]
    assert not_needed == {"status": "not_needed", "revision": 2, "approved_earlier": ["1"]}
    assert [approval_lets_nodes_run(v) for v in (granted.model_dump(mode="json"), not_needed)] == [True, True]
    rejected = approval("rejected").model_dump(mode="json")
    for value in (requested, rejected, None, {}, {"status": "maybe"}, "granted", ["granted"]):
        assert approval_lets_nodes_run(value) is False, value


def test_an_approval_record_gives_the_answer_an_unanswered_request_a_rejection() -> None:
    asked = approval("rejected", nodes=["2"], calls={"2": "d" * 64}, requested_at="t0")
    unanswered = ApprovalRecord.model_validate(ApprovalRecord.requested(asked).model_dump(mode="json"))
    answer = unanswered.answer()
    assert answer is not None
    assert (answer.status, answer.calls, answer.nodes) == ("rejected", {}, ["2"])
    assert answer.message == "the approval task ended unanswered" and answer.requested_at == "t0"
    granted = approval(nodes=["2"], calls={"2": "d" * 64}, responded_by="ops")
    assert ApprovalRecord.model_validate(granted.model_dump(mode="json")).answer() == granted
    assert ApprovalRecord.not_needed(0, []).answer() is None


def test_the_replan_conf_finalize_prepares_is_a_replan_conf() -> None:
    state = start_session(goal="g", run_id="root").model_copy(update={"revision": 2})
    conf = ReplanConf.model_validate(replan_conf(state))
    assert conf.goal == "g" and conf.state == state


def test_a_replan_runs_conf_names_its_session_and_carries_none_of_it() -> None:
    state = start_session(goal="g", run_id="root").model_copy(
        update={"revision": 2, "parent_run_id": "root__replan_1", "run_ids": ["root", "root__replan_1"]}
    )
    conf = ReplanConf.model_validate(replan_conf(state)).run_conf()
    assert conf == {
        "goal": "g",
        "session": {"root_run_id": "root", "parent_run_id": "root__replan_1", "revision": 2},
    }


def test_a_planning_error_keeps_its_own_text_apart_from_its_problem_list() -> None:
    problems = [Problem("empty_plan", f"plan has no nodes\n  - {i}", path="nodes") for i in range(30)]
    error = PlanningError("no valid plan\n  - after 3 attempt(s)", problems, reason="invalid_plan")
    assert error.text == "no valid plan\n  - after 3 attempt(s)"  # the list's formatting in its own text
    assert str(error) == f"{error.text}\n{describe(problems)}"
    record = PlanningErrorRecord(reason=error.reason, message=str(error))
    assert PlanningErrorRecord.model_validate(record.model_dump(mode="json")) == record


def result(status: str, **fields: object) -> dict[str, object]:
    return {"status": status, "reason": "goal_met" if status == "completed" else "node_failed", **fields}


REPLANNED = {**result("replanned"), "reason": "replan_requested"}


@pytest.mark.parametrize(
    ("returned", "expected"),
    [
        ({}, None),  # finalize has not reported
        ({FINALIZE_TASK: result("completed")}, "completed"),
        ({FINALIZE_TASK: result("failed")}, "failed"),
        ({FINALIZE_TASK: {"status": "not a result"}}, None),
        ({FINALIZE_TASK: {**result("replanned"), "reason": "replan_requested"}}, None),  # the chain goes on
        (
            {
                FINALIZE_TASK: {**result("replanned"), "reason": "replan_requested"},
                REPLAN_TASK: result("failed"),
            },
            "failed",
        ),
    ],
)
def test_a_run_reports_its_own_result_or_its_chains(
    returned: dict[str, dict[str, object]], expected: str | None
) -> None:
    outcome = session_outcome(returned.get)
    assert (outcome.status if outcome else None) == expected


def test_a_chain_whose_root_has_not_reported_yet_reports_through_its_later_runs() -> None:
    root, child, grandchild = (
        {FINALIZE_TASK: REPLANNED},
        {FINALIZE_TASK: REPLANNED},
        {FINALIZE_TASK: result("completed")},
    )
    assert session_outcome(root.get) is None  # the root alone: its replan task has not reported
    assert session_outcome(root.get, child.get) is None  # the chain goes on past the runs read
    outcome = session_outcome(root.get, child.get, grandchild.get)
    assert outcome is not None and outcome.status == "completed"
    child[REPLAN_TASK] = result("failed")  # the child's replan task reported the rest of the chain
    outcome = session_outcome(root.get, child.get, grandchild.get)
    assert outcome is not None and outcome.status == "failed"
    root[REPLAN_TASK] = result("completed")  # the root's report is the session's, once it is there
    outcome = session_outcome(root.get, child.get, grandchild.get)
    assert outcome is not None and outcome.status == "completed"


def wide_plan(layers: int, width: int = 5) -> dict[str, Any]:
    """``layers`` layers of ``width`` nodes; each node after the first layer has the node above it as a
    hard parent and the next one of that layer as an optional parent, and passes the first one's output."""
    ids = [[f"n{layer}_{i}" for i in range(width)] for layer in range(layers)]
    nodes, edges = [], []
    for layer, row in enumerate(ids):
        for i, node in enumerate(row):
            params: dict[str, Any] = {"i": i}
            if layer:
                above, beside = ids[layer - 1][i], ids[layer - 1][(i + 1) % width]
                params["x"] = "${" + above + ".v}"
                edges += [{"from": above, "to": node}, {"from": beside, "to": node, "optional": True}]
            nodes.append(
                {"id": node, "action": f"step {node}", "tool": "api" if i == 0 else "t", "params": params}
            )
    return {"nodes": nodes, "edges": edges}


def test_a_node_brief_holds_the_node_its_parents_and_where_they_run_whatever_the_plans_size() -> None:
    """What a node task reads to start: what its step needs (as ``ValidatedPlan.around`` gives it), its
    place in the step budget's order, where its parents' and grandparents' instances are (across pool
    lanes), and nothing that grows with the rest of the plan."""
    import json

    from airflow_plan_provider.contract import (
        BRIEFS_PER_XCOM,
        NODES_TASK,
        NodeBrief,
        brief_groups,
        briefs_key,
        mapped_values,
        node_briefs,
        node_tasks,
    )
    from airflow_plan_provider.plan.session import RunContext
    from airflow_plan_provider.plan.validate import Limits, validate_plan

    def briefs(layers: int) -> tuple[Any, RunContext, dict[str, NodeBrief], dict[str, int]]:
        plan = validate_plan(wide_plan(layers), limits=Limits(max_nodes=1000))
        lanes = {n.id: "api" for n in plan.nodes if n.tool == "api"}
        run = RunContext(root_run_id="r", revision=1, lanes=lanes, execution_order=plan.run_order[1:])
        run.reused = plan.run_order[:1]
        found, sizes = {}, {}
        by_task = node_briefs(plan, run)
        groups = brief_groups(by_task)
        assert all(len(group) <= BRIEFS_PER_XCOM for group in groups.values())
        for task, task_briefs in by_task.items():
            mapped = mapped_values(plan, run, task, by_task)
            assert mapped_values(plan, run, task) == mapped  # as a lane's select task builds them
            assert node_briefs(plan, run, task) == {task: task_briefs}
            for index, value in enumerate(task_briefs):
                brief = NodeBrief.model_validate(json.loads(json.dumps(value)))
                assert brief.location(brief.node_id) == (task, index)
                if len(task_briefs) <= BRIEFS_PER_XCOM:  # the task maps over its briefs; no group
                    assert mapped[index] is value and briefs_key(task, index) not in groups
                else:  # over its labels; the brief in its group
                    assert mapped[index] == brief.label
                    assert groups[briefs_key(task, index)][index % BRIEFS_PER_XCOM] is value
                found[brief.node_id], sizes[brief.node_id] = brief, len(json.dumps(value))
        return plan, run, found, sizes

    plan, run, found, sizes = briefs(4)
    assert set(found) == set(plan.node_ids)
    where = {n: (t, i) for t, nodes in node_tasks(plan, run).items() for i, n in enumerate(nodes)}
    for node_id, brief in found.items():
        whole = plan.around(node_id)
        assert brief.label == f"{node_id} · step {node_id}"
        assert brief.plan.node(node_id) == plan.node(node_id)
        assert brief.plan.parents == whole.parents and brief.plan.soft_edges == whole.soft_edges
        assert [(n.id, n.tool, n.params) for n in brief.plan.nodes] == [
            (n.id, n.tool, n.params) for n in whole.nodes
        ]
        assert brief.position == run.position(node_id)
        assert brief.run.reused == ([node_id] if node_id in run.reused else [])
        near = {node_id, *plan.parents[node_id], *(g for p in plan.parents[node_id] for g in plan.parents[p])}
        assert {n: brief.location(n) for n in near} == {n: where[n] for n in near}
        assert {n for indexes in brief.at.values() for n in indexes} == near
    assert found["n2_0"].at.keys() == {"nodes__api", NODES_TASK}  # n2_0 and n1_0 in the lane, n1_1 not
    *_, large = briefs(150)  # 750 nodes: a node's brief is the same size, but for the plan size's digits
    assert all(large[n] - sizes[n] <= 1 for n in sizes)
