"""Shared by the end-to-end tests: one way to start a cluster serving DAG files, with or without Celery
(and the local services the distributed tests need), and one cluster that several modules share.

Starting a cluster costs 12-24 s, so modules whose runs cannot disturb each other share
:func:`example_cluster` (the example DAGs and every DAG under ``tests/e2e/dags``, LocalExecutor on
SQLite, parallelism 8). A module gets a cluster of its own when it changes what the whole cluster does:
auth users, scheduler timeouts, a slot count, the executor, or killing and stopping its processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_plan_provider.testing.openai_server import OpenAITestServer
from harness.cluster import AirflowCluster
from harness.postgres import PostgresDatabase
from tests.conftest import SHARED_CLUSTER_MODULES
from tests.e2e.keys import LLM_API_KEY

ROOT = Path(__file__).resolve().parents[2]
#: The example DAG and the demo package it imports.
EXAMPLE_FILES = (ROOT / "dags" / "plan_and_execute.py", ROOT / "dags" / "plan_demo")
#: The DAG files written for these tests.
E2E_DAGS = Path(__file__).resolve().parent / "dags"
CELERY_WORKERS = ("worker-a", "worker-b")


def _broker_database() -> int:
    """The local Redis database this test process's Celery clusters use as broker: one per pytest-xdist
    worker, so two Celery modules running at once never take each other's tasks (database 6 is the load
    test's gauge)."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    return 5 if worker == 0 else 6 + worker


CELERY_BROKER = f"redis://127.0.0.1:6379/{_broker_database()}"


