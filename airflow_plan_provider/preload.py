"""What a plan DAG's task process needs, imported once in the long-lived process its task processes are
forked from, so that each of them has it already.

Every task process parses its DAG file before it runs its task. For a plan DAG that parse imports the
provider (its modules and their classes), and the task then builds the validators of the models it
reads and writes (what this saves: ``docs/performance.md``). A task process is a fork: of a worker
process the scheduler forked (LocalExecutor), or of a Celery worker's pool process, itself forked from
the worker. What the process at the root of those forks imported is therefore already in every task
process, shared copy-on-write (Airflow freezes the garbage collector around these forks so that the
memory stays shared). Airflow does the same for its own modules: the Celery worker imports the
standard operators before forking its pool, and the DAG processor the modules its DAG files import
(``[dag_processor] parsing_pre_import_modules``).

Two ways in, one import (:func:`import_task_modules`):

- the plugin (:class:`~airflow_plan_provider.plugins.plugin.PlanViewPlugin`) calls
  :func:`preload_for_task_processes` when Airflow loads it. It imports only in a scheduler whose executors
  include the LocalExecutor: other executors start their task processes elsewhere, and a task process
  of another DAG, which loads the plugins too, must not import the provider for nothing;
- a Celery worker imports :mod:`airflow_plan_provider.celery_imports` when Celery's ``imports`` setting
  lists it (``[celery] extra_celery_config``, as docker-compose.yml sets it), before it forks its pool.

A failure is logged and changes nothing else: the task processes then import what they need themselves.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import time

from airflow_plan_provider import airflow_features

log = logging.getLogger(__name__)

#: What a node task (and the plan DAG's other tasks) import when they parse and run: the DAG factory
#: with every operator, and what a node with parents imports when it waits for them.
TASK_MODULES = (
    "airflow_plan_provider.dag_factory",
    "airflow_plan_provider.operators.node",
    "airflow_plan_provider.operators.node_wait",
    "airflow_plan_provider.operators.retry",  # the node tasks' retry policy (Airflow 3.3), built in the parse
    "airflow_plan_provider.triggers.payloads",
    "airflow_plan_provider.tools.jobs",
    # imported by Airflow when the parse expands the node task (MappedOperator._expand)
    "airflow.providers.standard.operators.empty",
)
#: The scheduler's module. The scheduler and the processes it forks have it when they load the plugins.
#: Another process that imported it before loading them would preload too, once, for nothing: the API
#: server imports it, but after its plugins (its log has no preload line).
SCHEDULER_MODULE = "airflow.jobs.scheduler_job_runner"

#: The process that imported :data:`TASK_MODULES` (its pid), inherited by the processes it forks;
#: None until then.
preloaded_by: int | None = None


def forks_task_processes() -> bool:
    """Whether this process may be a scheduler whose LocalExecutor forks the task processes from it
    (:data:`SCHEDULER_MODULE` loaded, the LocalExecutor among ``[core] executor``)."""
    if SCHEDULER_MODULE not in sys.modules:
        return False
    from airflow.configuration import conf

    executors = conf.get("core", "executor", fallback="") or ""
    return any(name.strip().split(".")[-1].split(":")[-1] == "LocalExecutor" for name in executors.split(","))


def preload_for_task_processes() -> None:
    """:func:`import_task_modules` in a scheduler that forks its task processes
    (:func:`forks_task_processes`); nothing elsewhere. Never raises."""
    try:
        if forks_task_processes():
            import_task_modules("the task processes this scheduler forks")
    except Exception:
        log.warning("could not tell whether this process starts task processes", exc_info=True)


def import_task_modules(for_whom: str) -> None:
    """Import :data:`TASK_MODULES` and build every model's validator, once per process tree (a process
    forked after it inherits :data:`preloaded_by` and returns at once). Never raises."""
    global preloaded_by
    if preloaded_by is not None:
        return
    try:
        started = time.process_time()
        before = len(sys.modules)
        for name in TASK_MODULES:
            importlib.import_module(name)
        models = build_validators()
        airflow_features.offered()  # what the parse asks of the installed Airflow, cached once
        first_uses()
        preloaded_by = os.getpid()
        log.info(
            "imported %d modules and built %d validators for %s (%.0f ms of CPU)",
            len(sys.modules) - before,
            models,
            for_whom,
            (time.process_time() - started) * 1000,
        )
    except Exception:
        log.warning(
            "could not import the plan provider ahead of its tasks; each task imports it", exc_info=True
        )


def first_uses() -> None:
    """Do once what Airflow's task runner does first in each task process of a plan DAG, so that what it
    builds and caches the first time is inherited: compile a template with a DAG's Jinja environment (a
    node's label is its rendered ``map_index_template``, rendered before and after ``execute``; Jinja
    builds its lexer once per process) and validate the trigger form's params (``jsonschema`` builds its
    validator classes and meta-schema registry on first use; Airflow validates a DAG's params twice in
    every task; ``bench/first_uses.py`` measures both)."""
    from airflow.sdk import DAG

    from airflow_plan_provider.dag_factory import MAP_INDEX_TEMPLATE, plan_params

    template_env = DAG("plan_provider_preload", schedule=None).get_template_env()
    template_env.from_string(MAP_INDEX_TEMPLATE).render(task={"instance_label": ""})
    for param in plan_params().values():
        param.resolve()


def build_validators() -> int:
    """Build the validator and serializer of every model of the package (they are built on first use,
    :mod:`~airflow_plan_provider.base_model`); returns how many models there are."""
    from airflow_plan_provider.base_model import Model

    models: list[type[Model]] = []
    pending: list[type[Model]] = [Model]
    while pending:
        for subclass in pending.pop().__subclasses__():
            models.append(subclass)
            pending.append(subclass)
    for model in models:
        model.model_rebuild(raise_errors=False)
    return len(models)
