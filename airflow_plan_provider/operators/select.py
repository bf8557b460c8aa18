"""The select tasks of the pool lanes: return what one lane's node task maps over in a run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_plan_provider.airflow_features import AirflowSkipException
from airflow_plan_provider.contract import APPROVAL_KEY, approval_lets_nodes_run, mapped_values
from airflow_plan_provider.operators.layout import pull_plan, pull_run_context, task_id_in

if TYPE_CHECKING:
    from airflow.sdk import Context


class LaneSelectOperator(BaseOperator):
    """Return what the node task ``node_task`` (``nodes__<pool>``) maps over in this run
    (:func:`~airflow_plan_provider.contract.mapped_values`: its nodes' briefs, or their labels), in the
    plan's run order (see :func:`~airflow_plan_provider.contract.node_tasks`); empty when the plan has no
    node in that lane.

    Airflow expands a mapped task over another task's return value only, so each pool lane maps over a
    task of its own. Skips itself (so its node task is skipped) when planning failed, or when the DAG
    asks for approval (``approval_task_id``) and the plan was not approved.

    :param node_task: the task id of the lane's node task this select task feeds.
    :param approval_task_id: the approval task whose answer must let the nodes run, or ``None`` when the
        DAG asks for no approval.
    :param kwargs: passed on to :class:`~airflow.sdk.BaseOperator`.
    """

    ui_color = "#f0f0f0"

    def __init__(self, *, node_task: str, approval_task_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.node_task = node_task
        self.approval_task_id = approval_task_id

    def execute(self, context: Context) -> list[Any]:
        ti = context["ti"]
        plan = pull_plan(ti)
        if plan is None:
            raise AirflowSkipException("planning did not publish a plan")
        if self.approval_task_id and not approval_lets_nodes_run(
            ti.xcom_pull(task_ids=task_id_in(ti, self.approval_task_id), key=APPROVAL_KEY)
        ):
            raise AirflowSkipException("the plan was not approved")
        return mapped_values(plan, pull_run_context(ti), self.node_task)
