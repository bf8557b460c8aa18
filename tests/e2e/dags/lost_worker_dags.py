"""The plan DAG of the lost-worker tests (tests/e2e/test_celery_durability.py).

``e2e_lost_worker`` plans two nodes, ``a`` then ``b`` (``b`` uses ``a``'s output), both calling
``effect``, which performs its side effect once per idempotency key. The run's conf names the task the
test will kill (``hold``: ``plan``, ``node`` or ``finalize``) and a ``tag`` unique to the run; the first
try of that task writes the marker file ``held-<tag>`` in the call-log folder and then works for
:data:`HOLD_SECONDS`, long enough for the test to SIGKILL its worker:

- ``plan``: the planner's first call for the tag works before answering (a retry's call answers at once);
- ``node``: node ``a``'s first call performs its side effect, then works;
- ``finalize``: finalize's first try works before its own work (an ``on_execute_callback``).

Every planner call is logged to ``planner_calls.jsonl`` in the same folder, ``$PLAN_E2E_CALL_LOG/<dag_id>``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from airflow_plan_provider import Budgets, ControlRetries, build_plan_dag
from airflow_plan_provider.contract import FINALIZE_TASK
from airflow_plan_provider.planners.base import PlanRequest
from airflow_plan_provider.testing import CallLog, ScriptedTool, scripted_registry
from airflow_plan_provider.tools.tool import ToolContext

CALL_LOG_ENV = "PLAN_E2E_CALL_LOG"
DAG_ID = "e2e_lost_worker"
HOLD_SECONDS = 120.0


def call_log(dag_id: str) -> CallLog:
    return CallLog.in_folder_of(CALL_LOG_ENV, dag_id)


def hold_once(folder: Path, tag: str) -> None:
    """Write the marker ``held-<tag>`` and work HOLD_SECONDS, unless the marker is there already."""
    marker = folder / f"held-{tag}"
    if marker.exists():
        return
    marker.write_text(json.dumps({"pid": os.getpid(), "t": time.time()}))
    time.sleep(HOLD_SECONDS)


class HoldingPlanner:
    """Plans ``a`` → ``b``; its first call for a run whose conf says ``hold: plan`` works first."""

    def __init__(self, log: CallLog) -> None:
        self.log = log

    def __repr__(self) -> str:  # what the DAG's serialization shows: the same on every parse
        return f"HoldingPlanner({self.log.folder.name!r})"

    def plan(self, request: PlanRequest) -> dict[str, Any]:
        tag = str(request.conf.get("tag", ""))
        with (self.log.folder / "planner_calls.jsonl").open("a") as fh:
            fh.write(json.dumps({"tag": tag, "pid": os.getpid(), "t": time.time()}) + "\n")
        if request.conf.get("hold") == "plan":
            hold_once(self.log.folder, tag)
        node_hold = request.conf.get("hold") == "node"
        return {
            "goal": request.goal,
            "nodes": [
                {
                    "id": "a",
                    "action": "first step",
                    "tool": "effect",
                    "params": {"tag": tag, "hold": node_hold},
                },
                {"id": "b", "action": "second step", "tool": "effect", "params": {"tag": tag, "x": "${a}"}},
            ],
            "edges": [],
        }


class EffectTool(ScriptedTool):
    """Performs its side effect once per idempotency key; with ``hold`` its first call then works."""

    def __call__(self, ctx: ToolContext, **params: Any) -> Any:
        with self.log.call(self.name, ctx):
            performed = self.log.perform_once(
                ctx.idempotency_key,
                {"tool": self.name, "node": ctx.node_id, "tag": params.get("tag"), "attempt": ctx.attempt},
            )
            if params.get("hold"):
                hold_once(self.log.folder, str(params.get("tag")))
            return {"node": ctx.node_id, "performed": performed}


def hold_finalize(context: Any) -> None:
    """``on_execute_callback`` of every task: holds the first try of finalize when the conf says so."""
    ti = context["ti"]
    conf = context["dag_run"].conf or {}
    if ti.task_id == FINALIZE_TASK and conf.get("hold") == "finalize" and ti.try_number == 1:
        hold_once(call_log(DAG_ID).folder, str(conf.get("tag")))


e2e_lost_worker = build_plan_dag(
    DAG_ID,
    planner=HoldingPlanner(call_log(DAG_ID)),
    tools=scripted_registry(EffectTool("effect", log=call_log(DAG_ID))),
    budgets=Budgets(max_replans=0),
    control_retries=ControlRetries(),  # the default, spelled out: 3 retries, 5 s apart
    default_args={"on_execute_callback": hold_finalize},
    tags=["e2e", "durability"],
)
