"""Read-only SQL over an Airflow connection, as a plan tool.

::

    registry = ToolRegistry()
    registry.add(sql_tool("warehouse", tables=["orders", "public.customers"], row_limit=500))

The tool takes one param, ``sql``, and returns ``{"columns": [...], "rows": [[...], ...], "truncated":
bool}`` (values made JSON-able: dates as ISO strings, decimals as numbers, bytes as hex). Any
connection whose hook is a common-sql ``DbApiHook`` works; only the DAG names it.

Before anything reaches the database, :func:`check_query` refuses all but one read statement: a single
``SELECT`` (or ``WITH ... SELECT``) reading only the listed tables (written as listed: ``orders`` and
``public.orders`` are different entries), with no statement word (``INSERT``, ``DROP``, ``COPY``,
``INTO``, ``SET``, ``FOR UPDATE``...), no second statement, no backslash or ``$`` (where databases and
the parser disagree on where a string ends) and no call of a function known to write, wait, read files or
run SQL from a string (``pg_*``, ``lo_*``, ``dblink*``, ``query_to_xml``, ``set_config``, ``nextval``...).
Comments are stripped, and the text sent is the text checked. Names follow PostgreSQL's folding: an
unquoted name is lower-cased, a quoted one kept as written.

The parser is a fence, not the wall: on PostgreSQL the query also runs in a ``READ ONLY`` transaction with
a ``statement_timeout`` and a server-side cursor (so only ``row_limit + 1`` rows leave the server), and the
transaction is rolled back. Other databases get the parser only: give the connection a user that can
only read. A connection that fails is transient (Airflow retries the node); an SQL error fails the node
for good with the database's message (the connection's password replaced by ``***``).
"""

from __future__ import annotations

import copy
import datetime
import decimal
import math
import re
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, quote_plus

from airflow_plan_provider.exceptions import PermanentToolError, TransientToolError
from airflow_plan_provider.tools.sql_check import MAX_SQL_CHARS, TableName, check_query, parse_table
from airflow_plan_provider.tools.tool import Tool, ToolOrigin

DEFAULT_ROW_LIMIT = 1000
DEFAULT_TIMEOUT = 30.0  # seconds a query may run (PostgreSQL's statement_timeout)
MAX_ERROR_CHARS = 1000
POSTGRES_CONN_TYPES = frozenset({"postgres", "postgresql"})  # READ ONLY, statement_timeout, server cursor


@dataclass(frozen=True)
class SqlQuery:
    """The function of a :func:`sql_tool`: checks ``sql`` and runs it read-only."""

    conn_id: str
    tables: tuple[TableName, ...]
    row_limit: int = DEFAULT_ROW_LIMIT
    timeout: float = DEFAULT_TIMEOUT

    def __call__(self, sql: str) -> dict[str, Any]:
        query = check_query(sql, self.tables)
        hook, postgres, secrets = _hook(self.conn_id)
        columns, rows = _run(hook, postgres, query, self.row_limit, self.timeout, secrets)
        return {
            "columns": columns,
            "rows": [_json_row(row) for row in rows[: self.row_limit]],
            "truncated": len(rows) > self.row_limit,
        }


def _hook(conn_id: str) -> tuple[Any, bool, tuple[str, ...]]:
    """The connection's ``DbApiHook``, whether it is PostgreSQL, and the secrets errors must not show."""
    from airflow.providers.common.sql.hooks.sql import DbApiHook
    from airflow.sdk import BaseHook

    from airflow_plan_provider.compat import mask_secret

    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception as error:
        cls = PermanentToolError if "NotFound" in type(error).__name__ else TransientToolError
        raise cls(f"SQL connection {conn_id!r} cannot be read: {error}") from None
    secrets = (conn.password,) if conn.password else ()
    for secret in secrets:
        mask_secret(secret)
    try:
        hook = conn.get_hook()
    except Exception as error:
        raise PermanentToolError(
            _redact(f"connection {conn_id!r} has no usable SQL hook: {error}", secrets)
        ) from None
    if not isinstance(hook, DbApiHook):
        raise PermanentToolError(f"connection {conn_id!r} (type {conn.conn_type}) is not an SQL connection")
    return hook, conn.conn_type in POSTGRES_CONN_TYPES, secrets


def _run(
    hook: Any, postgres: bool, sql: str, row_limit: int, timeout: float, secrets: tuple[str, ...]
) -> tuple[list[str], list[Any]]:
    try:
        conn = hook.get_conn()
    except Exception as error:
        raise _db_error(error, secrets, timeout) from None
    try:
        if postgres:
            conn.autocommit = False
            with conn.cursor() as setup:  # the first statements of the transaction
                setup.execute("SET TRANSACTION READ ONLY")
                setup.execute(f"SET LOCAL statement_timeout = {max(1, int(timeout * 1000))}")
            cursor = conn.cursor(name="plan_sql_tool")  # server-side: only the rows fetched leave
        else:
            with suppress(Exception):
                hook.set_autocommit(conn, False)
            cursor = conn.cursor()
        try:
            cursor.execute(sql)
            rows = cursor.fetchmany(row_limit + 1)
            columns = [str(column[0]) for column in cursor.description or ()]
        finally:
            with suppress(Exception):
                cursor.close()
        return columns, list(rows)
    except Exception as error:
        raise _db_error(error, secrets, timeout) from None
    finally:
        with suppress(Exception):
            conn.rollback()
        with suppress(Exception):
            conn.close()


