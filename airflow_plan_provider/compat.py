"""What the provider uses of Airflow beyond its documented public API, in one place.

Secrets are masked through Airflow's public ``airflow.sdk.log`` (:func:`redact`, :func:`mask_secret`).
Airflow configures the Task SDK's masker from ``[core] sensitive_var_conn_names`` in every component,
the API server included, so the plan view redacts with the same field names as the workers.

Private Airflow names, and why: this module is the only place that imports them.

- ``airflow.sdk.definitions.dag._run_task`` (:func:`run_task_in_process`,
  :func:`wrap_in_process_task_runner`): ``dag.test()`` runs every task instance through it, and the
  in-process session runner (:mod:`airflow_plan_provider.testing.in_process`) must act before a replan
  task runs and run one task instance again. Airflow has no public way to do either. Guarded: without it
  both raise :class:`AirflowCompatError` naming the missing function; nothing outside the testing
  helpers needs it.
- ``airflow.sdk.execution_time.supervisor.InProcessTestSupervisor._handle_request``
  (:func:`hitl_trigger_requests_in_process`): where human-in-the-loop tasks defer to the standard
  provider's HITL trigger (no ``awaiting_input`` state, Airflow 3.1 and 3.2), ``dag.test()`` runs that
  trigger inline, but its in-process supervisor answers only a task's requests, not the trigger's
  "read the response record" and "write it" (only the triggerer's supervisor does): the trigger fails
  with no record to read. While active, the in-process supervisor answers those two as the triggerer
  does, through the same Execution API client calls. Guarded: without that class it does nothing (a
  ``dag.test()`` without it has no inline trigger supervisor to complete).
- ``airflow.sdk.execution_time.task_runner.SUPERVISOR_COMMS`` and
  ``airflow.sdk.execution_time.comms.SetRenderedMapIndex`` (:func:`send_rendered_map_index`): a node
  tells Airflow its label (``id · action``) while it runs, before its final state, which is the only
  message that carries it otherwise. Guarded: without either name it sends nothing and returns False
  (the label then comes with the final state).
- ``airflow.sdk.execution_time.lazy_sequence.LazyXComSequence`` (:func:`first_mapped_xcoms`): the XComs
  of a mapped task's first instances in one request, as Airflow reads a mapped task's return values.
  Guarded: without it, one ``xcom_pull`` per map index.
- ``airflow.sdk.execution_time.task_runner.RuntimeTaskInstance.get_task_states``
  (:func:`task_states_reader`): a trigger reads its run's task instance states through the triggerer's
  channel, as the standard provider's ``WorkflowTrigger`` does; a task reads them through its own
  instance (public). Guarded: without it the reader is None, and a waiting node's trigger wakes the node
  every poll interval to read its parents' states itself.
- ``airflow.models`` ``DagRun``, ``TaskInstance`` and ``XComModel`` (:func:`read_runs`,
  :func:`read_xcoms`, :func:`read_task_instances`, :func:`first_task_with_xcom`): the plan view's
  plugin runs in the API server and reads a session's runs from the metadata database in three queries
  (its REST API would take one request per run and key). Values are decoded as the REST API decodes them
  (``XComModel.deserialize_value``). Airflow 3.4 made ``XComModel`` a read-only view over its per-attempt
  store, whose ``map_index`` column is the instance's index in its region: the same queries read it.
  Guarded: a missing model raises :class:`AirflowCompatError` naming it, and the plan view answers 500
  with that message; no task depends on it.
- ``airflow.api_fastapi``'s ``SessionDep``, ``requires_access_dag`` and ``DagAccessEntity``
  (:func:`api_server_session`, :func:`dag_read_access`): the plan view's routes get the API server's
  database session and check the user's read access to the DAG's runs, task instances and XComs as the
  REST API's own routes do. Guarded: without them the plan view's app is not built (an
  :class:`AirflowCompatError` naming what is missing, in the API server's log); tasks do not use them.
- The UI's English translations, ``/static/i18n/locales/en/common.json`` with its ``runTypes`` labels
  (:class:`RunTypeLabels`): a replan run is started by a task, so Airflow gives it the run type
  ``operator_triggered``, which Airflow's UI has no label for (it shows the raw key
  ``runTypes.operator_triggered``). The plugin's middleware adds the label as the API server serves the
  file. Guarded: a file of another shape, or one with the label, is served unchanged.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Awaitable, Callable, Iterable, Iterator, MutableMapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, get_args

from airflow_plan_provider.exceptions import PlanProviderError

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


class AirflowCompatError(PlanProviderError):
    """The running Airflow lacks something the provider needs and has no fallback for."""


# ------------------------------------------------------------------------------------------ secrets


def redact(value: Any, name: str | None = None) -> Any:
    """``value`` with secrets masked (by value, and by ``name`` when it is a sensitive field name)."""
    # airflow.sdk.log has no __all__; apache-airflow-providers-common-compat hands out this same function
    from airflow.sdk.log import redact as airflow_redact  # type: ignore[attr-defined]

    return airflow_redact(value, name)


def mask_secret(secret: str, name: str | None = None) -> None:
    """Register ``secret`` with Airflow's secrets masker, so logs and rendered fields hide it."""
    from airflow.sdk.log import mask_secret as airflow_mask_secret

    airflow_mask_secret(secret, name)


