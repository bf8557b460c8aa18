"""Settings for the SQLite metadata database of the clusters :mod:`.cluster` starts.

SQLite has one writer at a time. Airflow already opens every connection in write-ahead-log mode
(``airflow.utils.orm_event_handlers``: readers and the writer do not block each other); what a busy
SQLite deployment still needs is that a writer waiting for the lock, and everyone waiting for that
writer, wait long enough, in this order:

* ``[database] sql_alchemy_connect_args`` (and its ``_async`` twin) name :data:`CONNECT_ARGS`: a
  connection waits up to :data:`LOCK_TIMEOUT` for the lock before it fails with "database is locked"
  (Python's ``sqlite3`` gives up after 5 s). The triggerer and dag-processor cannot retry a failed
  write and exit on it; on a loaded 2-core machine the lock was now and then held longer than 5 s.
* Not in the API server, which keeps sqlite3's 5 s (:data:`API_SERVER_CONNECT_ARGS`): some of its
  asynchronous code writes through a blocking session on the event loop (the REST API's audit log, for
  every user's write), and while that write waits for the lock no other request's session can close,
  the one holding the lock included. Every wait there ends in a deadlock the timeout breaks, so the
  shorter the better: the write fails with HTTP 500 "database is locked" (rolled back; the cluster's
  client sends it again, :func:`locked`) and the server goes on.
* ``[workers] execution_api_timeout`` is :data:`API_TIMEOUT`, longer than that wait. A task talks to
  the database through the API server, whose request waits for the lock like any writer; with the
  default 5 s the task gave up on requests the server was still waiting to serve, tried them again,
  and failed when its five tries had timed out (a retried request the server had committed meanwhile
  fails too: a second "success" is a conflict, apache/airflow#64023).
* :data:`API_TIMEOUT` is also how long a client of the REST API (the cluster's own, the tests') waits.
* ``[database] sql_alchemy_max_overflow`` is :data:`MAX_OVERFLOW`, no limit on a process's connections.
  The API server serves up to 40 requests at once from a pool of 15 connections (5 and 10 overflow).
  With every pooled connection waiting for the lock, the request holding it asked the pool for one
  more and waited too: nothing moved until the pool's 30 s timeout failed them all. A SQLite
  connection is a file handle, and a process never holds more than its threads.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import os
import sqlite3
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: seconds a connection waits for SQLite's database lock
LOCK_TIMEOUT = 30.0

#: ``sqlite3.connect`` arguments (Airflow adds ``check_same_thread``)
CONNECT_ARGS: dict[str, Any] = {"timeout": LOCK_TIMEOUT}

#: the API server's: sqlite3's own 5 s
API_SERVER_CONNECT_ARGS: dict[str, Any] = {"timeout": 5.0}

#: seconds an API client waits for an answer: the server's wait for the lock, and time to spare
API_TIMEOUT = 2 * LOCK_TIMEOUT

#: ``[database] sql_alchemy_max_overflow``: connections beyond the pool's five, -1 for no limit
MAX_OVERFLOW = -1


def locked(status: int, body: str) -> bool:
    """Whether an API answer is SQLite's "database is locked" (HTTP 500): the request was rolled back,
    and sending it again is safe."""
    return status == 500 and "database is locked" in body


def migrated_template() -> Path:
    """Where a SQLite database ``airflow db migrate`` made for this environment's Airflow is kept: one
    per Airflow version and virtual environment, in the temporary folder. A cluster whose database file
    does not exist yet starts from a copy (:func:`copy_template`) instead of migrating again (about 6 s
    of CPU)."""
    version = importlib.metadata.version("apache-airflow")
    venv = hashlib.sha256(sys.prefix.encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"plan-e2e-airflow-{version}-{venv}.sqlite"


def save_template(database: Path, template: Path) -> None:
    """Keep a consistent copy of the freshly migrated ``database`` as ``template`` (written aside, then
    renamed: a cluster starting meanwhile sees the whole file or none)."""
    partial = template.with_name(f"{template.name}.{os.getpid()}.partial")
    with (
        contextlib.closing(sqlite3.connect(database)) as source,
        contextlib.closing(sqlite3.connect(partial)) as copy,
    ):
        source.backup(copy)
        copy.execute("PRAGMA journal_mode=DELETE")  # one file, read without a -wal beside it
    os.replace(partial, template)


def copy_template(template: Path, database: Path) -> bool:
    """Start ``database`` as a copy of ``template``; whether there was one to copy."""
    if not template.exists():
        return False
    source = sqlite3.connect(f"file:{template}?mode=ro", uri=True)
    with contextlib.closing(source), contextlib.closing(sqlite3.connect(database)) as copy:
        source.backup(copy)  # Airflow opens it in write-ahead-log mode again
    return True


def new_sqlite_file(database_url: str) -> Path | None:
    """The SQLite database file of ``database_url`` when it does not exist yet, else None (another
    database, or a file used before: migrated, not replaced)."""
    if not database_url.startswith("sqlite:///"):
        return None
    path = Path(database_url.removeprefix("sqlite:///"))
    return path if path.is_absolute() and not path.exists() else None


def migrate_or_copy_template(database_url: str, migrate: Callable[[], None]) -> None:
    """``migrate()`` (``airflow db migrate``), unless the database is a SQLite file not there yet and
    :func:`migrated_template` has a copy to start it from; a file ``migrate()`` made new is kept as that
    template."""
    database, template = new_sqlite_file(database_url), migrated_template()
    if database is not None and copy_template(template, database):
        return
    migrate()
    if database is not None:
        save_template(database, template)
