"""The plugin imports what a plan DAG's tasks need in a scheduler whose LocalExecutor forks the task
processes, and nowhere else; a Celery worker does when Celery's ``imports`` name
``airflow_plan_provider.celery_imports`` (airflow_plan_provider/preload.py). Each case runs in a fresh
interpreter, so what it finds in ``sys.modules`` is what loading the plugin imported.
tests/e2e/test_plan_runs.py checks, in a real cluster, that a node's task process has the scheduler's
imports; tests/e2e/test_celery.py that each Celery worker imported them."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from airflow_plan_provider import preload

PROBE = textwrap.dedent(
    """
    import gc, json, os, sys
    {before}
    from airflow_plan_provider.plugins.plugin import PlanViewPlugin
    from airflow_plan_provider import preload

    {load}
    from airflow_plan_provider.base_model import Model

    CONTRACT = "airflow_plan_provider.contract"

    def lexer_cached():
        # whether Jinja had built, before this look, the lexer a DAG's template environment uses (it
        # builds one per configuration and process, on the first template compiled)
        if "jinja2.lexer" not in sys.modules:
            return False
        from jinja2.lexer import _lexer_cache
        from airflow.sdk import DAG

        cached = len(_lexer_cache)
        DAG("probe", schedule=None).get_template_env().lexer
        return cached > 0 and len(_lexer_cache) == cached

    def complete(name):
        module, _, cls = name.rpartition(".")
        return getattr(sys.modules[module], cls).__pydantic_complete__ if module in sys.modules else None

    print(json.dumps({{
        "pid": os.getpid(),
        "preloaded_by": preload.preloaded_by,
        "modules": sorted(
            m for m in sys.modules if m.startswith("airflow_plan_provider") or m in preload.TASK_MODULES
        ),
        "node record built": complete("airflow_plan_provider.plan.result.NodeRecord"),
        "brief built": complete("airflow_plan_provider.contract.NodeBrief"),
        # frozen (gc.freeze): in no generation the collector traverses
        "brief frozen": CONTRACT in sys.modules
        and not any(o is sys.modules[CONTRACT].NodeBrief for o in gc.get_objects()),
        "lexer of a DAG's template environment cached": lexer_cached(),
    }}))
    """
)


def probe(executor: str, before: str, load: str = "PlanViewPlugin.on_load()") -> dict[str, Any]:
    env = os.environ | {"AIRFLOW__CORE__EXECUTOR": executor}
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(before=before, load=load)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


SCHEDULER = "import airflow.jobs.scheduler_job_runner"


def test_a_scheduler_with_the_local_executor_imports_the_task_modules_and_builds_the_validators() -> None:
    found = probe("LocalExecutor", SCHEDULER)
    assert found["preloaded_by"] == found["pid"]
    assert set(preload.TASK_MODULES) <= set(found["modules"])
    assert "airflow_plan_provider.operators.replan" in found["modules"]  # through the DAG factory
    assert found["node record built"] is True and found["brief built"] is True
    # a node's label is a template Airflow renders twice in each task process: Jinja's lexer is built
    assert found["lexer of a DAG's template environment cached"] is True


def test_the_local_executor_named_by_its_path_or_among_several_counts() -> None:
    executors = "CeleryExecutor,airflow.executors.local_executor.LocalExecutor"
    assert probe(executors, SCHEDULER)["preloaded_by"] is not None


def test_a_scheduler_whose_executor_starts_tasks_elsewhere_imports_nothing_more() -> None:
    found = probe("CeleryExecutor", SCHEDULER)
    assert found["preloaded_by"] is None
    assert "airflow_plan_provider.dag_factory" not in found["modules"]
    assert "airflow_plan_provider.operators.node" not in found["modules"]
    assert found["lexer of a DAG's template environment cached"] is False


def test_a_task_process_of_another_dag_loading_plugins_imports_nothing_more() -> None:
    """A task process loads the plugins (for macros) as Airflow's task runner does; without the
    scheduler in it (a Celery worker's or a pod's task) the plugin imports nothing of the provider's
    tasks."""
    load = textwrap.dedent(
        """
        from airflow.sdk.plugins_manager import _get_plugins, integrate_macros_plugins
        integrate_macros_plugins()
        assert any(p.name == "plan_view" for p in _get_plugins()[0]), "the plugin was not loaded"
        """
    )
    found = probe("LocalExecutor", "", load=load)
    assert found["preloaded_by"] is None
    assert "airflow_plan_provider.dag_factory" not in found["modules"]
    assert "airflow_plan_provider.operators.node" not in found["modules"]


def test_a_celery_worker_importing_the_module_celery_imports_names_preloads() -> None:
    found = probe("CeleryExecutor", "", load="import airflow_plan_provider.celery_imports")
    assert found["preloaded_by"] == found["pid"]
    assert set(preload.TASK_MODULES) <= set(found["modules"])
    assert found["node record built"] is True
    assert found["lexer of a DAG's template environment cached"] is True
    # frozen like what Airflow's worker imports ahead of its pool: the task processes never traverse it
    assert found["brief frozen"] is True


def test_docker_compose_and_every_celery_cluster_of_the_tests_name_it_in_celerys_imports() -> None:
    from harness.deploy import celery_imports, fault_settings

    imports = json.loads(celery_imports()["AIRFLOW__CELERY__EXTRA_CELERY_CONFIG"])["imports"]
    assert imports == ["airflow_plan_provider.celery_imports"]
    compose = json.loads(fault_settings()["AIRFLOW__CELERY__EXTRA_CELERY_CONFIG"])
    assert compose["imports"] == imports and "task_publish_retry_policy" in compose


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_failed_preload_is_logged_and_leaves_the_plugin_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_plan_provider.plugins.plugin import PlanViewPlugin

    records = Records()
    logger = logging.getLogger("test_preload")
    logger.addHandler(records)
    monkeypatch.setattr(preload, "log", logger)
    monkeypatch.setattr(preload, "preloaded_by", None)
    monkeypatch.setattr(preload, "forks_task_processes", lambda: True)
    monkeypatch.setattr(preload, "TASK_MODULES", ("airflow_plan_provider.no_such_module",))
    try:
        PlanViewPlugin.on_load()  # does not raise: Airflow would drop a plugin whose on_load raised
    finally:
        logger.removeHandler(records)
    assert preload.preloaded_by is None
    [warning] = records.records
    assert warning.levelno == logging.WARNING
    assert "could not import the plan provider ahead of its tasks" in warning.getMessage()
    assert warning.exc_info is not None and "no_such_module" in str(warning.exc_info[1])