# ------------------------------------------------------------------------------------- a running task


def send_rendered_map_index(label: str) -> bool:
    """Send the running task instance's rendered map index (its label in the grid) to Airflow now,
    rather than with its final state. Call it from the thread that runs the task: that thread owns the
    task's channel to its supervisor.

    :return: whether it was sent; False where this Airflow has no such message or the process no
        supervisor channel (the label then comes with the final state).
    """
    try:
        from airflow.sdk.execution_time.comms import SetRenderedMapIndex
        from airflow.sdk.execution_time.task_runner import SUPERVISOR_COMMS
    except ImportError:  # no such message, or no channel (set only in a task's process)
        return False
    SUPERVISOR_COMMS.send(SetRenderedMapIndex(rendered_map_index=label))
    return True


def first_mapped_xcoms(ti: Any, task_id: str, key: str, stop: int) -> list[Any]:
    """``key`` XComs of mapped task ``task_id`` in ``ti``'s run, by map index: where Airflow reads a
    mapped task's values lazily, the first ``stop`` values pushed, in one request; else the values of
    map indexes 0 to ``stop - 1``, one ``xcom_pull`` each (None for an instance that pushed none). Either
    way every value of those indexes that was pushed is in the list."""
    try:
        from airflow.sdk.definitions.xcom_arg import PlainXComArg
        from airflow.sdk.execution_time.lazy_sequence import LazyXComSequence
    except ImportError:
        return [ti.xcom_pull(task_ids=task_id, key=key, map_indexes=index) for index in range(stop)]
    source = PlainXComArg(ti.task.dag.get_task(task_id), key=key)
    return list(LazyXComSequence(xcom_arg=source, ti=ti)[:stop])


def task_states_reader() -> Callable[..., Any] | None:
    """Airflow's read of a run's task instance states from outside a task (a trigger): called with
    ``dag_id``, ``task_ids`` and ``run_ids``, it returns run id → ``<task id>_<map index>`` → state. None
    where this Airflow has no such read."""
    try:
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance
    except ImportError:
        return None
    read = getattr(RuntimeTaskInstance, "get_task_states", None)
    return read if callable(read) else None


# -------------------------------------------------------------------- the metadata database (API server)


def _models() -> tuple[Any, Any, Any]:
    try:
        from airflow.models.dagrun import DagRun
        from airflow.models.taskinstance import TaskInstance
        from airflow.models.xcom import XComModel
    except ImportError as error:
        raise AirflowCompatError(
            f"this Airflow's metadata models moved ({error}): the plan view cannot read runs"
        ) from error
    return DagRun, TaskInstance, XComModel


def read_runs(session: Session, dag_id: str, run_ids: Iterable[str]) -> list[dict[str, Any]]:
    """The runs of ``dag_id`` among ``run_ids`` that exist: their run id, state, start and end dates and
    note."""
    from sqlalchemy import select

    dag_run, _, _ = _models()
    query = select(dag_run).where(dag_run.dag_id == dag_id, dag_run.run_id.in_(list(run_ids)))
    return [
        {
            "run_id": row.run_id,
            "state": row.state,
            "start_date": row.start_date,
            "end_date": row.end_date,
            "note": row.note,
        }
        for row in session.scalars(query)
    ]


