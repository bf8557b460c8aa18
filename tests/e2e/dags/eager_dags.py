"""Plan DAGs in eager mode for tests/e2e/test_eager.py (one mapped task ``nodes``, no layer barrier)."""

from __future__ import annotations

import os
import tempfile
from datetime import timedelta
from pathlib import Path

from airflow_plan_provider import NodeExecution, build_plan_dag
from airflow_plan_provider.testing import CallLog, ScriptedPlanner, ScriptedTool, scripted_registry
from airflow_plan_provider.testing.seed import seed_plan, seed_tools


def call_log(dag_id: str) -> CallLog:
    root = os.environ.get("PLAN_E2E_CALL_LOG") or os.path.join(tempfile.gettempdir(), "plan-e2e-calls")
    return CallLog(Path(root) / dag_id)


# a slow root beside a quick chain: b -> c must not wait for a (it would, behind a layer barrier)
UNBALANCED = {
    "goal": "unbalanced",
    "nodes": [
        {"id": "a", "action": "slow root", "tool": "slow"},
        {"id": "b", "action": "quick root", "tool": "quick"},
        {"id": "c", "action": "after b", "tool": "quick", "dependencies": ["b"]},
        {"id": "d", "action": "after a and c", "tool": "quick", "dependencies": ["a", "c"]},
    ],
}

_log = call_log("e2e_eager_unbalanced")
e2e_eager_unbalanced = build_plan_dag(
    "e2e_eager_unbalanced",
    planner=ScriptedPlanner(UNBALANCED),
    tools=scripted_registry(
        ScriptedTool("slow", log=_log, returns="slow", sleep=20),
        ScriptedTool("quick", log=_log, returns="q", sleep=1),
    ),
    execution=NodeExecution(mode="nodes", max_active_nodes=4, retries=0),
    replan=False,
)

e2e_eager_seed_failure = build_plan_dag(
    "e2e_eager_seed_failure",
    planner=ScriptedPlanner(seed_plan()),
    tools=scripted_registry(
        *seed_tools(call_log("e2e_eager_seed_failure"), query_deploys={"permanent": "403"})
    ),
    execution=NodeExecution(mode="nodes", retries=0, retry_delay=timedelta(seconds=1)),
    replan=False,
)
