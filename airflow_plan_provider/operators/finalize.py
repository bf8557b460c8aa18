"""The finalize task: collect node records, decide done / replan / give up, and make the run's state true."""

from __future__ import annotations

from typing import Any, NoReturn

from airflow.sdk import BaseOperator
from airflow.sdk.bases.skipmixin import SkipMixin
from airflow.sdk.exceptions import AirflowFailException

from airflow_plan_provider.operators._xcom import (
    PLAN_TASK,
    PLANNING_ERROR_KEY,
    REPLAN_CONF_KEY,
    REPLAN_TASK,
    RESULT_KEY,
    pull_layer_records,
    pull_plan,
    pull_session,
)
from airflow_plan_provider.plan.model import ValidatedPlan
from airflow_plan_provider.plan.result import Event, NodeRecord, SessionResult
from airflow_plan_provider.plan.session import SessionState, conclude, lock_successes

NO_REPORT = "the node's task ended without reporting (killed, timed out, or its layer never ran)"


def collect_records(
    ti: Any, plan: ValidatedPlan, state: SessionState
) -> tuple[dict[str, NodeRecord], dict[str, Any]]:
    """Every node's record, and the outputs of the nodes that succeeded (the tools' data; a stored
    output is known by its record's ``artifact``)."""
    records: dict[str, NodeRecord] = {}
    outputs: dict[str, Any] = {}
    reported = pull_layer_records(ti, plan, state.eager)
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


def _shown_output(record: NodeRecord, output: Any) -> Any:
    """A node's output as the SessionResult shows it: a stored output by its reference."""
    return record.artifact.model_dump() if record.artifact is not None else output


class FinalizePlanOperator(BaseOperator, SkipMixin):
    """Return the :class:`SessionResult` of the run, or hand over to the replan task.

    Completed: returns the result (XCom ``return_value``) and skips the replan task. Failed (the plan
    could not be made, a node failed with no replan left, or a budget is spent): pushes the result, then
    fails, so the DAG run is failed too. Replan due: pushes the next run's conf and lets ``replan`` run.
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
            error = ti.xcom_pull(task_ids=PLAN_TASK, key=PLANNING_ERROR_KEY) or {}
            reason: Any = error.get("reason", "no_plan")
            reason = "replan_failed" if state.revision > 0 and reason == "invalid_plan" else reason
            result = state.result("failed", reason, error.get("message", "planning did not finish"))
            self._fail(ti, result)

        records, outputs = collect_records(ti, plan, state)
        executed = [r for r in records.values() if not r.reused and r.status != "skipped"]
        state.usage.steps += len(executed)
        state.history.extend(records.values())
        for record in records.values():
            if record.polling:
                state.event("node.polling", record.node_id, tool=record.tool, **record.polling)
            kind: str = "reused" if record.reused else record.status
            kind = "replan_requested" if record.replan_requested else kind
            state.event(
                f"node.{kind}",
                record.node_id,
                tool=record.tool,
                attempts=record.attempts,
                error=record.error,
                missing_inputs=record.missing_inputs,
            )
        lock_successes(plan, records, outputs, state)
        conclusion = conclude(plan, records, state)
        final_outputs = {n: _shown_output(records[n], outputs[n]) for n in plan.node_ids if n in outputs}
        self.log.info("run concludes: %s (%s) %s", conclusion.kind, conclusion.reason, conclusion.message)

        if conclusion.kind == "replan" and self.replan_task_id:
            state.usage.replans += 1
            state.revision += 1
            state.parent_run_id = ti.run_id
            state.failed, state.replan_requested = conclusion.failed, conclusion.replan_requested
            state.last_error = conclusion.message
            state.event("session.replan", reason=conclusion.reason, message=conclusion.message)
            ti.xcom_push(
                key=REPLAN_CONF_KEY, value={"goal": state.goal, "session": state.model_dump(mode="json")}
            )
            partial = state.result(
                "failed", "node_failed", f"replanning: {conclusion.message}", final_outputs
            )
            ti.xcom_push(key=RESULT_KEY, value=partial.model_dump(mode="json"))
            return None  # the replan task runs next and reports the chain's outcome

        if conclusion.kind == "done":
            result = state.result("completed", "goal_met", conclusion.message, final_outputs)
            result.events.append(
                Event(type="session.finished", revision=state.revision, data={"status": "completed"})
            )
            self.log.info("%s", result.summary_text())
            payload = result.model_dump(mode="json")
            ti.xcom_push(key=RESULT_KEY, value=payload)
            self._skip_replan(ti)
            return payload

        final_reason: Any = "node_failed" if conclusion.kind == "replan" else conclusion.reason
        self._fail(ti, state.result("failed", final_reason, conclusion.message, final_outputs))

    def _skip_replan(self, ti: Any) -> None:
        if self.replan_task_id and self.downstream_task_ids:
            self.skip_all_except(ti, None)

    def _fail(self, ti: Any, result: SessionResult) -> NoReturn:
        result.events.append(
            Event(type="session.finished", data={"status": "failed", "reason": result.reason})
        )
        self.log.error("%s", result.summary_text())
        ti.xcom_push(key=RESULT_KEY, value=result.model_dump(mode="json"))
        raise AirflowFailException(f"plan session failed ({result.reason}): {result.message}")
