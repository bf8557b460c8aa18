"""What a plan DAG's task process needs, imported once in the scheduler, so that the task processes its
LocalExecutor starts have it already.

Every task process parses its DAG file before it runs its task. For a plan DAG that parse imports the
provider (about 45 modules and their classes), and the task then builds the validators of the models
it reads and writes: about 60 ms of CPU per node task, where a static task's parse costs a third of
that. With the LocalExecutor a task process is a fork of a worker process the scheduler forked (Airflow
freezes the garbage collector around that fork so the memory stays shared), so what the scheduler
imported before starting its workers is already in every task process. Airflow's DAG processor does
the same for the modules its DAG files import (``[dag_processor] parsing_pre_import_modules``).

The plugin (:class:`~.plugin.PlanViewPlugin`) calls :func:`preload_for_task_processes` when Airflow
loads it. It imports only in a scheduler whose executors include the LocalExecutor: other executors
start their task processes elsewhere (a Celery worker, a pod), and a task process of another DAG must
not import the provider for nothing. A failure is logged and changes nothing else: the task
processes then import what they need themselves.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import time

log = logging.getLogger(__name__)

#: What a node task (and the plan DAG's other tasks) import when they parse and run: the DAG factory
#: with every operator, and what a node with parents imports when it waits for them.
TASK_MODULES = (
    "airflow_plan_provider.dag_factory",
    "airflow_plan_provider.operators.node",
    "airflow_plan_provider.operators.node_wait",
    "airflow_plan_provider.triggers.payloads",
    "airflow_plan_provider.tools.jobs",
)
#: The scheduler's module; a process that has it is the scheduler or a process it forked.
SCHEDULER_MODULE = "airflow.jobs.scheduler_job_runner"

#: The process that preloaded (its pid), inherited by the processes it forks; None until then.
preloaded_by: int | None = None


def forks_task_processes() -> bool:
    """Whether this process is a scheduler whose LocalExecutor forks the task processes from it."""
    if SCHEDULER_MODULE not in sys.modules:
        return False
    from airflow.configuration import conf

    executors = conf.get("core", "executor", fallback="") or ""
    return any(name.strip().split(".")[-1].split(":")[-1] == "LocalExecutor" for name in executors.split(","))


def preload_for_task_processes() -> None:
    """Import :data:`TASK_MODULES` and build every model's validator, once, in a scheduler that forks
    its task processes (:func:`forks_task_processes`); nothing elsewhere. Never raises."""
    global preloaded_by
    if preloaded_by is not None:
        return
    try:
        if not forks_task_processes():
            return
        started = time.process_time()
        before = len(sys.modules)
        for name in TASK_MODULES:
            importlib.import_module(name)
        models = build_validators()
        preloaded_by = os.getpid()
        log.info(
            "imported %d modules and built %d validators for the task processes this scheduler forks "
            "(%.0f ms of CPU)",
            len(sys.modules) - before,
            models,
            (time.process_time() - started) * 1000,
        )
    except Exception:
        log.warning(
            "could not import the plan provider ahead of its tasks; each task imports it", exc_info=True
        )


def build_validators() -> int:
    """Build the validator and serializer of every model of the package (they are built on first use,
    :mod:`~airflow_plan_provider.plan.base_model`); returns how many models there are."""
    from airflow_plan_provider.plan.base_model import Model

    models: list[type[Model]] = []
    pending: list[type[Model]] = [Model]
    while pending:
        for subclass in pending.pop().__subclasses__():
            models.append(subclass)
            pending.append(subclass)
    for model in models:
        model.model_rebuild(raise_errors=False)
    return len(models)
