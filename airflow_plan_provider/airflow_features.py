"""What the running Airflow offers beyond Airflow 3.1, the oldest the provider supports, and each
feature's fallback where it is missing. Every difference between supported Airflow versions is decided
here, by looking for the feature itself (never by comparing version numbers); the rest of the package
asks this module.

- :func:`retry_policies` (3.3): the node tasks get a ``retry_policy``: a rate-limited tool is retried
  after the delay it asked for (``Retry-After``). Fallback: every retry waits the task's
  ``retry_delay`` (with backoff).
- :func:`retry_backoff_multiplier` (3.2): ``NodeExecution.retry_exponential_backoff`` is Airflow's
  multiplier. Fallback: a switch; any multiplier but 0 doubles each delay.
- :func:`task_state_store` (3.3): a retry of the planning task reuses the plan an earlier try
  validated, kept in the task state store. Fallback: kept as a checkpoint in the DAG's artifact store
  (same checks, same reuse).
- :func:`starts_mapped_on_triggerer` (3.3): ``NodeExecution(start_on_triggerer=True)`` starts the
  nodes that have parents on the triggerer. Fallback: they start in a slot, as without the setting.
- :func:`awaiting_input` (3.3): the approval task waits in ``awaiting_input`` (no worker slot, no
  triggerer). Fallback: the standard provider's HITL operator waits deferred, in the triggerer; the
  in-process session runner (:mod:`airflow_plan_provider.testing.in_process`) then lets ``dag.test()``'s
  inline run of that trigger read the answer (:func:`airflow_plan_provider.compat.
  hitl_trigger_requests_in_process`).

Names Airflow moved between 3.1 and 3.2 (same behaviour, another module) are found here too:
:func:`sdk_conf`, :func:`stats`, :func:`dag_bag`, and the task exceptions and ``SkipMixin``
(:data:`MOVED`), imported from this module as ``from airflow_plan_provider.airflow_features import
AirflowSkipException``.

:func:`require_supported_airflow` is what the provider's import runs: an Airflow older than
:data:`MINIMUM_AIRFLOW` is refused with one line, as Airflow's own providers do.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow.sdk.bases.skipmixin import SkipMixin as SkipMixin
    from airflow.sdk.exceptions import (
        AirflowFailException as AirflowFailException,
    )
    from airflow.sdk.exceptions import (
        AirflowRescheduleException as AirflowRescheduleException,
    )
    from airflow.sdk.exceptions import (
        AirflowSkipException as AirflowSkipException,
    )

#: the oldest Airflow the provider runs on (human-in-the-loop operators arrived in 3.1)
MINIMUM_AIRFLOW = "3.1.0"


def _release(text: str) -> tuple[int, ...]:
    """The release numbers of a version string: ``3.2.0rc1`` → ``(3, 2, 0)``."""
    match = re.match(r"\d+(\.\d+)*", text.strip())
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def installed_airflow() -> str | None:
    """The installed Airflow's version, read from the package metadata (Airflow is not imported)."""
    for distribution in ("apache-airflow-core", "apache-airflow"):
        try:
            return version(distribution)
        except PackageNotFoundError:
            continue
    return None


def require_supported_airflow(found: str | None = None) -> None:
    """Raise :class:`RuntimeError` when the installed Airflow (or ``found``) is older than
    :data:`MINIMUM_AIRFLOW`; nothing when Airflow is not installed (the pure core runs without it)."""
    found = installed_airflow() if found is None else found
    if found is not None and _release(found) < _release(MINIMUM_AIRFLOW):
        raise RuntimeError(
            f"The package `airflow-plan-provider` needs Apache Airflow {MINIMUM_AIRFLOW}+; "
            f"your version ({found}) is not supported."
        )


def _has(module: str, name: str) -> bool:
    try:
        return hasattr(import_module(module), name)
    except ImportError:
        return False


# ------------------------------------------------------------------------------ features newer than 3.1


