"""A plan larger than one state read should cover: its waiting nodes read their parents' states one
instance at a time (``WaitingPolicy.read_all_states_up_to``), and the nodes still see their parents finish.

The node tasks' policy here reads every state only up to 10 nodes, so a plan of 12 takes the path a plan
of over 100 takes with the default (every node task of ``dag.test()`` costs about half a second: 102 of
them took a minute)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from airflow_plan_provider import Budgets, NodeExecution
from airflow_plan_provider.plan.waiting import WaitingPolicy
from airflow_plan_provider.testing import CallLog, ScriptedPlanner, ScriptedTool, scripted_registry
from airflow_plan_provider.testing.in_process import run_session

pytestmark = pytest.mark.airflow

READ_ALL_STATES_UP_TO = 10
WIDTH = READ_ALL_STATES_UP_TO  # children of the two roots: a plan of WIDTH + 2 nodes


def test_nodes_of_a_large_plan_read_their_parents_one_instance_at_a_time(tmp_path, monkeypatch):
    from airflow_plan_provider.dag_factory import build_plan_dag
    from airflow_plan_provider.operators.node import PlanNodeOperator

    policies: list[WaitingPolicy] = []

    def policy(self: PlanNodeOperator) -> WaitingPolicy:
        policies.append(WaitingPolicy(slot_wait=self.slot_wait, read_all_states_up_to=READ_ALL_STATES_UP_TO))
        return policies[-1]

    monkeypatch.setattr(PlanNodeOperator, "_policy", policy)

    log = CallLog(tmp_path)
    plan = {
        "goal": "fan out",
        "nodes": [
            {"id": "a", "action": "root a", "tool": "emit", "params": {"value": 1}},
            {"id": "b", "action": "root b", "tool": "emit", "params": {"value": 2}},
            *(
                {"id": f"c{i}", "action": f"child {i}", "tool": "add", "params": {"x": "${a}", "y": "${b}"}}
                for i in range(WIDTH)
            ),
        ],
        "edges": [],
    }
    tools = scripted_registry(
        ScriptedTool("emit", log=log, returns=lambda params: params["value"]),
        ScriptedTool("add", log=log, returns=lambda params: params["x"] + params["y"]),
    )
    dag = build_plan_dag(
        "large_plan_reads",
        planner=ScriptedPlanner(plan),
        tools=tools,
        execution=NodeExecution(retries=0, retry_delay=timedelta(0)),
        budgets=Budgets(max_steps=WIDTH + 2),
    )
    session = run_session(dag, {"goal": "fan out"})

    assert len(plan["nodes"]) > READ_ALL_STATES_UP_TO
    assert policies and all(p.reads_one_by_one(len(plan["nodes"])) for p in policies)
    assert (session.result.status, session.result.reason) == ("completed", "goal_met")
    assert {session.result.outputs[f"c{i}"] for i in range(WIDTH)} == {3}
    assert (log.count("emit"), log.count("add")) == (2, WIDTH)
