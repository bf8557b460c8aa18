"""Plan-and-execute example: "find why the payment API got slow yesterday and write a report".

Trigger ``plan_and_execute`` from the UI (the form asks for a goal, an optional ready plan and the
budgets). The offline template planner writes a 6-node plan over the shipped demo dataset: four
independent queries, a correlation, a report. Yesterday had no deploy, so the deploy query asks for a
replan, and the next revision correlates latency with dependency health instead; the four finished
queries are reused, not run again.

``plan_and_execute_llm`` is the same DAG with an LLM planner behind the ``plan_llm_default``
connection (any OpenAI-compatible endpoint).
"""

from __future__ import annotations

from airflow_plan_provider import NodeExecution, build_plan_dag
from airflow_plan_provider.planners.llm import LLMPlanner
from plan_demo.planner import payment_latency_planner
from plan_demo.tools import registry

GOAL = "find why the payment API got slow yesterday and write a report"

plan_and_execute = build_plan_dag(
    "plan_and_execute",
    planner=payment_latency_planner(),
    tools=registry,
    goal=GOAL,
    execution=NodeExecution(max_active_nodes=5),
    tags=["example", "plan"],
    description="A goal in, a plan executed: the offline template planner and the payment-latency demo tools",
    doc_md=__doc__,
)

plan_and_execute_llm = build_plan_dag(
    "plan_and_execute_llm",
    planner=LLMPlanner(conn_id="plan_llm_default"),
    tools=registry,
    goal=GOAL,
    execution=NodeExecution(max_active_nodes=5),
    tags=["example", "plan", "llm"],
    description="The same goal planned by an LLM (the plan_llm_default connection), the same demo tools",
    doc_md=__doc__,
)
