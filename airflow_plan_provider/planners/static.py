"""A planner that returns a ready-made plan: for DAGs whose plan is written by hand or by another system."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_plan_provider.plan.model import Plan
from airflow_plan_provider.planners.base import PlanRequest


class StaticPlanner:
    """Returns the plan it was given, else ``request.conf["plan"]`` (a plan, dict or JSON text).

    It returns ``None`` (no plan) when it has neither, and for every replan: a fixed plan has no
    alternative to offer for the part that failed.

    :param plan: the plan to return, as a :class:`~airflow_plan_provider.plan.model.Plan`, a dict or
        JSON text; ``None`` to take each run's ``conf["plan"]``.
    """

    def __init__(self, plan: Plan | Mapping[str, Any] | str | None = None) -> None:
        self._plan = plan

    def plan(self, request: PlanRequest) -> Plan | Mapping[str, Any] | str | None:
        """The fixed plan for a fresh request; ``None`` for a replan or when no plan is known."""
        if request.is_replan:
            return None
        if self._plan is not None:
            return self._plan
        return request.conf.get("plan") if request.conf else None
