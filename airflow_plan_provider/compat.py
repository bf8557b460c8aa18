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
