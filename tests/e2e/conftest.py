"""Shared by the end-to-end tests: the local services the distributed tests need, and their cluster."""

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

from airflow_plan_provider.testing.cluster import AirflowCluster
from airflow_plan_provider.testing.postgres import PostgresDatabase

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


@contextlib.contextmanager
def celery_cluster(
    base: Path,
    dag_files: Iterable[Path],
    dag_ids: Iterable[str],
    *,
    env: Mapping[str, str] | None = None,
    **options: Any,
) -> Iterator[tuple[AirflowCluster, PostgresDatabase]]:
    """A CeleryExecutor cluster on a fresh PostgreSQL database (dropped afterwards) with the local Redis as
    broker and two named workers, serving copies of ``dag_files``; ``dag_ids`` parsed and unpaused."""
    require_postgres_and_redis()
    dags = base / "dags"
    dags.mkdir()
    for dag_file in dag_files:  # a directory (the example DAGs' plan_demo package) is copied whole
        if dag_file.is_dir():
            shutil.copytree(dag_file, dags / dag_file.name)
        else:
            shutil.copy(dag_file, dags)
    t0 = time.monotonic()
    with (
        PostgresDatabase() as db,
        AirflowCluster(
            dags,
            env=dict(env or {}),
            database_url=db.url,
            broker_url=CELERY_BROKER,
            celery_workers=CELERY_WORKERS,
            **options,
        ) as running,
    ):
        for dag_id in dag_ids:
            running.wait_for_dag(dag_id, timeout=180)
            running.unpause(dag_id)
        print(f"\n[e2e] celery cluster ready in {time.monotonic() - t0:.1f}s (db={db.name})")
        yield running, db
