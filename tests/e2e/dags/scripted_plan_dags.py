"""Scripted plan DAGs for the end-to-end tests (parsed by a real dag-processor, run by real workers).

Every DAG gets its own :class:`CallLog` folder, ``$PLAN_E2E_CALL_LOG/<dag_id>``, so a test can count the
tool calls of one scenario across every process (and every run of a replan chain) and measure how many
ran at the same time.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from airflow.sdk import DAG, task

from airflow_plan_provider import NodeExecution, build_plan_dag, plan_task_group
from airflow_plan_provider.testing import CallLog, ScriptedPlanner, ScriptedTool, scripted_registry
from airflow_plan_provider.tools.registry import ToolRegistry
from harness.seed import seed_plan, seed_revision, seed_tools

CALL_LOG_ENV = "PLAN_E2E_CALL_LOG"
POOL = "plan_e2e_pool"
NAP_SECONDS = 2.0
INDEPENDENT_NODES = 8


def call_log(dag_id: str) -> CallLog:
    return CallLog.in_folder_of(CALL_LOG_ENV, dag_id)


def independent_plan(count: int = INDEPENDENT_NODES) -> dict[str, Any]:
    nodes = [{"id": f"n{i}", "action": f"nap {i}", "tool": "nap", "params": {}} for i in range(count)]
    return {"goal": "nap in parallel", "nodes": nodes, "edges": []}


#: the node tasks' settings every DAG here starts from
NODES: dict[str, Any] = {"retry_delay": timedelta(seconds=1), "max_retry_delay": timedelta(seconds=2)}
COMMON: dict[str, Any] = {"tags": ["e2e"]}

# A permanent failure of node 3; the plan comes in the run's conf (no planner), max_replans 0 in the conf.
e2e_seed_failure = build_plan_dag(
    "e2e_seed_failure",
    planner=None,
    tools=scripted_registry(
        *seed_tools(call_log("e2e_seed_failure"), query_deploys={"permanent": "deploy API says 403"})
    ),
    execution=NodeExecution(**NODES),
    **COMMON,
)

# Node 3 finds no deploy and asks for a replan; the scripted planner revises node 5.
e2e_seed_replan = build_plan_dag(
    "e2e_seed_replan",
    planner=ScriptedPlanner(seed_plan(), on_error=[("no deploys", seed_revision())]),
    tools=scripted_registry(
        *seed_tools(call_log("e2e_seed_replan"), query_deploys={"replan": "no deploys yesterday"})
    ),
    execution=NodeExecution(**NODES),
    **COMMON,
)

# Eight independent naps, at most two at a time in a run.
e2e_cap_two = build_plan_dag(
    "e2e_cap_two",
    planner=ScriptedPlanner(independent_plan()),
    tools=scripted_registry(
        ScriptedTool("nap", log=call_log("e2e_cap_two"), sleep=NAP_SECONDS, returns="rested")
    ),
    execution=NodeExecution(**NODES, max_active_nodes=2),
    **COMMON,
)

# Up to five per run, but every node takes a slot of a 3-slot pool shared by all runs.
e2e_pool_three = build_plan_dag(
    "e2e_pool_three",
    planner=ScriptedPlanner(independent_plan()),
    tools=scripted_registry(
        ScriptedTool("nap", log=call_log("e2e_pool_three"), sleep=NAP_SECONDS, returns="rested")
    ),
    execution=NodeExecution(**NODES, max_active_nodes=5, pool=POOL),
    **COMMON,
)

# Node 1's tool fails once with a transient error; Airflow retries it.
e2e_transient = build_plan_dag(
    "e2e_transient",
    planner=ScriptedPlanner(
        {
            "goal": "retry a flaky call",
            "nodes": [
                {"id": "1", "action": "flaky call", "tool": "flaky", "params": {}},
                {"id": "2", "action": "use it", "tool": "steady", "params": {"x": "${1}"}},
            ],
            "edges": [],
        }
    ),
    tools=scripted_registry(
        ScriptedTool("flaky", log=call_log("e2e_transient"), transient_failures=1, returns={"ok": True}),
        ScriptedTool("steady", log=call_log("e2e_transient"), returns="done"),
    ),
    execution=NodeExecution(**NODES, retries=2),
    **COMMON,
)

# A plan between a team's own tasks: extract >> plan_task_group("triage") >> publish.
with DAG("e2e_team_triage", schedule=None, tags=["e2e"]) as e2e_team_triage:

    @task
    def extract() -> str:
        return "payments"

    @task
    def publish(result: dict[str, Any]) -> dict[str, Any]:
        return {"status": result["status"], "goal": result["goal"], "outputs": result["outputs"]}

    triage = plan_task_group(
        "triage",
        planner=ScriptedPlanner(seed_plan()),
        tools=scripted_registry(*seed_tools(call_log("e2e_team_triage"))),
        goal="why is {{ ti.xcom_pull(task_ids='extract') }} slow?",
        execution=NodeExecution(**NODES),
    )
    extract() >> triage
    publish(triage.result)

# One node whose tool reports its task process and the process that imported the provider for it
# (the scheduler, when its LocalExecutor forks the task processes: airflow_plan_provider/preload.py).
where_registry = ToolRegistry()


@where_registry.tool(description="name this task process and the process that preloaded the provider")
def where() -> dict[str, Any]:
    from airflow_plan_provider import preload

    return {"pid": os.getpid(), "preloaded_by": preload.preloaded_by}


e2e_preloaded = build_plan_dag(
    "e2e_preloaded",
    planner=ScriptedPlanner(
        {"goal": "say where", "nodes": [{"id": "1", "action": "say where", "tool": "where"}], "edges": []}
    ),
    tools=where_registry,
    execution=NodeExecution(**NODES),
    **COMMON,
)