# SQLSTATE classes worth a retry: connection exception, insufficient resources, serialization failure,
# deadlock, server shutting down
TRANSIENT_SQLSTATES = ("08", "53", "40001", "40P01", "57P01", "57P02", "57P03")
QUERY_CANCELED = "57014"


def _db_error(error: Exception, secrets: tuple[str, ...], timeout: float) -> Exception:
    message = _redact(str(error).strip() or type(error).__name__, secrets)[:MAX_ERROR_CHARS]
    state = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
    if state == QUERY_CANCELED:
        return PermanentToolError(f"the query ran longer than {timeout:g} s and was cancelled: {message}")
    if state:
        transient = str(state).startswith(TRANSIENT_SQLSTATES)
    else:  # DB-API: OperationalError and InterfaceError are the connection's, the rest the query's
        transient = any(cls.__name__ in ("OperationalError", "InterfaceError") for cls in type(error).__mro__)
    if transient:
        return TransientToolError(f"the database could not be reached or gave up: {message}")
    return PermanentToolError(f"the database refused the query: {message}")


def _redact(text: str, secrets: tuple[str, ...]) -> str:
    for secret in secrets:
        for form in {secret, quote(secret, safe=""), quote_plus(secret)}:
            text = text.replace(form, "***")
    return text


def _json_row(row: Any) -> list[Any]:
    values = row.values() if isinstance(row, Mapping) else row
    return [_json_value(value) for value in values]


def _json_value(value: Any) -> Any:
    """``value`` as JSON can carry it."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            return str(value)
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, Mapping):
        return {str(key): _json_value(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_json_value(item) for item in value]
    return str(value)  # UUIDs, network addresses, ranges...


SQL_ARGS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "sql": {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_SQL_CHARS,
            "description": "one SELECT (or WITH ... SELECT) statement",
        }
    },
    "required": ["sql"],
    "additionalProperties": False,
}


def sql_tool(
    conn_id: str,
    *,
    tables: Sequence[str],
    name: str | None = None,
    row_limit: int = DEFAULT_ROW_LIMIT,
    description: str | None = None,
    pool: str | None = None,
    pool_slots: int = 1,
    timeout: float = DEFAULT_TIMEOUT,
) -> Tool:
    """A tool running one read-only query on the database of Airflow connection ``conn_id``.

    Building it does no I/O (the connection is read when a node calls the tool).

    :param conn_id: an Airflow connection whose hook is a common-sql ``DbApiHook``.
    :param tables: the tables the query may read, optionally schema-qualified (``"public.orders"``).
    :param name: the tool's name; default ``query_<conn_id>`` (other characters as ``_``).
    :param row_limit: at most this many rows are returned (``truncated`` says when there were more).
    :param description: what the planner is told the tool is for; the allowed tables and limits follow.
    :param pool: an Airflow pool the nodes calling the tool take ``pool_slots`` of.
    :param pool_slots: the pool's slots one node takes.
    :param timeout: seconds a query may run before the database cancels it (PostgreSQL).
    """
    if not isinstance(conn_id, str) or not conn_id:
        raise ValueError("conn_id must be a non-empty string")
    if isinstance(tables, str) or not tables:
        raise ValueError("tables must be a non-empty list of table names")
    if isinstance(row_limit, bool) or not isinstance(row_limit, int) or row_limit < 1:
        raise ValueError(f"row_limit must be an integer >= 1, got {row_limit!r}")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    parsed = tuple(parse_table(table) for table in tables)
    lead = description or f"Run one read-only SQL query on the database of Airflow connection `{conn_id}`."
    text = (
        f"{lead} One SELECT (or WITH ... SELECT) statement reading only these tables, written as listed: "
        f"{', '.join(tables)}. Returns {{columns, rows, truncated}}: at most {row_limit} rows (truncated "
        f"is true when there were more); the query is cancelled after {timeout:g} s. No comments needed; "
        "write a column named like an SQL keyword in double quotes."
    )
    return Tool(
        name=name or "query_" + re.sub(r"[^A-Za-z0-9_]", "_", conn_id),
        description=text,
        func=SqlQuery(conn_id, parsed, row_limit, timeout),
        args_schema=copy.deepcopy(SQL_ARGS_SCHEMA),
        pool=pool,
        pool_slots=pool_slots,
        origin=ToolOrigin(kind="sql", conn_id=conn_id),
    )