def read_xcoms(
    session: Session,
    dag_id: str,
    run_ids: Iterable[str],
    keys: Iterable[tuple[str, str]],
    *,
    every_instance_key: str | None = None,
) -> Iterator[tuple[str, str, int, str, Any]]:
    """``(run id, task id, map index, key, value)`` of the XComs of ``dag_id``'s runs ``run_ids`` named
    by ``keys`` (task id, key), and of every task's ``every_instance_key`` XComs, values decoded."""
    from sqlalchemy import or_, select

    _, _, xcom = _models()
    which: list[Any] = [(xcom.task_id == task_id) & (xcom.key == key) for task_id, key in keys]
    if every_instance_key is not None:
        which.append(xcom.key == every_instance_key)
    if not which:
        return
    query = select(xcom).where(xcom.dag_id == dag_id, xcom.run_id.in_(list(run_ids)), or_(*which))
    for row in session.scalars(query):
        yield row.run_id, row.task_id, row.map_index, row.key, xcom.deserialize_value(row)


def read_task_instances(session: Session, dag_id: str, run_ids: Iterable[str]) -> Iterator[Any]:
    """The task instances of ``dag_id``'s runs ``run_ids``, as rows with ``run_id``, ``task_id``,
    ``map_index``, ``state``, ``try_number``, ``start_date``, ``end_date``, ``duration``, ``hostname`` and
    ``next_method``."""
    from sqlalchemy import select

    _, ti, _ = _models()
    columns = ("run_id", "task_id", "map_index", "state", "try_number", "start_date", "end_date")
    more = ("duration", "hostname", "next_method")
    query = select(*(getattr(ti, name) for name in (*columns, *more))).where(
        ti.dag_id == dag_id, ti.run_id.in_(list(run_ids))
    )
    yield from session.execute(query)


def first_task_with_xcom(
    session: Session, dag_id: str, run_id: str, key: str, task_ids: Iterable[str], suffix: str
) -> str | None:
    """The first task id (in order) of run ``run_id`` with a ``key`` XCom that is one of ``task_ids`` or
    ends with ``suffix``; None when there is none."""
    from sqlalchemy import or_, select

    _, _, xcom = _models()
    query = (
        select(xcom.task_id)
        .where(xcom.dag_id == dag_id, xcom.run_id == run_id, xcom.key == key)
        .where(or_(xcom.task_id.in_(list(task_ids)), xcom.task_id.like(f"%{suffix}")))
        .order_by(xcom.task_id)
    )
    found = session.scalars(query).first()
    return str(found) if found is not None else None


def api_server_session() -> Any:
    """The FastAPI dependency that gives a route of the API server its metadata database session (the
    dependency Airflow's ``SessionDep`` carries)."""
    try:
        from airflow.api_fastapi.common.db.common import SessionDep
    except ImportError as error:
        raise AirflowCompatError(
            f"this Airflow's API server has no database session dependency ({error})"
        ) from error
    return get_args(SessionDep)[1]


def dag_read_access() -> list[Any]:
    """FastAPI dependencies that ask Airflow's auth manager for read access to the DAG's runs, task
    instances and XComs (the ``dag_id`` path parameter), as the REST API asks for the same data."""
    from fastapi import Depends

    try:
        from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
        from airflow.api_fastapi.core_api.security import requires_access_dag
    except ImportError as error:
        raise AirflowCompatError(f"this Airflow's API server has no DAG access check ({error})") from error
    entities = (DagAccessEntity.RUN, DagAccessEntity.TASK_INSTANCE, DagAccessEntity.XCOM)
    return [Depends(requires_access_dag(method="GET", access_entity=entity)) for entity in entities]


# ------------------------------------------------------------------------------ the UI's translations

_Scope = MutableMapping[str, Any]
_Message = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[_Message]]
_Send = Callable[[_Message], Awaitable[None]]
_ASGIApp = Callable[[_Scope, _Receive, _Send], Awaitable[None]]

#: run type -> English label, for the run types Airflow's UI has no label for
MISSING_RUN_TYPE_LABELS = {"operator_triggered": "Triggered by a task"}
_TRANSLATIONS = re.compile(r"/static/i18n/locales/en/common\.json$")
_CONDITIONAL = (b"if-none-match", b"if-modified-since")


