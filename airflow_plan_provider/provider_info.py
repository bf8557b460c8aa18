"""Provider metadata read by Airflow's providers manager (``airflow providers list``)."""

from __future__ import annotations

from typing import Any


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-plan-provider",
        "name": "Plan",
        "description": "Turns a goal into a validated plan of tool calls and runs it as Airflow tasks, "
        "with failure containment and local replanning.",
        "versions": ["0.1.0"],
        "hook-class-names": [],
        "connection-types": [
            {"hook-class-name": "airflow_plan_provider.hooks.llm.PlanLLMHook", "connection-type": "plan_llm"}
        ],
        "operators": [
            {
                "integration-name": "Plan",
                "python-modules": [
                    "airflow_plan_provider.operators.planning",
                    "airflow_plan_provider.operators.node",
                    "airflow_plan_provider.operators.finalize",
                    "airflow_plan_provider.operators.replan",
                ],
            }
        ],
        "integrations": [{"integration-name": "Plan", "tags": ["software"]}],
    }
