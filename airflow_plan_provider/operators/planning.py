"""The planning task: ask the planner, validate (repairing while allowed), publish the plan and layers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from airflow_plan_provider.exceptions import PlanningError, PlanValidationError
from airflow_plan_provider.operators._xcom import PLAN_KEY, PLANNING_ERROR_KEY, SESSION_KEY, eager_order
from airflow_plan_provider.plan.budgets import Budgets
from airflow_plan_provider.plan.model import Plan, ValidatedPlan
from airflow_plan_provider.plan.replan import merge_replan, plan_diff
from airflow_plan_provider.plan.result import Revision
from airflow_plan_provider.plan.session import SessionState, statuses_of
from airflow_plan_provider.plan.state import affected_subgraph
from airflow_plan_provider.plan.validate import Limits, validate_plan
from airflow_plan_provider.planners.base import LockedNode, Planner, PlanRequest, plan_with_repairs
from airflow_plan_provider.planners.static import StaticPlanner
from airflow_plan_provider.tools.registry import ToolRegistry, load_tools


class PlanOperator(BaseOperator):
    """Plan (or replan) and validate; push the plan and session state; return the first layer's node ids.

    The run's conf (or the DAG's Params) gives ``goal``, optionally a ready ``plan`` (the planner is then
    skipped), ``max_steps`` and ``max_replans``. A replan run's conf carries ``session``: the state of the
    session so far, from which only the affected subgraph is planned again.
    An invalid plan fails this task with every problem in its log, and no node runs.
    """

    ui_color = "#d9e8fb"

    def __init__(
        self,
        *,
        planner: Planner | None,
        tools: ToolRegistry | str | None = None,
        limits: Limits | None = None,
        repair_attempts: int = 2,
        eager: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.eager = eager
        self.planner = planner
        self.tools = tools
        self.limits = limits or Limits()
        self.repair_attempts = repair_attempts

    def execute(self, context: Any) -> list[str]:
        ti = context["ti"]
        run_id = context["run_id"]
        conf: Mapping[str, Any] = context["dag_run"].conf or {}
        params: Mapping[str, Any] = {**(context.get("params") or {}), **conf}
        # what the planner sees of the conf: never the session state (outputs) or a ready plan
        planner_conf = {k: v for k, v in params.items() if k not in ("session", "plan")}
        tools = load_tools(self.tools)
        state = self._session(conf, params, run_id)
        try:
            plan = self._plan(state, params, planner_conf, tools)
        except PlanningError as error:
            _record_usage(state, error.usage)
            for problem in error.problems:
                self.log.error("plan problem: %s", problem)
            state.event(
                "plan.failed",
                reason=error.reason,
                message=str(error).splitlines()[0],
                problems=[p.to_dict() for p in error.problems],
            )
            ti.xcom_push(key=SESSION_KEY, value=state.model_dump(mode="json"))
            ti.xcom_push(key=PLANNING_ERROR_KEY, value={"reason": error.reason, "message": str(error)})
            raise AirflowFailException(str(error)) from error

        state.current_plan = plan.as_plan().to_json_dict()
        state.execution_order = [n for layer in plan.layers for n in layer if n not in state.locked]
        self.log.info(
            "plan revision %s: %s nodes in %s layers %s",
            state.revision,
            len(plan.nodes),
            len(plan.layers),
            plan.layers,
        )
        ti.xcom_push(key=PLAN_KEY, value=plan.model_dump(mode="json", by_alias=True, exclude_none=True))
        ti.xcom_push(key=SESSION_KEY, value=state.model_dump(mode="json"))
        return eager_order(plan) if self.eager else plan.layers[0]

    def _session(self, conf: Mapping[str, Any], params: Mapping[str, Any], run_id: str) -> SessionState:
        if conf.get("session"):
            state = SessionState.model_validate(conf["session"])
        else:
            budgets = Budgets(
                max_steps=int(params.get("max_steps") or Budgets().max_steps),
                max_replans=int(params["max_replans"])
                if params.get("max_replans") is not None
                else Budgets().max_replans,
            )
            state = SessionState(goal=str(params.get("goal") or ""), root_run_id=run_id, budgets=budgets)
        state.run_ids.append(run_id)
        state.eager = self.eager
        return state

    def _plan(
        self,
        state: SessionState,
        params: Mapping[str, Any],
        planner_conf: Mapping[str, Any],
        tools: ToolRegistry,
    ) -> ValidatedPlan:
        limits = self.limits
        if state.current_plan is None:
            planner: Planner | None = StaticPlanner(params["plan"]) if params.get("plan") else self.planner
            if planner is None:
                raise PlanningError("no planner configured and no plan given in the run's conf")
            request = PlanRequest(goal=state.goal, tools=tools, limits=limits, conf=dict(planner_conf))
            outcome = plan_with_repairs(
                planner,
                request,
                lambda raw: validate_plan(raw, tools, limits),
                repair_attempts=self.repair_attempts,
            )
            state.event(
                "plan.created",
                nodes=len(outcome.plan.nodes),
                layers=outcome.plan.layers,
                attempts=outcome.attempts,
                rejected=outcome.rejected,
            )
        else:
            if self.planner is None:
                raise PlanningError("replanning needs a planner; none is configured", reason="no_plan")
            current = validate_plan(state.current_plan)
            outcome = plan_with_repairs(
                self.planner,
                self._replan_request(state, current, planner_conf, tools),
                lambda raw: validate_plan(merge_replan(current, raw, state.locked)[0], tools, limits),
                repair_attempts=self.repair_attempts,
            )
            diff = plan_diff(current, outcome.plan)
            state.revisions.append(
                Revision(
                    revision=state.revision,
                    run_id=state.run_ids[-1],
                    reason=state.last_error or "",
                    trigger_node=_trigger_node(state),
                    diff=diff,
                )
            )
            state.event(
                "plan.diff", **diff.model_dump(), attempts=outcome.attempts, rejected=outcome.rejected
            )
        _record_usage(state, outcome.usage)
        return outcome.plan

    def _replan_request(
        self,
        state: SessionState,
        current: ValidatedPlan,
        planner_conf: Mapping[str, Any],
        tools: ToolRegistry,
    ) -> PlanRequest:
        last = {r.node_id: r for r in state.history if r.revision == state.revision - 1}
        affected = affected_subgraph(current, statuses_of(last), state.failed, state.replan_requested)
        locked = tuple(
            LockedNode(id=n, action=lo.action, tool=lo.tool, summary=lo.summary)
            for n, lo in state.locked.items()
        )
        return PlanRequest(
            goal=state.goal,
            tools=tools,
            limits=self.limits,
            conf=dict(planner_conf),
            current_plan=Plan.model_validate(state.current_plan),
            locked=locked,
            failed_node=_trigger_node(state),
            last_error=state.last_error,
            affected=tuple(sorted(affected)),
            revision=state.revision,
        )


def _record_usage(state: SessionState, calls: list[dict[str, int]]) -> None:
    """Token usage of each planner call, in the session's usage and as events."""
    for usage in calls:
        state.usage.add_tokens(usage)
        state.event(
            "planner.usage",
            prompt_tokens=usage.get("prompt_tokens", 0),
            completion_tokens=usage.get("completion_tokens", 0),
        )


def _trigger_node(state: SessionState) -> str | None:
    """The node whose failure (or replan request) started this revision."""
    nodes = state.failed + state.replan_requested
    return nodes[0] if nodes else None


__all__ = ["PlanOperator", "PlanValidationError"]
