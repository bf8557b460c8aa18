"""What an AirflowCluster configures before it starts anything: the metadata DB's URLs, parallelism, and
what its processes import."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys

import pytest

from harness.cluster import AirflowCluster, async_database_url
from harness.sqlite import (
    API_SERVER_CONNECT_ARGS,
    CONNECT_ARGS,
    LOCK_TIMEOUT,
    copy_template,
    new_sqlite_file,
    save_template,
)


def test_async_url_is_the_same_database_through_the_asyncio_driver():
    assert (
        async_database_url("postgresql+psycopg2://postgres@127.0.0.1:5432/plan_e2e_1")
        == "postgresql+asyncpg://postgres@127.0.0.1:5432/plan_e2e_1"
    )
    assert async_database_url("postgresql://u:p@db/x") == "postgresql+asyncpg://u:p@db/x"
    assert async_database_url("sqlite:////tmp/a/airflow.db") == "sqlite+aiosqlite:////tmp/a/airflow.db"
    # libpq's sslmode means nothing to asyncpg; its ssl takes the same values
    assert async_database_url("postgresql+psycopg2://u@db/x?sslmode=require") == (
        "postgresql+asyncpg://u@db/x?ssl=require"
    )


def test_the_cluster_gives_airflow_both_urls_and_airflows_parallelism(tmp_path):
    url = "postgresql+psycopg2://postgres@127.0.0.1:5432/plan_e2e_1"
    cluster = AirflowCluster(tmp_path, home=tmp_path / "home", database_url=url)
    assert cluster.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == url
    assert cluster.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC"] == (
        "postgresql+asyncpg://postgres@127.0.0.1:5432/plan_e2e_1"
    )
    assert cluster.env["AIRFLOW__CORE__PARALLELISM"] == "32"
    default = AirflowCluster(tmp_path, home=tmp_path / "default")
    assert (
        default.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        == f"sqlite:///{tmp_path / 'default' / 'airflow.db'}"
    )
    assert default.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC"] == (
        f"sqlite+aiosqlite:///{tmp_path / 'default' / 'airflow.db'}"
    )


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("postgres://u@db/x", "must start with one of ['postgresql', 'sqlite']"),
        ("mysql://u@db/x", "must start with one of ['postgresql', 'sqlite']"),
        ("postgresql+pg8000://u@db/x", "driver 'pg8000' is not one of ['psycopg2', 'psycopg']"),
        ("/var/lib/airflow.db", "must start with one of"),
    ],
)
def test_a_url_airflow_could_not_open_is_refused_before_anything_starts(tmp_path, url, problem):
    with pytest.raises(ValueError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        AirflowCluster(tmp_path, home=tmp_path / "home", database_url=url)
    assert not (tmp_path / "home").exists()


def test_only_a_sqlite_cluster_gets_the_sqlite_settings(tmp_path):
    sqlite = AirflowCluster(tmp_path, home=tmp_path / "sqlite").env
    assert sqlite["AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS"] == "harness.sqlite.CONNECT_ARGS"
    assert (
        sqlite["AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS_ASYNC"]
        == sqlite["AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS"]
    )
    # a task waits for the API server longer than the server waits for the lock
    assert float(sqlite["AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT"]) > CONNECT_ARGS["timeout"] == LOCK_TIMEOUT
    assert sqlite["AIRFLOW__DATABASE__SQL_ALCHEMY_MAX_OVERFLOW"] == "-1"
    # but the API server keeps sqlite3's 5 s (its event loop waits for the lock)
    api_server = AirflowCluster(tmp_path, home=tmp_path / "sqlite")._component_env("api-server")
    assert api_server["AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS"] == (
        "harness.sqlite.API_SERVER_CONNECT_ARGS"
    )
    assert API_SERVER_CONNECT_ARGS["timeout"] == 5.0
    url = "postgresql+psycopg2://postgres@127.0.0.1:5432/plan_e2e_1"
    postgres = AirflowCluster(tmp_path, home=tmp_path / "postgres", database_url=url).env
    assert not {
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS",
        "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_MAX_OVERFLOW",
    } & set(postgres)


# What Airflow does with a dotted path in its configuration (airflow.utils.module_loading.import_string)
IMPORT = (
    "import importlib, sys; module, _, name = sys.argv[1].rpartition('.'); "
    "print(getattr(importlib.import_module(module), name))"
)


def test_every_process_imports_what_the_cluster_names_by_dotted_path(tmp_path, monkeypatch):
    """The cluster names its SQLite settings and its Celery workers' hostname callable to Airflow by
    dotted path, in a package that is not installed: a component finds them without any ``PYTHONPATH``
    of the caller's, started in the cluster's home."""
    monkeypatch.delenv("PYTHONPATH", raising=False)
    sqlite = AirflowCluster(tmp_path, home=tmp_path / "sqlite")
    celery = AirflowCluster(
        tmp_path,
        home=tmp_path / "celery",
        database_url="postgresql+psycopg2://postgres@127.0.0.1:5432/plan_e2e_1",
        broker_url="redis://127.0.0.1:6379/0",
        celery_workers=("worker-a",),
    )
    named = [
        (sqlite, "scheduler", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS", str(CONNECT_ARGS)),
        (sqlite, "api-server", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS", str(API_SERVER_CONNECT_ARGS)),
        (celery, "worker-a", "AIRFLOW__CORE__HOSTNAME_CALLABLE", "<function worker_hostname at"),
    ]
    for cluster, component, key, expected in named:
        env = cluster._component_env(component)
        done = subprocess.run(
            [sys.executable, "-c", IMPORT, env[key]],
            env=env,
            cwd=cluster.home,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, (component, env[key], done.stderr[-2000:])
        assert done.stdout.startswith(expected), (component, done.stdout)


def test_a_new_sqlite_database_starts_as_a_copy_of_the_last_migrated_one(tmp_path):
    migrated = tmp_path / "migrated.db"
    with contextlib.closing(sqlite3.connect(migrated)) as db, db:
        db.execute("PRAGMA journal_mode=WAL")  # as Airflow opens it
        db.execute("CREATE TABLE alembic_version (version_num TEXT)")
        db.execute("INSERT INTO alembic_version VALUES ('head')")
    template, fresh = tmp_path / "template.sqlite", tmp_path / "home" / "airflow.db"
    fresh.parent.mkdir()
    assert not copy_template(template, fresh)  # nothing to copy yet: the cluster migrates
    assert not fresh.exists()
    save_template(migrated, template)
    assert copy_template(template, fresh)
    with contextlib.closing(sqlite3.connect(fresh)) as db:
        assert db.execute("SELECT version_num FROM alembic_version").fetchall() == [("head",)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "migrated.db", "template.sqlite"]


def test_only_a_sqlite_file_not_there_yet_is_copied(tmp_path):
    sqlite_cluster = AirflowCluster(tmp_path, home=tmp_path / "home")
    assert new_sqlite_file(sqlite_cluster.database_url) == tmp_path / "home" / "airflow.db"
    (tmp_path / "home" / "airflow.db").write_bytes(b"")  # a home used before: migrated, not replaced
    assert new_sqlite_file(sqlite_cluster.database_url) is None
    url = "postgresql+psycopg2://postgres@127.0.0.1:5432/plan_e2e_1"
    assert (
        new_sqlite_file(AirflowCluster(tmp_path, home=tmp_path / "pg", database_url=url).database_url) is None
    )
