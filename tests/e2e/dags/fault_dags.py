"""Plan DAGs for the fault tests (tests/e2e/test_faults_e2e.py): one DAG per fault, all built alike, and
one for the soak run (bench/soak.py).

The planner reads the scenario from the run's conf. So that a test can hit a run while one of its control
tasks runs, the planner pauses ``plan_seconds`` before it answers, and ``finalize`` pauses
``finalize_seconds`` before its work (an ``on_execute_callback``, first try only):

- ``waits``: ``slow`` works for a while, its children ``s1`` and ``s2`` wait for it in their slots; ``job``
  is an asynchronous job polled on the triggerer and ``after_job`` waits for it deferred; ``end`` joins
  them all. While ``slow`` works and ``job`` runs, nodes wait in their slots and on the triggerer.
- ``replan``: ``ask`` finds the rest of the plan moot (``ReplanRequested``); the replan's revision runs two
  asynchronous jobs ``j1`` and ``j2`` and a node waiting deferred for ``j1``, while the first run's
  ``replan`` task waits deferred for the new run.

``work`` performs its side effect once per idempotency key first, then works ``params["seconds"]`` (only on
the first call of a key); ``job`` starts a job of ``params["seconds"]`` and records its side effect once
per key. Every call is logged per DAG in ``$PLAN_E2E_CALL_LOG/<dag_id>``, so a test counts the calls and
side effects of each idempotency key.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

from airflow_plan_provider import Budgets, NodeExecution, build_plan_dag
from airflow_plan_provider.contract import FINALIZE_TASK
from airflow_plan_provider.planners.base import PlanRequest
from airflow_plan_provider.testing import CallLog, ScriptedTool, scripted_registry
from airflow_plan_provider.tools.tool import ToolContext

CALL_LOG_ENV = "PLAN_E2E_CALL_LOG"
FAULTS = ("api_server", "api_server_long", "triggerer", "database", "broker", "soak")  # soak: bench/soak.py
MOOT = "the rest of the plan is moot"


def call_log(dag_id: str) -> CallLog:
    return CallLog.in_folder_of(CALL_LOG_ENV, dag_id)


class WorkTool(ScriptedTool):
    """Performs its side effect once per idempotency key, then works ``params["seconds"]`` (first call of
    a key only)."""

    def __call__(self, ctx: ToolContext, **params: Any) -> Any:
        earlier = [c for c in self.log.calls(self.name, ctx.node_id) if c["key"] == ctx.idempotency_key]
        with self.log.call(self.name, ctx):
            performed = self.log.perform_once(
                ctx.idempotency_key, {"tool": self.name, "node": ctx.node_id, "pid": os.getpid()}
            )
            if not earlier:
                time.sleep(float(params.get("seconds", 0)))
            return {"node": ctx.node_id, "performed": performed}


class JobTool(ScriptedTool):
    """Starts a job that ends ``params["seconds"]`` later (polled on the triggerer); its side effect, once
    per idempotency key, is the start."""

    def __call__(self, ctx: ToolContext, **params: Any) -> Any:
        with self.log.call(self.name, ctx):
            performed = self.log.perform_once(ctx.idempotency_key, {"tool": self.name, "node": ctx.node_id})
            result = {"node": ctx.node_id, "performed": performed}
            return {"until": time.time() + float(params.get("seconds", 0)), "result": result, "fails": None}


def work(node: str, seconds: float = 0, after: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"id": node, "action": f"work {node}", "tool": "work", "params": {"seconds": seconds}} | (
        {"dependencies": list(after)} if after else {}
    )


def job(node: str, seconds: float) -> dict[str, Any]:
    return {"id": node, "action": f"job {node}", "tool": "job", "params": {"seconds": seconds}}


def waits_plan(seconds: float) -> dict[str, Any]:
    return {
        "goal": "wait through a fault",
        "nodes": [
            work("slow", seconds),
            work("s1", after=("slow",)),
            work("s2", after=("slow",)),
            job("job", seconds),
            work("after_job", after=("job",)),
            work("end", after=("s1", "s2", "after_job")),
        ],
    }


def replan_plan() -> dict[str, Any]:
    return {
        "goal": "replan through a fault",
        "nodes": [
            {"id": "ask", "action": "look first", "tool": "moot", "params": {}},
            work("later", after=("ask",)),
        ],
    }


def revision(seconds: float) -> dict[str, Any]:
    """What the planner answers to ``ask``'s request: two jobs, a node after one, ``later`` after all."""
    return {
        "nodes": [
            job("j1", seconds),
            job("j2", seconds),
            work("after_j1", after=("j1",)),
            {**work("later", after=("after_j1", "j2")), "action": "work later, revised"},
        ],
    }


class FaultPlanner:
    """The plan of the run's ``scenario`` (``waits`` or ``replan``), its durations from ``seconds``."""

    def __repr__(self) -> str:  # what the DAG's serialization shows: the same on every parse
        return "FaultPlanner()"

    def plan(self, request: PlanRequest) -> dict[str, Any]:
        seconds = float(request.conf.get("seconds", 30))
        time.sleep(float(request.conf.get("plan_seconds", 0)))
        if request.is_replan:
            return revision(seconds)
        return replan_plan() if request.conf.get("scenario") == "replan" else waits_plan(seconds)


def pause_finalize(context: Any) -> None:
    """``on_execute_callback`` of every task: the first try of ``finalize`` pauses ``finalize_seconds``."""
    ti = context["ti"]
    conf = context["dag_run"].conf or {}
    if ti.task_id == FINALIZE_TASK and ti.try_number == 1:
        time.sleep(float(conf.get("finalize_seconds", 0)))


def fault_dag(fault: str) -> Any:
    dag_id = f"e2e_fault_{fault}"
    log = call_log(dag_id)
    return build_plan_dag(
        dag_id,
        planner=FaultPlanner(),
        tools=scripted_registry(
            WorkTool("work", log=log),
            JobTool("job", log=log, job_seconds=0, poll_interval=1.0),
            ScriptedTool("moot", log=log, returns={"found": "nothing"}, side_effect=True, replan=MOOT),
        ),
        execution=NodeExecution(
            retries=2,
            retry_delay=timedelta(seconds=1),
            max_retry_delay=timedelta(seconds=2),
            max_active_nodes=None,
            slot_wait=timedelta(seconds=90),
        ),
        budgets=Budgets(max_replans=1),
        default_args={"on_execute_callback": pause_finalize},
        tags=["e2e", "faults"],
    )


for _fault in FAULTS:
    globals()[f"e2e_fault_{_fault}"] = fault_dag(_fault)
