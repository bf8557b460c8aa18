"""The replan task: start the next revision as a new run of the same DAG and wait for it, deferred.

Retry-safe: the next revision's run id is fixed
(:func:`~airflow_plan_provider.plan.session.replan_run_id`), so a try that finds that run already there
(an earlier try started it, then its worker was lost) waits for it instead of starting it again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.providers.standard.operators.trigger_dagrun import XCOM_RUN_ID, TriggerDagRunOperator
from airflow.providers.standard.triggers.external_task import DagStateTrigger

from airflow_plan_provider.airflow_features import AirflowFailException, AirflowSkipException
from airflow_plan_provider.contract import (
    FINALIZE_TASK,
    REPLAN_CONF_KEY,
    RESULT_KEY,
    ReplanConf,
    session_outcome,
)
from airflow_plan_provider.exceptions import TriggerEventError
from airflow_plan_provider.plan.session import replan_run_id
from airflow_plan_provider.triggers.payloads import validate_dag_state_event

if TYPE_CHECKING:
    from airflow.sdk import Context


class ReplanOperator(TriggerDagRunOperator):
    """Trigger the replan run prepared by finalize, wait for it without holding a worker slot, and
    report the outcome of the whole chain (XCom ``return_value``); fail when the chain failed.

    Skips itself when finalize prepared no replan. When the run already exists (a retry after the
    worker of an earlier try was lost), it is not triggered again: the task waits for it (deferred, as
    after a trigger) or, when it has finished, reports its outcome at once.

    :param trigger_dag_id: the id of the plan DAG this task belongs to: a replan run is a run of the same
        DAG. Given when the DAG is built, because Airflow's "Triggered DAG" link on this task reads it from
        the task as parsed (a deferred task resumes in a new process, without anything ``execute`` set).
    :param poke_interval: seconds between two checks of the replan run's state while deferred.
    :param kwargs: passed on to the standard provider's ``TriggerDagRunOperator`` (and
        :class:`~airflow.sdk.BaseOperator`); the arguments that make it wait, deferred, are set here.
    """

    ui_color = "#f7e1f5"

    def __init__(self, *, trigger_dag_id: str, poke_interval: int = 2, **kwargs: Any) -> None:
        super().__init__(
            trigger_dag_id=trigger_dag_id,
            wait_for_completion=True,
            deferrable=True,
            poke_interval=poke_interval,
            logical_date=None,
            openlineage_inject_parent_info=False,
            **kwargs,
        )

    def execute(self, context: Context) -> dict[str, Any] | None:
        ti = context["ti"]
        conf = ti.xcom_pull(task_ids=FINALIZE_TASK, key=REPLAN_CONF_KEY)
        if not conf:
            raise AirflowSkipException("no replan was prepared")
        prepared = ReplanConf.model_validate(conf)
        session = prepared.state
        if self.trigger_dag_id != ti.dag_id:
            raise AirflowFailException(
                f"replan task {ti.task_id!r} has trigger_dag_id {self.trigger_dag_id!r}; a replan run is "
                f"a run of the same DAG, {ti.dag_id!r}"
            )
        self.conf = prepared.run_conf()  # names the session; its run reads it from finalize's XCom
        self.trigger_run_id = replan_run_id(session.root_run_id, session.revision)
        self.note = f"revision {session.revision} of {session.root_run_id} (parent {ti.run_id})"
        if ti.get_dr_count(dag_id=ti.dag_id, run_ids=[self.trigger_run_id]) > 0:
            return self._wait_for_existing(context, self.trigger_run_id)
        self.log.info("starting revision %s as run %s", session.revision, self.trigger_run_id)
        super().execute(context)
        return None

    def _wait_for_existing(self, context: Context, run_id: str) -> dict[str, Any] | None:
        """Wait for the revision's run an earlier try started, instead of triggering it again."""
        ti = context["ti"]
        ti.xcom_push(key=XCOM_RUN_ID, value=run_id)  # as after a trigger: the task's link to the run
        state = ti.get_dagrun_state(dag_id=ti.dag_id, run_id=run_id)
        self.log.info("run %s of this revision already exists (%s); not starting it again", run_id, state)
        if state in self.allowed_states or state in self.failed_states:
            return self.execute_complete(context, ("", {"run_ids": [run_id], run_id: state}))
        self.defer(
            trigger=DagStateTrigger(
                dag_id=ti.dag_id,
                states=[*self.allowed_states, *self.failed_states],
                execution_dates=None,
                run_ids=[run_id],
                poll_interval=self.poke_interval,
            ),
            method_name="execute_complete",
        )

    def execute_complete(self, context: Context, event: tuple[str, dict[str, Any]]) -> dict[str, Any]:
        """Report the outcome of the replan run named in ``event`` (a ``DagStateTrigger`` event)."""
        try:
            child, state = validate_dag_state_event(event)
        except TriggerEventError as error:
            raise AirflowFailException(f"task {self.task_id!r}: {error}") from error
        ti = context["ti"]
        # Pulls without map_indexes read every map index of the (unmapped) task: a missing value is then
        # None, where a single-index pull is a 404 the Task SDK logs at error level.
        result = session_outcome(
            lambda task_id: ti.xcom_pull(task_ids=task_id, dag_id=ti.dag_id, run_id=child, key=RESULT_KEY)
        )
        if result is None:
            raise AirflowFailException(f"replan run {child} ended ({state}) without a result")
        self.log.info("session ended %s (%s) after run %s", result.status, result.reason, child)
        payload = result.model_dump(mode="json")
        if result.status != "completed":
            ti.xcom_push(key=RESULT_KEY, value=payload)
            raise AirflowFailException(f"plan session failed ({result.reason}): {result.message}")
        return payload
