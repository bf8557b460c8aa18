"""daily_payment_report: a frozen plan, run on a schedule with no planner call.

- **Goal:** find why the payment API got slow yesterday and write a report
- **Frozen from:** run manual__2026-11-29T17:19:05.784011+00:00 of DAG plan_and_execute, made on
  2026-11-29 (a run of the Airflow the plan was read from, which may not be this one)
- **Revision:** 1, after 1 replan(s); it ran as manual__2026-11-29T17:19:05.784011+00:00__replan_1
- **Schedule:** @daily, from 2024-01-01 (UTC)

**Nodes** (each run validates and executes exactly these, strings rendered as Jinja per run; a
run's conf cannot replace them: a conf that gives a plan is refused):

- 1 · query latency metrics of payment-api for yesterday (query_metrics)
- 2 · query dependency health of payment-api for yesterday (query_service_health)
- 4 · query error logs of payment-api for yesterday (query_error_logs)
- 5 · correlate latency with dependency health (analyze_correlation)
- 6 · write the report (write_report)

**Left out** of the source's final plan: the nodes that requested a replan in the source
session and that no node of the final plan depends on (a frozen plan is never replanned):

- 3 · query deploy records of payment-api for yesterday (query_deploys)

**Written by** airflow-plan freeze (docs/plan-view-and-approval.md) with the options:

    --tools plan_demo.tools:registry
    --dag-id daily_payment_report
    --schedule @daily
    --start-date 2024-01-01
    --param 'day={{ macros.ds_add(ds, -1) }}'

To change the plan, freeze another session, or edit PLAN: each run validates it.
"""

from __future__ import annotations

from datetime import UTC, datetime

from airflow_plan_provider import Budgets, build_plan_dag
from plan_demo.tools import registry as tools

PLAN = {
    "goal": "find why the payment API got slow yesterday and write a report",
    "nodes": [
        {
            "id": "1",
            "action": "query latency metrics of payment-api for yesterday",
            "tool": "query_metrics",
            "params": {"service": "payment-api", "day": "{{ macros.ds_add(ds, -1) }}"},
            "expected_outcome": "hourly p50/p95/p99 with the slow hours",
        },
        {
            "id": "2",
            "action": "query dependency health of payment-api for yesterday",
            "tool": "query_service_health",
            "params": {"service": "payment-api", "day": "{{ macros.ds_add(ds, -1) }}"},
            "expected_outcome": "hourly p99 and error rate of each downstream dependency",
        },
        {
            "id": "4",
            "action": "query error logs of payment-api for yesterday",
            "tool": "query_error_logs",
            "params": {"service": "payment-api", "day": "{{ macros.ds_add(ds, -1) }}"},
            "expected_outcome": "the most frequent error messages per hour",
        },
        {
            "id": "5",
            "action": "correlate latency with dependency health",
            "tool": "analyze_correlation",
            "params": {
                "latency": "${1}",
                "against": "${2}",
                "label": "dependency health of payment-api",
            },
            "expected_outcome": "a finding naming the dependency that explains the slow hours",
        },
        {
            "id": "6",
            "action": "write the report",
            "tool": "write_report",
            "params": {
                "goal": "find why the payment API got slow yesterday and write a report",
                "finding": "${5}",
                "metrics": "${1}",
                "errors": "${4}",
            },
            "expected_outcome": "a Markdown report with the cause and the evidence",
        },
    ],
    "edges": [
        {"from": "1", "to": "5"},
        {"from": "2", "to": "5"},
        {"from": "4", "to": "5", "optional": True},
        {"from": "5", "to": "6"},
        {"from": "4", "to": "6", "optional": True},
    ],
}

daily_payment_report = build_plan_dag(
    "daily_payment_report",
    planner=None,
    plan=PLAN,
    tools=tools,
    goal=PLAN["goal"],
    schedule="@daily",
    start_date=datetime(2024, 1, 1, tzinfo=UTC),
    catchup=False,
    replan=False,
    budgets=Budgets(max_replans=0),
    tags=["plan", "frozen"],
    description="Frozen plan, @daily: find why the payment API got slow yesterday and write a report",
    doc_md=__doc__,
)
