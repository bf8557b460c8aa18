"""The finalize task: collect node records, decide done / replan / give up, and make the run's state true."""

from __future__ import annotations

from typing import Any, Literal, NoReturn

from airflow.sdk import BaseOperator
from airflow.sdk.bases.skipmixin import SkipMixin
from airflow.sdk.exceptions import AirflowFailException

from airflow_plan_provider.operators._telemetry import emit
from airflow_plan_provider.operators.approval import record_approval_outcome
from airflow_plan_provider.operators.layout import (
    PLAN_TASK,
    PLANNING_ERROR_KEY,
    REPLAN_CONF_KEY,
    REPLAN_TASK,
    RESULT_KEY,
    pull_layer_records,
    pull_plan,
    pull_session,
    task_id_in,
)
from airflow_plan_provider.operators.replan import replan_run_id
from airflow_plan_provider.plan.events import NODE_OUTCOMES, in_order, make_event
from airflow_plan_provider.plan.model import ValidatedPlan
from airflow_plan_provider.plan.result import Event, NodeRecord, ReplanInfo, SessionResult
from airflow_plan_provider.plan.session import Conclusion, SessionState, conclude, lock_successes

NO_REPORT = "the node's task ended without reporting (killed, timed out, or its layer never ran)"


def collect_records(
    ti: Any, plan: ValidatedPlan, state: SessionState
) -> tuple[dict[str, NodeRecord], dict[str, Any]]:
    """Every node's record, and the outputs of the nodes that succeeded (the tools' data; a stored
    output is known by its record's ``artifact``)."""
    records: dict[str, NodeRecord] = {}
    outputs: dict[str, Any] = {}
    reported = pull_layer_records(ti, plan, state)
    for node in plan.nodes:
        raw = reported.get(node.id)
        if raw is None:
            raw = {
                "node_id": node.id,
                "revision": state.revision,
                "action": node.action,
                "tool": node.tool,
                "status": "failed",
                "error": NO_REPORT,
            }
        if raw.get("status") == "success":
            outputs[node.id] = raw.get("output")
        records[node.id] = NodeRecord.model_validate(
            {k: v for k, v in raw.items() if k in NodeRecord.model_fields}
        )
    return records, outputs


def node_events(records: dict[str, NodeRecord], state: SessionState) -> tuple[list[Event], list[Event]]:
    """The node events of this run: those the node tasks recorded (and logged), in order; and for each
    node whose task recorded none (it never reported) its outcome, to be recorded here."""
    reported = in_order(event for record in records.values() for event in record.events)
    unreported = []
    for record in records.values():
        if not record.events:
            kind = "node.reused" if record.reused else NODE_OUTCOMES[record.status]
            data = {"tool": record.tool, "attempt": record.attempts, "error": record.error}
            unreported.append(make_event(kind, state.source, record.node_id, **data))
    return reported, unreported


def _shown_output(record: NodeRecord, output: Any) -> Any:
    """A node's output as the SessionResult shows it: a stored output by its reference."""
    return record.artifact.model_dump() if record.artifact is not None else output


