"""The finalize task: collect node records, decide done / replan / give up, and make the run's state true."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NoReturn

from airflow.sdk import BaseOperator

from airflow_plan_provider.airflow_features import AirflowFailException, SkipMixin
from airflow_plan_provider.contract import (
    APPROVE_TASK,
    PLAN_TASK,
    PLANNING_ERROR_KEY,
    REPLAN_CONF_KEY,
    REPLAN_TASK,
    RESULT_KEY,
    PlanningErrorRecord,
)
from airflow_plan_provider.operators._telemetry import emit
from airflow_plan_provider.operators.layout import (
    has_task,
    pull_node_records,
    pull_plan,
    pull_session,
    task_id_in,
)
from airflow_plan_provider.plan.decisions import NodeStatus
from airflow_plan_provider.plan.model import ValidatedPlan
from airflow_plan_provider.plan.result import NodeRecord, SessionResult
from airflow_plan_provider.plan.session import (
    SessionState,
    record_node_outcomes,
    replan_conf,
    run_context,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_plan_provider.plan.conclusion import Conclusion

NO_REPORT = "the node's task ended without reporting (killed, timed out, or its task never ran)"


def collect_records(ti: Any, plan: ValidatedPlan, state: SessionState) -> dict[str, NodeRecord]:
    """Every node's record; a node whose task never reported counts as failed."""
    reported = pull_node_records(ti, plan, run_context(state))
    return {
        node.id: reported.get(node.id)
        or NodeRecord(
            node_id=node.id,
            revision=state.revision,
            action=node.action,
            tool=node.tool,
            status=NodeStatus.FAILED,
            error=NO_REPORT,
        )
        for node in plan.nodes
    }


def shown_outputs(plan: ValidatedPlan, records: dict[str, NodeRecord]) -> dict[str, Any]:
    """The succeeded nodes' outputs as the SessionResult shows them: a stored output by its reference."""
    return {n: _shown(records[n]) for n in plan.node_ids if records[n].status is NodeStatus.SUCCESS}


def _shown(record: NodeRecord) -> Any:
    return record.artifact.model_dump() if record.artifact is not None else record.output


class FinalizePlanOperator(BaseOperator, SkipMixin):
    """Publish the :class:`SessionResult` of the run (XCom ``return_value``), or hand over to the replan task.

    Completed: pushes the result (XCom ``return_value``) and skips the replan task. Failed (the plan
    could not be made, a node failed with no replan left, or a budget is spent): pushes the result, then
    fails, so the DAG run is failed too. Replan due: pushes the next run's conf, and a result with status
    ``replanned`` saying which node asked for the replan and why, and lets ``replan`` run (its
    ``return_value`` is then the session's outcome).

    :param replan_task_id: the replan task this task skips when no replan is due; ``None`` when the DAG
        has none (``replan`` off).
    :param kwargs: passed on to :class:`~airflow.sdk.BaseOperator`.
    """

    ui_color = "#fbe7d9"

    def __init__(self, *, replan_task_id: str | None = REPLAN_TASK, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.replan_task_id = replan_task_id

    def execute(self, context: Context) -> None:
        # imported here, not by the DAG file every node task parses
        from airflow_plan_provider.plan.conclusion import conclude

        ti = context["ti"]
        state = pull_session(ti)
        plan = self._plan_or_fail(ti, state)
        state = self._answered(ti, state)
        records = collect_records(ti, plan, state)
        recorded = record_node_outcomes(state, plan, records)
        # the node tasks logged their own events; finalize logs the rest
        self._publish(state, recorded, logged=sum(len(r.events) for r in records.values()))
        state = recorded
        conclusion = conclude(plan, records, state)
        outputs = shown_outputs(plan, records)
        self.log.info("run concludes: %s (%s) %s", conclusion.kind, conclusion.reason, conclusion.message)
        if conclusion.kind == "replan" and self.replan_task_id:
            self._hand_over(ti, state, conclusion, records, outputs)
        else:
            self._finish(ti, state, conclusion, outputs)

    def _plan_or_fail(self, ti: Any, state: SessionState) -> ValidatedPlan:
        """The run's plan; without one, fail the session with why planning failed."""
        from airflow_plan_provider.plan.conclusion import fail_session

        plan = pull_plan(ti)
        if plan is None:
            raw = ti.xcom_pull(task_ids=task_id_in(ti, PLAN_TASK), key=PLANNING_ERROR_KEY)
            error = PlanningErrorRecord.model_validate(raw or {"message": "planning did not finish"})
            reason: Any = error.reason
            reason = "replan_failed" if state.revision > 0 and reason == "invalid_plan" else reason
            self._fail(ti, state, *fail_session(state, reason, error.message))
        return plan

    def _answered(self, ti: Any, state: SessionState) -> SessionState:
        """The session with the approval's answer recorded, when the DAG asks for approval; a rejection
        fails the session (no node ran)."""
        from airflow_plan_provider.plan.conclusion import fail_session

        answered, approval = state, None
        if has_task(ti, APPROVE_TASK):  # the DAG asks for approval
            from airflow_plan_provider.operators.approval import record_answer

            answered, approval = record_answer(ti, state)
        if approval is not None and approval.status == "rejected":  # no node ran
            message = f"the plan was not approved: {approval.message}"
            self._fail(ti, state, *fail_session(answered, "rejected", message))
        self._publish(state, answered)  # the answer, as an event (the approve task logged it as text)
        return answered

    def _hand_over(
        self,
        ti: Any,
        state: SessionState,
        conclusion: Conclusion,
        records: Mapping[str, NodeRecord],
        outputs: dict[str, Any],
    ) -> None:
        """Prepare the replan: the next revision's session for the replan task, and this run's result
        (``replanned``). The replan task runs next and reports the chain's outcome."""
        from airflow_plan_provider.plan.conclusion import prepare_replan

        result, following = prepare_replan(state, conclusion, records, outputs)
        self._publish(state, following)
        ti.xcom_push(key=REPLAN_CONF_KEY, value=replan_conf(following))
        self.log.info("%s", result.summary_text())
        ti.xcom_push(key=RESULT_KEY, value=result.model_dump(mode="json"))

    def _finish(self, ti: Any, state: SessionState, conclusion: Conclusion, outputs: dict[str, Any]) -> None:
        """End the session: push its result (failing the task when it did not complete) and skip the
        replan task."""
        from airflow_plan_provider.plan.conclusion import finish_session

        finished, result = finish_session(state, conclusion, outputs)
        if result.status != "completed":
            self._fail(ti, state, finished, result)
        self._publish(state, finished)
        self.log.info("%s", result.summary_text())
        ti.xcom_push(key=RESULT_KEY, value=result.model_dump(mode="json"))
        self._skip_replan(ti)  # ends the try (Airflow's skip of the replan task), so pushed before
        # nothing returned: a return value would push the result a second time

    def _publish(self, before: SessionState, after: SessionState, logged: int = 0) -> None:
        """Log (and count) the events added to the session since ``before``, but the first ``logged``."""
        for event in after.events[len(before.events) + logged :]:
            emit(self.log, event)

    def _skip_replan(self, ti: Any) -> None:
        if self.replan_task_id and self.downstream_task_ids:
            self.skip_all_except(ti, None)

    def _fail(self, ti: Any, before: SessionState, after: SessionState, result: SessionResult) -> NoReturn:
        self._publish(before, after)
        self.log.error("%s", result.summary_text())
        ti.xcom_push(key=RESULT_KEY, value=result.model_dump(mode="json"))
        raise AirflowFailException(f"plan session failed ({result.reason}): {result.message}")
