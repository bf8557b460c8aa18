"""Plan DAGs for tests/e2e/test_plan_view_browser.py: a node that waits for a slow parent long enough
to be seen waiting (in its slot, or deferred), then runs its own tool long enough to be seen running;
``e2e_phases_started`` is the same plan with its nodes that have parents started on the triggerer."""

from __future__ import annotations

from airflow.sdk import DAG

from airflow_plan_provider import NodeExecution, build_plan_dag
from airflow_plan_provider.testing import CallLog, ScriptedPlanner, ScriptedTool, scripted_registry

CALL_LOG_ENV = "PLAN_E2E_CALL_LOG"  # the folder the test gives every process for call logs

WAITING = {
    "goal": "a node that waits for a slow parent, then works",
    "nodes": [
        {"id": "1", "action": "slow parent", "tool": "slow"},
        {"id": "2", "action": "quick parent", "tool": "quick"},
        {"id": "3", "action": "join both", "tool": "steady", "dependencies": ["1", "2"]},
    ],
}


def _phases_dag(dag_id: str, execution: NodeExecution) -> DAG:
    log = CallLog.in_folder_of(CALL_LOG_ENV, dag_id)
    return build_plan_dag(
        dag_id,
        planner=ScriptedPlanner(WAITING),
        tools=scripted_registry(
            ScriptedTool("slow", log=log, returns="slow", sleep=15),
            ScriptedTool("quick", log=log, returns="quick", sleep=1),
            ScriptedTool("steady", log=log, returns="joined", sleep=10),
        ),
        execution=execution,
        replan=False,
        description="Test DAG: a node waits for a slow parent, then runs its own tool",
    )


e2e_phases = _phases_dag("e2e_phases", NodeExecution(max_active_nodes=3, retries=0))
e2e_phases_started = _phases_dag(
    "e2e_phases_started",
    NodeExecution(max_active_nodes=None, retries=0, pools_count_deferred=False, start_on_triggerer=True),
)