class FinalizePlanOperator(BaseOperator, SkipMixin):
    """Return the :class:`SessionResult` of the run, or hand over to the replan task.

    Completed: returns the result (XCom ``return_value``) and skips the replan task. Failed (the plan
    could not be made, a node failed with no replan left, or a budget is spent): pushes the result, then
    fails, so the DAG run is failed too. Replan due: pushes the next run's conf, and a result with status
    ``replanned`` saying which node asked for the replan and why, and lets ``replan`` run (its
    ``return_value`` is then the session's outcome).
    """

    ui_color = "#fbe7d9"

    def __init__(self, *, replan_task_id: str | None = REPLAN_TASK, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.replan_task_id = replan_task_id

    def execute(self, context: Any) -> dict[str, Any] | None:
        ti = context["ti"]
        state = pull_session(ti)
        plan = pull_plan(ti)
        if plan is None:
            error = ti.xcom_pull(task_ids=task_id_in(ti, PLAN_TASK), key=PLANNING_ERROR_KEY) or {}
            reason: Any = error.get("reason", "no_plan")
            reason = "replan_failed" if state.revision > 0 and reason == "invalid_plan" else reason
            self._fail(ti, state, len(state.events), reason, error.get("message", "planning did not finish"))

        before = len(state.events)
        approval = record_approval_outcome(ti, state)
        if approval is not None and approval.status == "rejected":  # no node ran
            self._fail(ti, state, before, "rejected", f"the plan was not approved: {approval.message}")
        self._publish(state, before)  # the answer, as an event (the approve task logged it as text)

        records, outputs = collect_records(ti, plan, state)
        executed = [r for r in records.values() if not r.reused and r.status != "skipped"]
        state.usage.steps += len(executed)
        state.history.extend(records.values())
        reported, unreported = node_events(records, state)
        state.events.extend(reported)
        since = len(state.events)  # the node tasks logged their own events; finalize logs the rest
        state.events.extend(unreported)
        lock_successes(plan, records, outputs, state)
        conclusion = conclude(plan, records, state)
        final_outputs = {n: _shown_output(records[n], outputs[n]) for n in plan.node_ids if n in outputs}
        self.log.info("run concludes: %s (%s) %s", conclusion.kind, conclusion.reason, conclusion.message)

        if conclusion.kind == "replan" and self.replan_task_id:
            self._replan(ti, state, since, conclusion, records, final_outputs)
            return None  # the replan task runs next and reports the chain's outcome

        if conclusion.kind == "done":
            result = self._finish(state, since, "completed", "goal_met", conclusion.message, final_outputs)
            self.log.info("%s", result.summary_text())
            payload = result.model_dump(mode="json")
            ti.xcom_push(key=RESULT_KEY, value=payload)
            self._skip_replan(ti)
            return payload

        final_reason: Any = "node_failed" if conclusion.kind == "replan" else conclusion.reason
        if final_reason in BUDGETS:
            budget, used, limit = BUDGETS[final_reason](state)
            state.event("budget.exhausted", budget=budget, used=used, limit=limit, message=conclusion.message)
        self._fail(ti, state, since, final_reason, conclusion.message, final_outputs)

    def _replan(
        self,
        ti: Any,
        state: SessionState,
        since: int,
        conclusion: Conclusion,
        records: dict[str, NodeRecord],
        outputs: dict[str, Any],
    ) -> None:
        """Prepare the next revision's conf, and report this run as ``replanned`` (which node, why)."""
        request = ReplanInfo(
            revision=state.revision + 1,
            run_id=replan_run_id(state.root_run_id, state.revision + 1),
            trigger_node=next(iter(conclusion.failed + conclusion.replan_requested), None),
            failed={n: records[n].error or "" for n in conclusion.failed},
            replan_requested={n: records[n].error or "" for n in conclusion.replan_requested},
        )
        state.event(
            "replan.requested",
            request.trigger_node,
            reason=conclusion.reason,
            message=conclusion.message,
            failed=request.failed,
            replan_requested=request.replan_requested,
            next_revision=request.revision,
            next_run_id=request.run_id,
        )
        reason: Any = conclusion.reason  # node_failed or replan_requested
        message = f"replanning: {conclusion.message}"
        result = state.result("replanned", reason, message, outputs, replan=request)
        self._publish(state, since)
        state.usage.replans += 1
        state.revision += 1
        state.parent_run_id = ti.run_id
        state.failed, state.replan_requested = conclusion.failed, conclusion.replan_requested
        state.last_error = conclusion.message
        conf = {"goal": state.goal, "session": state.model_dump(mode="json")}
        ti.xcom_push(key=REPLAN_CONF_KEY, value=conf)
        self.log.info("%s", result.summary_text())
        ti.xcom_push(key=RESULT_KEY, value=result.model_dump(mode="json"))

    def _finish(
        self,
        state: SessionState,
        since: int,
        status: Literal["completed", "failed"],
        reason: Any,
        message: str,
        outputs: dict[str, Any] | None = None,
    ) -> SessionResult:
        """The session's result, after its ``session.finished`` event; logs this task's events."""
        state.event("session.finished", status=status, reason=reason)
        self._publish(state, since)
        return state.result(status, reason, message, outputs)

    def _publish(self, state: SessionState, since: int) -> None:
        for event in state.events[since:]:
            emit(self.log, event)

    def _skip_replan(self, ti: Any) -> None:
        if self.replan_task_id and self.downstream_task_ids:
            self.skip_all_except(ti, None)

    def _fail(
        self,
        ti: Any,
        state: SessionState,
        since: int,
        reason: Any,
        message: str,
        outputs: dict[str, Any] | None = None,
    ) -> NoReturn:
        result = self._finish(state, since, "failed", reason, message, outputs)
        self.log.error("%s", result.summary_text())
        ti.xcom_push(key=RESULT_KEY, value=result.model_dump(mode="json"))
        raise AirflowFailException(f"plan session failed ({result.reason}): {result.message}")


BUDGETS = {  # give-up reason -> (budget, used, limit)
    "step_budget": lambda state: ("steps", state.usage.steps, state.budgets.max_steps),
    "replan_budget": lambda state: ("replans", state.usage.replans, state.budgets.max_replans),
}
