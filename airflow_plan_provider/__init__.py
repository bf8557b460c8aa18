"""airflow-plan-provider: turn a goal into a validated plan and run it as Airflow tasks.

Public names are loaded lazily, so provider discovery and the pure plan core stay cheap and never
import Airflow unless an Airflow-facing name is used. The ``TYPE_CHECKING`` imports below name the same
objects for type checkers, which do not follow ``__getattr__``: every name in ``_EXPORTS`` is imported
there too (tests/unit/test_public_surface.py keeps the two lists equal).

An Airflow older than the oldest supported one is refused on import, with one line naming the minimum
(:func:`~airflow_plan_provider.airflow_features.require_supported_airflow`; Airflow is not imported).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from airflow_plan_provider.airflow_features import require_supported_airflow

require_supported_airflow()

if TYPE_CHECKING:
    from airflow_plan_provider.dag_factory import PlanTaskGroup, build_plan_dag, plan_task_group
    from airflow_plan_provider.exceptions import (
        PermanentToolError,
        PlanningError,
        PlanProviderError,
        PlanValidationError,
        ReplanRequested,
        ToolSourceError,
        TransientToolError,
    )
    from airflow_plan_provider.plan.budgets import Budgets
    from airflow_plan_provider.plan.merge import PlanDiff, merge_replan, plan_diff
    from airflow_plan_provider.plan.model import Edge, Node, Plan, ValidatedPlan
    from airflow_plan_provider.plan.result import SessionResult
    from airflow_plan_provider.plan.validate import Limits, validate_plan
    from airflow_plan_provider.planners.base import Planner, PlanRequest
    from airflow_plan_provider.problems import Problem
    from airflow_plan_provider.settings import ApprovalPolicy, ArtifactStore, ControlRetries, NodeExecution
    from airflow_plan_provider.tools.common_ai import common_ai_tools
    from airflow_plan_provider.tools.http import http_tool
    from airflow_plan_provider.tools.mcp import McpServer
    from airflow_plan_provider.tools.registry import ToolRegistry
    from airflow_plan_provider.tools.sql import sql_tool
    from airflow_plan_provider.tools.tool import Tool, ToolContext, ToolOrigin

__version__ = "0.1.0"

_EXPORTS = {
    "ApprovalPolicy": "airflow_plan_provider.settings",
    "ArtifactStore": "airflow_plan_provider.settings",
    "Budgets": "airflow_plan_provider.plan.budgets",
    "ControlRetries": "airflow_plan_provider.settings",
    "Edge": "airflow_plan_provider.plan.model",
    "Limits": "airflow_plan_provider.plan.validate",
    "McpServer": "airflow_plan_provider.tools.mcp",
    "Node": "airflow_plan_provider.plan.model",
    "NodeExecution": "airflow_plan_provider.settings",
    "PermanentToolError": "airflow_plan_provider.exceptions",
    "Plan": "airflow_plan_provider.plan.model",
    "PlanDiff": "airflow_plan_provider.plan.merge",
    "PlanProviderError": "airflow_plan_provider.exceptions",
    "PlanRequest": "airflow_plan_provider.planners.base",
    "PlanTaskGroup": "airflow_plan_provider.dag_factory",
    "PlanValidationError": "airflow_plan_provider.exceptions",
    "Planner": "airflow_plan_provider.planners.base",
    "PlanningError": "airflow_plan_provider.exceptions",
    "Problem": "airflow_plan_provider.problems",
    "ReplanRequested": "airflow_plan_provider.exceptions",
    "SessionResult": "airflow_plan_provider.plan.result",
    "Tool": "airflow_plan_provider.tools.tool",
    "ToolContext": "airflow_plan_provider.tools.tool",
    "ToolOrigin": "airflow_plan_provider.tools.tool",
    "ToolRegistry": "airflow_plan_provider.tools.registry",
    "ToolSourceError": "airflow_plan_provider.exceptions",
    "TransientToolError": "airflow_plan_provider.exceptions",
    "ValidatedPlan": "airflow_plan_provider.plan.model",
    "build_plan_dag": "airflow_plan_provider.dag_factory",
    "common_ai_tools": "airflow_plan_provider.tools.common_ai",
    "http_tool": "airflow_plan_provider.tools.http",
    "merge_replan": "airflow_plan_provider.plan.merge",
    "plan_diff": "airflow_plan_provider.plan.merge",
    "plan_task_group": "airflow_plan_provider.dag_factory",
    "sql_tool": "airflow_plan_provider.tools.sql",
    "validate_plan": "airflow_plan_provider.plan.validate",
}

__all__ = [
    "ApprovalPolicy",
    "ArtifactStore",
    "Budgets",
    "ControlRetries",
    "Edge",
    "Limits",
    "McpServer",
    "Node",
    "NodeExecution",
    "PermanentToolError",
    "Plan",
    "PlanDiff",
    "PlanProviderError",
    "PlanRequest",
    "PlanTaskGroup",
    "PlanValidationError",
    "Planner",
    "PlanningError",
    "Problem",
    "ReplanRequested",
    "SessionResult",
    "Tool",
    "ToolContext",
    "ToolOrigin",
    "ToolRegistry",
    "ToolSourceError",
    "TransientToolError",
    "ValidatedPlan",
    "build_plan_dag",
    "common_ai_tools",
    "http_tool",
    "merge_replan",
    "plan_diff",
    "plan_task_group",
    "sql_tool",
    "validate_plan",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'airflow_plan_provider' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
