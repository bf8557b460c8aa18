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
        from urllib.parse import urljoin

        from airflow_plan_provider.airflow_features import sdk_conf

        # the run's page in the UI, under the API server's public address, as Airflow's own links build it
        base = str(sdk_conf().get("api", "base_url", fallback="/"))
        return urljoin(base.rstrip("/") + "/", f"dags/{ti_key.dag_id}/runs/{parent}")
