"""Connection settings for the SQLite metadata database of the clusters :mod:`.cluster` starts.

``[database] sql_alchemy_connect_args`` (and its ``_async`` twin) name :data:`CONNECT_ARGS`: a
connection waits up to 30 s for SQLite's database lock before it fails with "database is locked"
(Python's ``sqlite3`` gives up after 5 s). Ten concurrent plan runs on a 2-core machine kept the lock
busy longer than 5 s now and then, and the triggerer and dag-processor, which cannot retry a failed
heartbeat write, exited.
"""

from __future__ import annotations

from typing import Any

#: ``sqlite3.connect`` arguments (Airflow adds ``check_same_thread``)
CONNECT_ARGS: dict[str, Any] = {"timeout": 30.0}
