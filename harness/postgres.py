"""A fresh, throw-away PostgreSQL database on a running server, for an ``AirflowCluster``'s metadata DB.

Example::

    with PostgresDatabase() as db, AirflowCluster(dags, database_url=db.url, ...) as cluster:
        ...

The database is created on entry and dropped on exit (``DROP DATABASE ... WITH (FORCE)``, so connections
a killed process left behind do not keep it alive). Needs ``psycopg2`` (the driver Airflow's sync URL
uses) and ``asyncpg`` (the one Airflow derives its async URL for).
"""

from __future__ import annotations

import secrets
import urllib.parse
from typing import Any

__all__ = ["DEFAULT_SERVER", "PostgresDatabase"]

#: A local server with trust authentication for the ``postgres`` user (as in CI).
DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"


class PostgresDatabase:
    """Create a database named ``<prefix>_<random hex>`` on ``server``; drop it on ``drop()`` / exit.

    :param server: libpq URL of an existing database on the server, used to create and drop ours.
    :param prefix: start of the database name.
    """

    def __init__(self, server: str = DEFAULT_SERVER, *, prefix: str = "plan_e2e") -> None:
        if not prefix.isidentifier():
            raise ValueError(f"database prefix {prefix!r} must be letters, digits and '_'")
        self.server = server
        self.name = f"{prefix}_{secrets.token_hex(6)}".lower()
        parts = urllib.parse.urlsplit(server)
        #: SQLAlchemy URL of the new database (psycopg2 driver), for ``AirflowCluster(database_url=...)``.
        self.url = urllib.parse.urlunsplit(
            ("postgresql+psycopg2", parts.netloc, f"/{self.name}", parts.query, "")
        )
        self.created = False

    def _execute(self, statement: str) -> None:
        try:
            import psycopg2
        except ImportError as exc:  # pragma: no cover - psycopg2 is a dev dependency
            raise RuntimeError("PostgresDatabase needs psycopg2 (pip install psycopg2-binary)") from exc
        conn: Any = psycopg2.connect(self.server, connect_timeout=10)
        try:
            conn.autocommit = True  # CREATE/DROP DATABASE cannot run inside a transaction
            with conn.cursor() as cur:
                cur.execute(statement)
        finally:
            conn.close()

    def run(self, *statements: str) -> None:
        """Run ``statements`` in the new database, in one transaction (a test's tables and rows)."""
        import psycopg2

        conn: Any = psycopg2.connect(
            self.url.replace("postgresql+psycopg2", "postgresql"), connect_timeout=10
        )
        try:
            with conn, conn.cursor() as cur:
                for statement in statements:
                    cur.execute(statement)
        finally:
            conn.close()

    def connection(self) -> dict[str, Any]:
        """The database as an Airflow connection of conn type ``postgres`` (the JSON of an
        ``AIRFLOW_CONN_<ID>`` variable, as a dict)."""
        parts = urllib.parse.urlsplit(self.server)
        return {
            "conn_type": "postgres",
            "host": parts.hostname or "127.0.0.1",
            "port": parts.port or 5432,
            "login": parts.username or "postgres",
            "schema": self.name,
        }

    def create(self) -> PostgresDatabase:
        self._execute(f'CREATE DATABASE "{self.name}"')
        self.created = True
        return self

    def drop(self) -> None:
        """Drop the database (idempotent), closing any connection still open to it."""
        if self.created:
            self._execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
            self.created = False

    def __enter__(self) -> PostgresDatabase:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.drop()