@cache
def retry_policies() -> bool:
    """Tasks take a ``retry_policy`` (``airflow.sdk.RetryPolicy``) deciding each failure's retry."""
    return _has("airflow.sdk", "RetryPolicy")


@cache
def retry_backoff_multiplier() -> bool:
    """A task's ``retry_exponential_backoff`` is a multiplier (a number); before, a switch: ``True``
    doubles each retry's delay."""
    from airflow.sdk import BaseOperator

    return not isinstance(BaseOperator.retry_exponential_backoff, bool)


@cache
def task_state_store() -> bool:
    """A running task has ``context["task_state_store"]``: values kept across the tries of one task
    instance."""
    return _has("airflow.sdk.execution_time.context", "TaskStateStoreAccessor")


@cache
def awaiting_input() -> bool:
    """A human-in-the-loop task waits for its answer in the ``awaiting_input`` state (no worker slot, no
    triggerer); without it the standard provider's HITL operators defer to a trigger."""
    from airflow.utils.state import TaskInstanceState

    return any(state.value == "awaiting_input" for state in TaskInstanceState)


@cache
def starts_mapped_on_triggerer() -> bool:
    """The scheduler starts a task whose operator has ``start_from_trigger`` on the triggerer, mapped
    instances included: the scheduler's task instance reads the operator's ``start_trigger_args``
    (before, the scheduler's branch that would defer them was left out)."""
    try:
        from airflow.models.taskinstance import TaskInstance
    except ImportError:
        return False
    return hasattr(TaskInstance, "start_trigger_args")


def offered() -> dict[str, bool]:
    """Each feature above by name: whether the running Airflow has it."""
    return {
        "retry_policies": retry_policies(),
        "retry_backoff_multiplier": retry_backoff_multiplier(),
        "task_state_store": task_state_store(),
        "awaiting_input": awaiting_input(),
        "starts_mapped_on_triggerer": starts_mapped_on_triggerer(),
    }


# ------------------------------------------------------------------------------------- names that moved


def sdk_conf() -> Any:
    """Airflow's configuration as tasks read it: ``airflow.sdk.configuration`` (3.2+), else the core's."""
    try:
        from airflow.sdk.configuration import conf
    except ImportError:
        from airflow.configuration import conf
    return conf


def stats() -> Any:
    """Airflow's metrics client (``incr``, ``timing``): the functions of ``airflow.sdk.observability.stats``
    (3.3), that module's ``Stats`` (3.2), else ``airflow.stats.Stats``."""
    try:
        from airflow.sdk.observability import stats as sdk_stats
    except ImportError:
        from airflow.stats import Stats

        return Stats
    return sdk_stats if hasattr(sdk_stats, "incr") else sdk_stats.Stats


def dag_bag() -> tuple[Any, Any]:
    """``DagBag`` and ``sync_bag_to_db``: ``airflow.dag_processing.dagbag`` (3.2+), else
    ``airflow.models.dagbag``."""
    try:
        from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
    except ImportError:
        from airflow.models.dagbag import DagBag, sync_bag_to_db  # type: ignore[no-redef]
    return DagBag, sync_bag_to_db


#: names the Task SDK took over in Airflow 3.2: where each is now, and where it was in 3.1
MOVED: dict[str, tuple[str, str]] = {
    "AirflowFailException": ("airflow.sdk.exceptions", "airflow.exceptions"),
    "AirflowRescheduleException": ("airflow.sdk.exceptions", "airflow.exceptions"),
    "AirflowSkipException": ("airflow.sdk.exceptions", "airflow.exceptions"),
    "SkipMixin": ("airflow.sdk.bases.skipmixin", "airflow.providers.standard.utils.skipmixin"),
}


def __getattr__(name: str) -> Any:
    # looked up when first used, so that importing this module (the provider's import does) loads no
    # Airflow
    if name not in MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    for module in MOVED[name]:
        try:
            found = getattr(import_module(module), name)
        except (ImportError, AttributeError):
            continue
        globals()[name] = found
        return found
    raise AttributeError(f"this Airflow has no {name} (looked in {', '.join(MOVED[name])})")
