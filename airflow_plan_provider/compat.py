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
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from airflow_plan_provider.exceptions import PlanProviderError


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
