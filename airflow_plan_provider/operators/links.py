"""Extra links between the runs of one plan session, shown as buttons on a task's page in the Airflow UI.

The root run's ``replan`` task links to the run it started (Airflow's own "Triggered DAG" link, see
:class:`~airflow_plan_provider.operators.replan.ReplanOperator`); a replan run's ``plan`` task links back
to the run that started it with :class:`ParentRunLink`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey


class ParentRunLink(BaseOperatorLink):
    """The "Parent run" link: the run whose replan started this one (empty on a session's first run).

    Airflow computes the link on the worker when the task ends and keeps it as an XCom (a session's first
    run keeps none: its planning task drops the link when it has no parent); the planning task sets
    ``parent_run_id`` only from a session it verified, never from a conf taken on trust.
    """

    name = "Parent run"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        parent = getattr(operator, "parent_run_id", None)
        if not parent:
            return ""
        from airflow.utils.helpers import build_airflow_dagrun_url

        return build_airflow_dagrun_url(dag_id=ti_key.dag_id, run_id=parent)
