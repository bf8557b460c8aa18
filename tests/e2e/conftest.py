"""Shared by the end-to-end tests: one way to start a cluster serving DAG files, with or without Celery
(and the local services the distributed tests need)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from harness.cluster import AirflowCluster
from harness.postgres import PostgresDatabase

ROOT = Path(__file__).resolve().parents[2]
#: The example DAG and the demo package it imports.
EXAMPLE_FILES = (ROOT / "dags" / "plan_and_execute.py", ROOT / "dags" / "plan_demo")
CELERY_WORKERS = ("worker-a", "worker-b")
CELERY_BROKER = "redis://127.0.0.1:6379/5"


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
        for dag_id in dag_ids:
            running.wait_for_dag(dag_id, timeout=180)
            if unpause:
                running.unpause(dag_id)
        print(f"\n[e2e] cluster ready in {time.monotonic() - t0:.1f}s (home={running.home})")
        yield running


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
