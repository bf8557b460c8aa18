"""The LLM planner's first request as the tool count grows: characters and estimated tokens, per form.

Builds registries of 10, 100, 500 (and more) tools shaped like an MCP server's (a name under a prefix, a
description of a few sentences, an object schema of three params) and prints, for each, the system prompt
(rules and catalog), the catalog's form (``full``: whole schemas; ``compact``: one line a tool; ``goal``:
the tools nearest the goal and a count of the rest), how many tools the catalog shows, and the size
against the budget (``CATALOG_BUDGET`` characters of catalog). Tokens are estimated at 4 characters each.

Run::

    PYTHONPATH=. .venv/bin/python bench/prompt_size.py [--counts 10 100 500 2000]
"""

from __future__ import annotations

import argparse

from airflow_plan_provider.plan.validate import Limits
from airflow_plan_provider.planners.base import PlanRequest
from airflow_plan_provider.planners.llm_prompt import build_messages
from airflow_plan_provider.tools.registry import CATALOG_BUDGET, ToolRegistry
from airflow_plan_provider.tools.tool import Tool

GOAL = "find why the refunds of the payment API were slow yesterday and write a report"
SUBJECTS = (
    "latency",
    "orders",
    "refunds",
    "deploys",
    "errors",
    "invoices",
    "tickets",
    "warehouse",
    "payments",
)


def registry(count: int) -> ToolRegistry:
    schema = {
        "type": "object",
        "properties": {
            "service": {"type": "string", "description": "the service, e.g. payment-api"},
            "day": {"type": "string", "description": "an ISO date, 'today' or 'yesterday'"},
            "limit": {"type": "integer", "minimum": 1, "maximum": 1000},
        },
        "required": ["service"],
    }
    tools = []
    for i in range(count):
        subject = SUBJECTS[i % len(SUBJECTS)]
        tools.append(
            Tool(
                name=f"server_{i // 50}.query_{subject}_{i}",
                description=f"Query the {subject} of a service for one day. Returns hourly rows with their "
                f"counts and percentiles. Backed by the {subject} mart, refreshed every 15 minutes.",
                func=lambda **_: None,
                args_schema=schema,
            )
        )
    return ToolRegistry(tools)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[10, 100, 500, 2000])
    args = parser.parse_args()
    print(f"catalog budget: {CATALOG_BUDGET} characters (~{CATALOG_BUDGET // 4} tokens)")
    print(f"{'tools':>6} {'form':>8} {'shown':>6} {'catalog chars':>14} {'prompt chars':>13} {'~tokens':>8}")
    for count in args.counts:
        tools = registry(count)
        catalog = tools.catalog_text(goal=GOAL)
        form = (
            "goal"
            if "more tools not shown" in catalog
            else "compact"
            if catalog.startswith("(compact")
            else "full"
        )
        shown = sum(1 for line in catalog.splitlines() if line.startswith("- "))
        request = PlanRequest(goal=GOAL, tools=tools, limits=Limits())
        prompt = sum(len(message["content"]) for message in build_messages(request))
        print(f"{count:>6} {form:>8} {shown:>6} {len(catalog):>14} {prompt:>13} {prompt // 4:>8}")


if __name__ == "__main__":
    main()
