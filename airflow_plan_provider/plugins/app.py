"""The plan view's HTTP routes, mounted in the Airflow API server by :class:`~.plugin.PlanViewPlugin`.

``GET <prefix>/dags/{dag_id}/runs/{run_id}`` is the page (one static HTML document with inline script
and SVG); ``GET <prefix>/data/dags/{dag_id}/runs/{run_id}`` is the JSON it polls;
``GET <prefix>/dags/{dag_id}/runs/{run_id}/nodes/{node_id}/markdown`` is the Markdown document a node's
output carries (a report, :mod:`.document`). Each asks Airflow's auth manager for read access to the
DAG's runs, task instances and XComs, as the REST API does for the same data: no route answers without
it (401 without a token, 403 without the permissions).
"""

from __future__ import annotations

import json
import secrets
from functools import cache
from importlib.resources import files
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import FastAPI, HTTPException, Request, status
from fastapi.responses import HTMLResponse
from sqlalchemy.orm import Session

from airflow_plan_provider import compat
from airflow_plan_provider.compat import redact
from airflow_plan_provider.plugins.data import plan_view
from airflow_plan_provider.plugins.document import DOCUMENT_CSP, document_of, document_page
from airflow_plan_provider.plugins.routes import URL_PREFIX, URL_ROUTE
from airflow_plan_provider.plugins.store import load_chain, load_node_record

#: the API server's database session, given to the routes that read runs
DbSession = Annotated[Session, compat.api_server_session()]


def create_app() -> FastAPI:
    """The FastAPI app of the plan view (mounted at :data:`URL_PREFIX`); every route checks read access to
    the DAG's runs, task instances and XComs."""
    access = compat.dag_read_access()
    app = FastAPI(title="Plan view", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_api_route("/dags/{dag_id}/runs/{run_id}", page, response_class=HTMLResponse, dependencies=access)
    app.add_api_route("/data/dags/{dag_id}/runs/{run_id}", data, dependencies=access)
    app.add_api_route(
        "/dags/{dag_id}/runs/{run_id}/nodes/{node_id}/markdown",
        document,
        response_class=HTMLResponse,
        dependencies=access,
    )
    return app


def page(dag_id: str, run_id: str, request: Request) -> HTMLResponse:
    """The plan view's page: one static HTML document that polls :func:`data`."""
    view_base, _ui_base = _bases(request)
    group = request.query_params.get("group")
    data_url = f"{view_base}/data/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"
    config = {
        "dag_id": dag_id,
        "run_id": run_id,
        "data_url": data_url + (f"?group={quote(group, safe='')}" if group else ""),
    }
    nonce = secrets.token_urlsafe(16)
    html = _page_template().replace("__NONCE__", nonce).replace("__CONFIG__", _script_json(config))
    return HTMLResponse(
        html,
        headers={
            "Content-Security-Policy": (
                f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
                "connect-src 'self'; img-src 'self' data:; frame-ancestors 'self'; base-uri 'none'"
            ),
            "X-Content-Type-Options": "nosniff",
            "Cache-Control": "no-store",
        },
    )


def data(
    dag_id: str, run_id: str, request: Request, session: DbSession, group: str | None = None
) -> dict[str, Any]:
    """The session of run ``run_id``, as the page shows it (:func:`~.data.plan_view`)."""
    chain = load_chain(session, dag_id, run_id, group)
    if chain is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"DAG {dag_id!r} has no run {run_id!r}")
    view_base, ui_base = _bases(request)
    return plan_view(
        dag_id, run_id, chain, redact=redact, ui_base=ui_base, view_base=view_base, tab_route=URL_ROUTE
    )


def document(
    dag_id: str, run_id: str, node_id: str, request: Request, session: DbSession, group: str | None = None
) -> HTMLResponse:
    """The Markdown document node ``node_id``'s output carries, as a page."""
    record = load_node_record(session, dag_id, run_id, node_id, group)
    text = document_of((record or {}).get("output"))
    if text is None:
        missing = f"node {node_id!r} of run {run_id!r} of {dag_id!r} wrote no document"
        raise HTTPException(status.HTTP_404_NOT_FOUND, missing)
    view_base, _ui_base = _bases(request)
    page = document_page(
        redact(text),
        title=f"{dag_id} · {run_id} · node {node_id}",
        source=f"Written by node {node_id} of run {run_id} of DAG {dag_id}",
        back_url=f"{view_base}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}",
    )
    headers = {"Content-Security-Policy": DOCUMENT_CSP, "X-Content-Type-Options": "nosniff"}
    return HTMLResponse(page, headers={**headers, "Cache-Control": "no-store"})


def _bases(request: Request) -> tuple[str, str]:
    """The path of this app (its mount point under the API server's root path), and the UI's root path."""
    view_base = str(request.scope.get("root_path", "")).rstrip("/")
    if not view_base.endswith(URL_PREFIX):
        view_base += URL_PREFIX
    return view_base, view_base.removesuffix(URL_PREFIX)


def _script_json(value: Any) -> str:
    """JSON safe inside an HTML ``<script>`` element (no ``</script>``, no ``<!--``)."""
    return json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


@cache
def _page_template() -> str:
    return files("airflow_plan_provider.plugins").joinpath("plan_view.html").read_text(encoding="utf-8")
