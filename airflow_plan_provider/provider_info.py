"""Provider metadata read by Airflow's providers manager (``airflow providers list``)."""

from __future__ import annotations

from typing import Any

# The plan_llm connection form: host is the base URL, password the API key, extra names the model.
LLM_FIELD_BEHAVIOUR: dict[str, Any] = {
    "hidden-fields": ["login"],
    "relabeling": {"host": "Base URL", "schema": "Scheme", "password": "API key"},
    "placeholders": {
        "host": "https://api.openai.com/v1",
        "schema": "https (only used when Base URL has no scheme)",
        "port": "only used when Base URL has no scheme",
        "password": "sk-...",
        "extra": '{"model": "gpt-4o-mini"}',
    },
}
LLM_CONN_FIELDS: dict[str, Any] = {
    "model": {
        "label": "Model",
        "description": "The model the planner asks, e.g. gpt-4o-mini (stored as extra.model).",
        "schema": {"type": ["string", "null"], "examples": ["gpt-4o-mini", "gpt-4o", "llama3.1:8b"]},
    },
    "organization": {
        "label": "Organization",
        "description": "Optional OpenAI organization id, e.g. org-... (stored as extra.organization).",
        "schema": {"type": ["string", "null"]},
    },
    "project": {
        "label": "Project",
        "description": "Optional OpenAI project id, e.g. proj_... (stored as extra.project).",
        "schema": {"type": ["string", "null"]},
    },
}


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-plan-provider",
        "name": "Plan",
        "description": "Turns a goal into a validated plan of tool calls and runs it as Airflow tasks, "
        "with failure containment and local replanning.",
        "versions": ["0.1.0"],
        "hook-class-names": [],
        "connection-types": [
            {
                "hook-class-name": "airflow_plan_provider.hooks.llm.PlanLLMHook",
                "connection-type": "plan_llm",
                "hook-name": "Plan LLM (OpenAI-compatible)",
                # Airflow 3.2+'s connection form reads these from here, without importing the hook (3.1
                # asks the hook's get_ui_field_behaviour)
                "ui-field-behaviour": LLM_FIELD_BEHAVIOUR,
                "conn-fields": LLM_CONN_FIELDS,
            }
        ],
        "operators": [
            {
                "integration-name": "Plan",
                "python-modules": [
                    "airflow_plan_provider.operators.plan_task",
                    "airflow_plan_provider.operators.node",
                    "airflow_plan_provider.operators.finalize",
                    "airflow_plan_provider.operators.replan",
                ],
            }
        ],
        "integrations": [{"integration-name": "Plan", "tags": ["software"]}],
    }
