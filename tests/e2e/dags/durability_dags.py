"""Plan DAGs for the durability end-to-end tests (tests/e2e/test_durability_e2e.py).

- ``e2e_crash``: the plan comes in the run's conf; every node calls ``step``, which records its side
  effect under the node's idempotency key *first* and then works for ``params["seconds"]`` (only on the
  first call of a key, so the retry after a crash is quick). The scheduler and its task processes are
  SIGKILLed while one node works; its retry must find the side effect already done.
- ``e2e_clear``: node ``p2`` calls ``gated``, which fails permanently until the test creates the gate
  file (``<call log>/gate``); the test then clears the failed task instance and its skipped descendants.
- ``e2e_async_wait`` / ``e2e_quick_three``: an asynchronous node whose job takes 20 s, and three quick
  nodes one at a time, run on a one-slot LocalExecutor.
- ``e2e_async_fails``: an asynchronous job that fails.

Every DAG gets its own :class:`CallLog` folder, ``$PLAN_E2E_CALL_LOG/<dag_id>``.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow_plan_provider import Budgets, NodeExecution, PermanentToolError, build_plan_dag
from airflow_plan_provider.testing import CallLog, ScriptedPlanner, ScriptedTool, scripted_registry
from airflow_plan_provider.tools.tool import ToolContext

CALL_LOG_ENV = "PLAN_E2E_CALL_LOG"
ASYNC_JOB_SECONDS = 20.0
GATE = "gate"


def call_log(dag_id: str) -> CallLog:
    return CallLog.in_folder_of(CALL_LOG_ENV, dag_id)


class EffectFirstTool(ScriptedTool):
    """Performs its side effect (at most once per idempotency key), then works ``params["seconds"]``.

    The wait happens on the first call of a key only: a second call with the same key (the retry of a
    try that was killed while it waited) returns at once. The output says whether this call performed
    the side effect.
    """

    def __call__(self, ctx: ToolContext, **params: Any) -> Any:
        earlier = [c for c in self.log.calls(self.name, ctx.node_id) if c["key"] == ctx.idempotency_key]
        with self.log.call(self.name, ctx):
            performed = self.log.perform_once(
                ctx.idempotency_key,
                {"tool": self.name, "node": ctx.node_id, "pid": os.getpid(), "attempt": ctx.attempt},
            )
            if not earlier:
                time.sleep(float(params.get("seconds", 0)))
            return {"node": ctx.node_id, "performed": performed, "attempt": ctx.attempt}


class GatedTool(ScriptedTool):
    """Fails permanently unless the file ``gate`` exists; then returns ``returns``."""

    def __init__(self, name: str, *, gate: Path, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.gate = gate

    def __call__(self, ctx: ToolContext, **params: Any) -> Any:
        with self.log.call(self.name, ctx):
            if not self.gate.exists():
                raise PermanentToolError(f"{self.name}: the gate is closed ({self.gate} does not exist)")
            return self.returns


#: the node tasks' settings every DAG here starts from
NODES: dict[str, Any] = {"retry_delay": timedelta(seconds=1), "max_retry_delay": timedelta(seconds=2)}
COMMON: dict[str, Any] = {"tags": ["e2e", "durability"]}

# The plan is given in each run's conf (see crash_plan in the test module); no replan.
e2e_crash = build_plan_dag(
    "e2e_crash",
    planner=None,
    tools=scripted_registry(EffectFirstTool("step", log=call_log("e2e_crash"))),
    execution=NodeExecution(**NODES, retries=2),
    budgets=Budgets(max_replans=0),
    **COMMON,
)


def clear_plan() -> dict[str, Any]:
    """p1 and p2 in layer 0; q needs p2, r needs p1 (layer 1); s needs q and r (layer 2)."""
    nodes = [
        {"id": "p1", "action": "fetch the first input", "tool": "steady", "params": {}},
        {"id": "p2", "action": "fetch behind the gate", "tool": "gated", "params": {}},
        {"id": "q", "action": "use the gated input", "tool": "steady", "params": {"x": "${p2}"}},
        {"id": "r", "action": "use the first input", "tool": "steady", "params": {"x": "${p1}"}},
        {"id": "s", "action": "combine", "tool": "steady", "params": {"q": "${q}", "r": "${r}"}},
    ]
    return {"goal": "clear a failed node and carry on", "nodes": nodes, "edges": []}


e2e_clear = build_plan_dag(
    "e2e_clear",
    planner=ScriptedPlanner(clear_plan()),
    tools=scripted_registry(
        ScriptedTool("steady", log=call_log("e2e_clear"), returns={"ok": True}),
        GatedTool("gated", log=call_log("e2e_clear"), gate=call_log("e2e_clear").folder / GATE, returns=7),
    ),
    execution=NodeExecution(**NODES, retries=1),
    budgets=Budgets(max_replans=0),
    **COMMON,
)

e2e_async_wait = build_plan_dag(
    "e2e_async_wait",
    planner=ScriptedPlanner(
        {
            "goal": "export a table",
            "nodes": [{"id": "export", "action": "export the table", "tool": "export", "params": {}}],
            "edges": [],
        }
    ),
    tools=scripted_registry(
        ScriptedTool(
            "export",
            log=call_log("e2e_async_wait"),
            returns={"rows": 42, "uri": "file:///exports/table.parquet"},
            job_seconds=ASYNC_JOB_SECONDS,
            poll_interval=1.0,
        )
    ),
    budgets=Budgets(max_replans=0),
    execution=NodeExecution(**NODES),
    **COMMON,
)

e2e_quick_three = build_plan_dag(
    "e2e_quick_three",
    planner=ScriptedPlanner(
        {
            "goal": "three quick steps",
            "nodes": [
                {"id": f"k{i}", "action": f"quick {i}", "tool": "quick", "params": {}} for i in range(3)
            ],
            "edges": [],
        }
    ),
    tools=scripted_registry(ScriptedTool("quick", log=call_log("e2e_quick_three"), returns="done")),
    execution=NodeExecution(**NODES, max_active_nodes=1),
    budgets=Budgets(max_replans=0),
    **COMMON,
)

e2e_async_fails = build_plan_dag(
    "e2e_async_fails",
    planner=ScriptedPlanner(
        {
            "goal": "export a table that cannot be exported",
            "nodes": [{"id": "export", "action": "export the table", "tool": "export", "params": {}}],
            "edges": [],
        }
    ),
    tools=scripted_registry(
        ScriptedTool(
            "export",
            log=call_log("e2e_async_fails"),
            returns={"rows": 0},
            job_seconds=1.0,
            job_fails="warehouse export quota exceeded",
            poll_interval=0.5,
        )
    ),
    budgets=Budgets(max_replans=0),
    execution=NodeExecution(**NODES),
    **COMMON,
)
