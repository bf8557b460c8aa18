"""The Airflow plugin of the plan view: a "Plan" tab on every DAG run's page, served by the API server.

The plugin also registers the plan DAGs' weight rule
(:class:`~airflow_plan_provider.sessions_in_turn.SessionsInTurn`: sessions sharing slots finish in
turn), gives the run type of a replan run a label in the UI
(:class:`~airflow_plan_provider.compat.RunTypeLabels`), and in a scheduler whose LocalExecutor forks
the task processes it imports what a plan DAG's tasks need, once, before any task starts
(:mod:`airflow_plan_provider.preload`).

The tab is an external view (``destination: "dag_run"``): the UI shows the plan view of the run in a
frame, with ``{DAG_ID}`` and ``{RUN_ID}`` filled in. The FastAPI app behind it is built only when the API
server asks for it, so the other components that load plugins (scheduler, workers) do not import it.
"""

from __future__ import annotations

from functools import cache
from typing import Any
from urllib.parse import urlsplit

from airflow.plugins_manager import AirflowPlugin

from airflow_plan_provider.plugins.routes import URL_PREFIX, URL_ROUTE
from airflow_plan_provider.sessions_in_turn import SessionsInTurn


@cache
def _fastapi_apps() -> list[dict[str, Any]]:
    from airflow_plan_provider.plugins.app import create_app

    return [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "Plan view"}]


def _root_path() -> str:
    """The path the API server is served under (``[api] base_url``), for the frame's address."""
    from airflow.configuration import conf

    return urlsplit(conf.get("api", "base_url", fallback="") or "").path.rstrip("/")


class PlanViewPlugin(AirflowPlugin):
    """The plan view: the plan graph of a run by layers, its revisions and diffs, and each node's record."""

    name = "plan_view"
    priority_weight_strategies = [SessionsInTurn]

    @classmethod
    def on_load(cls, *args: Any, **kwargs: Any) -> None:
        """In a scheduler whose LocalExecutor forks the task processes, import what they need
        (:mod:`airflow_plan_provider.preload`)."""
        from airflow_plan_provider.preload import preload_for_task_processes

        preload_for_task_processes()

    @property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return _fastapi_apps()

    @property
    def fastapi_root_middlewares(self) -> list[dict[str, Any]]:  # type: ignore[override]
        from airflow_plan_provider.compat import RunTypeLabels

        return [{"middleware": RunTypeLabels, "name": "Run type labels"}]

    @property
    def external_views(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return [
            {
                "name": "Plan",
                "href": f"{_root_path()}{URL_PREFIX}/dags/{{DAG_ID}}/runs/{{RUN_ID}}",
                "destination": "dag_run",
                "url_route": URL_ROUTE,
            }
        ]
