"""Plan-and-publish example: a plan with a risky step waits for a human's approval before any node runs.

Trigger ``plan_and_publish``: the plan investigates yesterday's payment API latency, writes the report
and publishes it to a team channel. ``publish_report`` is a risky tool (``needs_approval=True``), so the
run's ``approve`` task asks first: the request (the plan, and the params of the node to approve) waits
on the run's **Required Actions** page (and the Airflow header's Required Actions count) for
**Approve** or **Reject**. Approve and the nodes run; reject (or no answer within 4 hours) and no node
runs: the session ends failed with reason ``rejected``.
"""

from __future__ import annotations

from datetime import timedelta

from airflow_plan_provider import ApprovalPolicy, NodeExecution, build_plan_dag
from airflow_plan_provider.planners.static import StaticPlanner
from plan_demo.publishing import registry as publishing
from plan_demo.tools import registry as investigation

GOAL = "report why the payment API got slow yesterday and publish the report to #payments-oncall"
DAY = {"service": "payment-api", "day": "yesterday"}

PLAN = {
    "goal": GOAL,
    "nodes": [
        {"id": "1", "action": "query latency metrics", "tool": "query_metrics", "params": DAY},
        {"id": "2", "action": "query dependency health", "tool": "query_service_health", "params": DAY},
        {
            "id": "3",
            "action": "correlate latency with dependency health",
            "tool": "analyze_correlation",
            "params": {"latency": "${1}", "against": "${2}", "label": "dependency health of payment-api"},
        },
        {
            "id": "4",
            "action": "write the report",
            "tool": "write_report",
            "params": {"goal": GOAL, "finding": "${3}", "metrics": "${1}"},
        },
        {
            "id": "5",
            "action": "publish the report to #payments-oncall",
            "tool": "publish_report",
            "params": {"path": "${4.path}", "channel": "#payments-oncall"},
        },
    ],
    "edges": [
        {"from": "1", "to": "3"},
        {"from": "2", "to": "3"},
        {"from": "3", "to": "4"},
        {"from": "4", "to": "5"},
    ],
}

plan_and_publish = build_plan_dag(
    "plan_and_publish",
    planner=StaticPlanner(PLAN),
    tools=investigation.merge(publishing),
    goal=GOAL,
    approval=ApprovalPolicy("risky", timeout=timedelta(hours=4)),
    execution=NodeExecution(max_active_nodes=5),
    replan=False,
    tags=["example", "plan", "approval"],
    description="A fixed plan that asks a human before it publishes its report (approval example)",
    doc_md=__doc__,
)