def _reachable(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def require_postgres_and_redis() -> None:
    """Skip outside CI when PostgreSQL or Redis is not running on 127.0.0.1 (``.ci/run`` starts them);
    under CI the test goes on and fails loudly instead."""
    down = [name for name, port in (("PostgreSQL", 5432), ("Redis", 6379)) if not _reachable(port)]
    if down and not os.environ.get("CI"):
        pytest.skip(f"{' and '.join(down)} not running on 127.0.0.1 (.ci/run starts them)")


def demo_env(base: Path) -> dict[str, str]:
    """Where, under ``base``, the scripted tools log their calls (``calls/<dag id>``), and the example
    DAG writes its reports and keeps its demo database."""
    return {
        "PLAN_E2E_CALL_LOG": str(base / "calls"),
        "PLAN_REPORT_DIR": str(base / "reports"),
        "PLAN_DEMO_DB": str(base / "demo" / "demo.sqlite"),
    }


@contextlib.contextmanager
def plan_cluster(
    base: Path,
    dag_files: Iterable[Path],
    dag_ids: Iterable[str],
    *,
    env: Mapping[str, str] | None = None,
    unpause: bool = True,
    **options: Any,
) -> Iterator[AirflowCluster]:
    """A cluster serving copies of ``dag_files`` (files or packages, in ``base/dags``), once ``dag_ids``
    are parsed (and unpaused unless ``unpause=False``). ``options`` go to :class:`AirflowCluster`;
    ``parallelism`` is 8 unless given, the cap these tests are written for on a small machine."""
    dags = base / "dags"
    dags.mkdir()
    for dag_file in dag_files:  # a directory (the example DAGs' plan_demo package) is copied whole
        if dag_file.is_dir():
            shutil.copytree(dag_file, dags / dag_file.name)
        else:
            shutil.copy(dag_file, dags)
    options.setdefault("parallelism", 8)
    t0 = time.monotonic()
    with AirflowCluster(dags, env=dict(env or {}), **options) as running:
        serve(running, dag_ids, unpause=unpause)
        print(f"\n[e2e] cluster ready in {time.monotonic() - t0:.1f}s (home={running.home})")
        yield running


def serve(cluster: AirflowCluster, dag_ids: Iterable[str], *, unpause: bool = True) -> None:
    """Wait until the cluster has parsed ``dag_ids``; unpause them unless ``unpause=False``."""
    for dag_id in dag_ids:
        cluster.wait_for_dag(dag_id, timeout=180)
        if unpause:
            cluster.unpause(dag_id)


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, cluster: AirflowCluster) -> Any:
    """``predicate()``'s first true value, asked every 0.5 s for ``timeout`` seconds while every process
    of ``cluster`` is alive; an AssertionError naming ``what``, with the cluster's diagnostics, if none."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cluster.check_alive()
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"{what} within {timeout}s\n{cluster.diagnostics()}")


@dataclass
class SharedCluster:
    """:func:`example_cluster`: the cluster, the folder its tools log their calls to (``calls/<dag id>``)
    and write reports in (``reports``), and the OpenAI-compatible server its LLM planner asks."""

    cluster: AirflowCluster
    base: Path
    llm: OpenAITestServer

    @property
    def calls(self) -> Path:
        return self.base / "calls"

    @property
    def reports(self) -> Path:
        return self.base / "reports"


#: the running shared cluster's exit stack, closed after the last test that uses it (see below)
_SHARED_CLUSTER = contextlib.ExitStack()


@pytest.fixture(scope="session")
def example_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedCluster]:
    """One cluster for the test session, serving the example DAGs and every DAG under ``tests/e2e/dags``,
    with ``demo_env`` and a ``plan_llm_default`` connection to a scripted OpenAI-compatible server. A
    module that uses it waits for its own DAGs with :func:`serve`, and reads only its own DAGs' runs,
    call logs and reports. It stops after the last test that uses it (``pytest_runtest_teardown``), so its
    processes do not take the CPU of the tests that come after."""
    base = tmp_path_factory.mktemp("example_cluster")
    llm = _SHARED_CLUSTER.enter_context(OpenAITestServer())
    connection = {
        "conn_type": "plan_llm",
        "host": llm.base_url,
        "password": LLM_API_KEY,
        "extra": {"model": "test-model"},
    }
    env = {**demo_env(base), "AIRFLOW_CONN_PLAN_LLM_DEFAULT": json.dumps(connection)}
    files = [*EXAMPLE_FILES, *sorted(E2E_DAGS.glob("*.py"))]
    with _SHARED_CLUSTER:
        cluster = _SHARED_CLUSTER.enter_context(plan_cluster(base, files, (), env=env))
        yield SharedCluster(cluster, base, llm)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse a module on the shared cluster that is not one unit of work with the others (it could run
    on another worker, or after the cluster stopped)."""
    for item in items:
        module = Path(item.path).relative_to(ROOT).as_posix()
        if "example_cluster" in getattr(item, "fixturenames", ()) and module not in SHARED_CLUSTER_MODULES:
            raise pytest.UsageError(f"{module} uses example_cluster: add it to SHARED_CLUSTER_MODULES")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Stop the shared cluster once no test after ``item`` in this process uses it (after ``item``'s
    own fixtures are torn down)."""
    yield
    if "example_cluster" not in getattr(item, "fixturenames", ()):
        return
    later = item.session.items[item.session.items.index(item) + 1 :]
    if not any("example_cluster" in getattr(other, "fixturenames", ()) for other in later):
        _SHARED_CLUSTER.close()


@contextlib.contextmanager
def celery_cluster(
    base: Path,
    dag_files: Iterable[Path],
    dag_ids: Iterable[str],
    *,
    env: Mapping[str, str] | None = None,
    **options: Any,
) -> Iterator[tuple[AirflowCluster, PostgresDatabase]]:
    """:func:`plan_cluster` with the CeleryExecutor: a fresh PostgreSQL database (dropped afterwards), the
    local Redis as broker and two named workers."""
    require_postgres_and_redis()
    with (
        PostgresDatabase() as db,
        plan_cluster(
            base,
            dag_files,
            dag_ids,
            env=env,
            database_url=db.url,
            broker_url=CELERY_BROKER,
            celery_workers=CELERY_WORKERS,
            **options,
        ) as running,
    ):
        yield running, db
