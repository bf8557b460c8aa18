"""Settings for the SQLite metadata database of the clusters :mod:`.cluster` starts.

The database file is put in write-ahead-log mode (:func:`use_wal`, once, after ``airflow db migrate``;
the mode is kept in the file): readers no longer block the writer or the writer them, as they do in
SQLite's default rollback journal, where the many reads of a busy run (task states, XComs) held off the
scheduler's, triggerer's and dag-processor's writes.

``[database] sql_alchemy_connect_args`` (and its ``_async`` twin) name :data:`CONNECT_ARGS`: a
connection waits up to 30 s for SQLite's database lock before it fails with "database is locked"
(Python's ``sqlite3`` gives up after 5 s). Ten concurrent plan runs on a 2-core machine kept the lock
busy longer than 5 s now and then, and the triggerer and dag-processor, which cannot retry a failed
heartbeat write, exited.
"""

from __future__ import annotations

import sqlite3
from typing import Any

#: ``sqlite3.connect`` arguments (Airflow adds ``check_same_thread``)
CONNECT_ARGS: dict[str, Any] = {"timeout": 30.0}


def use_wal(database_url: str) -> None:
    """Put the SQLite database of ``database_url`` (``sqlite:////abs/path.db``) in write-ahead-log mode."""
    path = database_url.split("///", 1)[1].split("?", 1)[0]
    with sqlite3.connect(path, timeout=CONNECT_ARGS["timeout"]) as connection:
        mode = connection.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    if mode != "wal":
        raise RuntimeError(f"SQLite database {path} did not switch to write-ahead logging (mode {mode!r})")