def with_run_type_labels(document: bytes) -> bytes | None:
    """The UI's English translations with :data:`MISSING_RUN_TYPE_LABELS` added, or None when nothing is
    missing (or the document is not the translations file it should be)."""
    try:
        data = json.loads(document)
    except ValueError:
        return None
    run_types = data.get("runTypes") if isinstance(data, dict) else None
    if not isinstance(run_types, dict):
        return None
    missing = {key: label for key, label in MISSING_RUN_TYPE_LABELS.items() if key not in run_types}
    if not missing:
        return None
    run_types.update(missing)
    return json.dumps(data, ensure_ascii=False).encode()


class RunTypeLabels:
    """ASGI middleware for the API server: serves the UI's English translations with
    :data:`MISSING_RUN_TYPE_LABELS` added (the UI falls back to English for a key another language
    lacks); a label Airflow ships wins."""

    def __init__(self, app: _ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "GET" or not _TRANSLATIONS.search(scope["path"]):
            await self.app(scope, receive, send)
            return
        # always the whole file (never "304 not modified"), so a copy cached before this label is replaced
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() not in _CONDITIONAL]
        start: _Message = {}
        body = bytearray()

        async def buffered(message: _Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
            elif message["type"] == "http.response.body":
                body.extend(message.get("body", b""))
                if not message.get("more_body"):
                    await self._send(start, bytes(body), send)

        await self.app({**scope, "headers": headers}, receive, buffered)

    @staticmethod
    async def _send(start: _Message, body: bytes, send: _Send) -> None:
        labelled = with_run_type_labels(body) if start.get("status") == 200 else None
        if labelled is not None:
            kept = [
                (k, v)
                for k, v in start.get("headers", [])
                if k.lower() not in (b"content-length", b"etag", b"last-modified")
            ]
            start = {**start, "headers": [*kept, (b"content-length", str(len(labelled)).encode())]}
            body = labelled
        await send(start)
        await send({"type": "http.response.body", "body": body})


# ------------------------------------------------------------------------------------- dag.test() internals


def _dag_module() -> Any:
    from airflow.sdk.definitions import dag as dag_module

    if not callable(getattr(dag_module, "_run_task", None)):
        raise AirflowCompatError(
            "this Airflow's dag.test() has no airflow.sdk.definitions.dag._run_task: the in-process "
            "session runner cannot run replans"
        )
    return dag_module


def run_task_in_process(*, ti: Any, task: Any, run_triggerer: bool = False) -> Any:
    """Run task instance ``ti`` of ``task`` in this process, as ``dag.test()`` runs each one."""
    return _dag_module()._run_task(ti=ti, task=task, run_triggerer=run_triggerer)


@contextmanager
def wrap_in_process_task_runner(wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Iterator[None]:
    """While active, ``dag.test()`` runs each task instance through ``wrap(runner)``, where ``runner``
    is Airflow's own (called with the keyword arguments ``ti``, ``task`` and others)."""
    from unittest.mock import patch

    module = _dag_module()
    wrapped = functools.wraps(module._run_task)(wrap(module._run_task))
    with patch.object(module, "_run_task", wrapped):
        yield


@contextmanager
def hitl_trigger_requests_in_process() -> Iterator[None]:
    """While active, ``dag.test()``'s inline trigger runs can read and write a task's human-in-the-loop
    response record (the requests the standard provider's HITL trigger makes), as in the triggerer."""
    from unittest.mock import patch

    try:
        from airflow.sdk.execution_time.comms import GetHITLDetailResponse, UpdateHITLDetail
        from airflow.sdk.execution_time.supervisor import InProcessTestSupervisor
    except ImportError:
        yield
        return
    handle = InProcessTestSupervisor._handle_request

    def handle_hitl_requests_too(self: Any, msg: Any, log: Any, req_id: int) -> None:
        if isinstance(msg, GetHITLDetailResponse):
            response = self.client.hitl.get_detail_response(ti_id=msg.ti_id)
        elif isinstance(msg, UpdateHITLDetail):
            response = self.client.hitl.update_response(
                ti_id=msg.ti_id, chosen_options=msg.chosen_options, params_input=msg.params_input
            )
        else:
            handle(self, msg, log, req_id)
            return
        self.send_msg(response, request_id=req_id, error=None)

    with patch.object(InProcessTestSupervisor, "_handle_request", handle_hitl_requests_too):
        yield
