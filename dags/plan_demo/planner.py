"""The demo's planner: a :class:`TemplatePlanner` over the templates beside this module.

Latency goals get the six-step investigation of ``templates/payment_latency.json``; when the deploy
query finds no deploy, step 5 is revised to correlate latency with dependency health instead (step 6
unchanged), from ``templates/payment_latency_replan_deploys.json``.
"""

from __future__ import annotations

from pathlib import Path

from airflow_plan_provider.planners.template import PlanRule, ReplanRule, TemplatePlanner

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"

PAYMENT_LATENCY_PATTERN = (
    r"^(?=(?:.*?\b(?P<service>[a-z0-9]+(?:-[a-z0-9]+)*-(?:api|service|svc))\b)?)"
    r"(?=(?:.*?\b(?P<day>yesterday|today|\d{4}-\d{2}-\d{2})\b)?)"
    r".*?\b(?:slow|slower|slowness|latency)\b"
)


def payment_latency_planner() -> TemplatePlanner:
    """Plans latency investigations; replans when the deploy query finds no deploy."""
    return TemplatePlanner(
        rules=[
            PlanRule(
                PAYMENT_LATENCY_PATTERN,
                "payment_latency.json",
                defaults={"service": "payment-api", "day": "yesterday"},
            )
        ],
        replan_rules=[
            ReplanRule("payment_latency_replan_deploys.json", when_tool="query_deploys"),
            # The failed node named in the request may be another one (say the error logs) while the
            # deploy query's request is only in the error text.
            ReplanRule("payment_latency_replan_deploys.json", when_error=r"\bno deploys of "),
        ],
        template_dir=TEMPLATE_DIR,
    )
