"""A plan DAG for tests/e2e/test_plan_view_browser.py: a node that waits for a slow parent long enough
to be seen waiting (in its slot, or deferred), then runs its own tool long enough to be seen running."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from airflow_plan_provider import NodeExecution, build_plan_dag
from airflow_plan_provider.testing import CallLog, ScriptedPlanner, ScriptedTool, scripted_registry

WAITING = {
    "goal": "a node that waits for a slow parent, then works",
    "nodes": [
        {"id": "1", "action": "slow parent", "tool": "slow"},
        {"id": "2", "action": "quick parent", "tool": "quick"},
        {"id": "3", "action": "join both", "tool": "steady", "dependencies": ["1", "2"]},
    ],
}

_log = CallLog(
    Path(os.environ.get("PLAN_E2E_CALL_LOG") or os.path.join(tempfile.gettempdir(), "plan-e2e-calls"))
    / "e2e_phases"
)
e2e_phases = build_plan_dag(
    "e2e_phases",
    planner=ScriptedPlanner(WAITING),
    tools=scripted_registry(
        ScriptedTool("slow", log=_log, returns="slow", sleep=15),
        ScriptedTool("quick", log=_log, returns="quick", sleep=1),
        ScriptedTool("steady", log=_log, returns="joined", sleep=10),
    ),
    execution=NodeExecution(max_active_nodes=3, retries=0),
    replan=False,
    description="Test DAG: a node waits for a slow parent, then runs its own tool",
)
