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
from airflow_plan_provider.tools.registry import Tool, ToolOrigin

DEFAULT_ROW_LIMIT = 1000
DEFAULT_TIMEOUT = 30.0  # seconds a query may run (PostgreSQL's statement_timeout)
MAX_SQL_CHARS = 20_000
MAX_ERROR_CHARS = 1000
POSTGRES_CONN_TYPES = frozenset({"postgres", "postgresql"})  # READ ONLY, statement_timeout, server cursor

# fmt: off
#: words that start, or smuggle in, something other than one query; refused anywhere unquoted
FORBIDDEN_WORDS = frozenset((
    "INSERT", "UPDATE", "DELETE", "MERGE", "UPSERT", "CREATE", "ALTER", "DROP", "TRUNCATE", "GRANT",
    "REVOKE", "COPY", "INTO", "CALL", "EXEC", "EXECUTE", "DO", "SET", "RESET", "LOCK", "UNLOCK",
    "VACUUM", "ANALYZE", "ANALYSE", "COMMIT", "ROLLBACK", "BEGIN", "START", "SAVEPOINT", "RELEASE",
    "PREPARE", "DEALLOCATE", "DECLARE", "LISTEN", "NOTIFY", "UNLISTEN", "REFRESH", "CLUSTER", "REINDEX",
    "COMMENT", "LOAD", "ATTACH", "DETACH", "PRAGMA", "IMPORT", "EXPORT", "OUTFILE", "DUMPFILE",
    "HANDLER", "TABLE", "RETURNING", "SHARE", "DISCARD", "UESCAPE", "USE",
))
# fmt: on
# fmt: off
#: functions that write, wait, signal, read files or other tables, or run SQL given as a string
FORBIDDEN_FUNCTIONS = frozenset((
    "set_config", "nextval", "setval", "currval", "lastval", "txid_current", "sleep", "benchmark",
    "load_file", "sys_exec", "sys_eval", "openrowset", "opendatasource", "openquery", "load_extension",
    "readfile", "writefile", "edit", "fts3_tokenizer", "ts_stat", "ts_rewrite", "crosstab", "crosstab2",
    "crosstab3", "crosstab4", "connectby", "glob", "parquet_scan", "sniff_csv",
))
# fmt: on
FORBIDDEN_FUNCTION_PREFIXES = ("pg_", "lo_", "dblink", "xp_", "sp_", "read_")  # read_csv...: files
FORBIDDEN_FUNCTION_PARTS = ("to_xml",)  # query_to_xml, table_to_xml, ...: SQL or tables given by name
# fmt: off
#: keywords that end a FROM clause
CLAUSE_ENDS = frozenset((
    "WHERE", "GROUP", "HAVING", "WINDOW", "ORDER", "LIMIT", "OFFSET", "FETCH", "UNION", "INTERSECT",
    "EXCEPT", "FOR",
))
# fmt: on
#: keywords whose parenthesised arguments may say FROM without naming a table
CALL_KEYWORDS = frozenset(["EXTRACT", "SUBSTRING", "TRIM", "OVERLAY", "POSITION"])

TableName = tuple[str, ...]


class _Refused(Exception):
    """Why a query is refused (turned into a PermanentToolError)."""


@dataclass(frozen=True)
class _Tok:
    kind: str  # "word" (unquoted), "name" (quoted identifier), "string", "(", ")", ",", ".", ";", "other"
    text: str
    keyword: bool = False  # a word sqlparse knows as a keyword (not a plain name)

    @property
    def word(self) -> str:
        return " ".join(self.text.upper().split()) if self.kind == "word" else ""

    def ident(self) -> str:
        """The identifier, folded as PostgreSQL does: unquoted lower-cased, quoted as written."""
        if self.kind == "word":
            return self.text.lower()
        body = self.text[1:-1]
        return body.replace('""', '"') if self.text.startswith('"') else body


def _lex(sql: str) -> tuple[str, list[_Tok]]:
    """The text without comments, and its tokens (whitespace and comments left out)."""
    import sqlparse
    from sqlparse import tokens as T

    kept: list[str] = []
    toks: list[_Tok] = []
    for token in (t for statement in sqlparse.parse(sql) for t in statement.flatten()):  # type: ignore[no-untyped-call]
        ttype, value = token.ttype, token.value
        if ttype in T.Comment:
            kept.append(" ")
            continue
        kept.append(value)
        if token.is_whitespace:
            continue
        if ttype in T.String.Symbol or (ttype in T.Name and value[:1] in '`["'):
            toks.append(_Tok("name", value))
        elif ttype in T.String:
            toks.append(_Tok("string", value))
        elif ttype in T.Keyword or ttype in T.Name:
            toks.append(_Tok("word", value, keyword=ttype in T.Keyword))
        elif ttype in T.Punctuation and value in {"(", ")", ",", ".", ";"}:
            toks.append(_Tok(value, value))
        else:
            toks.append(_Tok("other", value))
    return "".join(kept), toks


def parse_table(spec: str) -> TableName:
    """``"public.orders"`` → ``("public", "orders")``; raises ``ValueError`` for anything but a name of one
    to three dotted parts."""
    _, toks = _lex(spec) if isinstance(spec, str) else ("", [])
    parts = [tok.ident() for tok in toks[::2] if tok.kind in ("word", "name")]
    if not toks or len(toks) % 2 == 0 or len(parts) != (len(toks) + 1) // 2 or len(parts) > 3:
        raise ValueError(f"allowed table {spec!r} must be a table name, optionally schema-qualified")
    if any(tok.kind != "." for tok in toks[1::2]):
        raise ValueError(f"allowed table {spec!r} must be a table name, optionally schema-qualified")
    return tuple(parts)


def check_query(sql: str, tables: Sequence[TableName]) -> str:
    """The text to send for ``sql``, comments stripped, when it is one read query over ``tables``
    (and the names of its own ``WITH`` queries); otherwise :class:`PermanentToolError` naming the problem."""
    try:
        return _check(sql, frozenset(tables))
    except _Refused as refused:
        raise PermanentToolError(f"query refused before it reached the database: {refused}") from None


def _check(sql: str, allowed: frozenset[TableName]) -> str:
    if not isinstance(sql, str) or not sql.strip():
        raise _Refused("sql is empty")
    if len(sql) > MAX_SQL_CHARS:
        raise _Refused(f"sql is longer than {MAX_SQL_CHARS} characters")
    if "\\" in sql:
        raise _Refused("backslashes are not allowed (databases disagree on what they escape)")
    text, toks = _lex(sql)
    if any("$" in tok.text for tok in toks if tok.kind != "string"):
        raise _Refused("'$' (dollar quoting, positional parameters) is not allowed outside a string")
    while toks and toks[-1].kind == ";":
        toks.pop()
        text = text.rstrip()[:-1]
    if any(tok.kind == ";" for tok in toks):
        raise _Refused("only one statement may run (found ';' before the end)")
    if not toks:
        raise _Refused("sql holds no statement")
    if toks[0].word not in ("SELECT", "WITH"):
        raise _Refused(f"only a query starting with SELECT or WITH may run, not {toks[0].text!r}")
    for tok in toks:
        if bad := next((part for part in tok.word.split() if part in FORBIDDEN_WORDS), None):
            raise _Refused(
                f"{bad} is not allowed in a read-only query (write a column of that name in double quotes)"
            )
    for k, tok in enumerate(toks[:-1]):
        if tok.kind in ("word", "name") and toks[k + 1].kind == "(" and _forbidden_function(tok.ident()):
            raise _Refused(f"function {tok.ident()}() is not allowed (it may write, wait or read outside)")
    main, bodies, names = _split_with(toks)
    for start, end, visible in bodies:
        _check_tables(toks[start:end], visible, allowed)
    _check_tables(toks[main:], names, allowed)
    return text.strip()


def _forbidden_function(name: str) -> bool:
    name = name.lower()
    return (
        name in FORBIDDEN_FUNCTIONS
        or name.startswith(FORBIDDEN_FUNCTION_PREFIXES)
        or any(part in name for part in FORBIDDEN_FUNCTION_PARTS)
    )


def _closing(toks: list[_Tok], start: int) -> int:
    """The index of the parenthesis closing the one at ``start``."""
    depth = 0
    for k in range(start, len(toks)):
        depth += {"(": 1, ")": -1}.get(toks[k].kind, 0)
        if depth == 0:
            return k
    raise _Refused("unbalanced parentheses")


def _split_with(
    toks: list[_Tok],
) -> tuple[int, list[tuple[int, int, frozenset[str]]], frozenset[str]]:
    """Where the main query starts; each ``WITH`` query's body (start, end) with the ``WITH`` names
    visible in it (earlier ones; itself too under RECURSIVE); every ``WITH`` name."""
    if toks[0].word != "WITH":
        return 0, [], frozenset()
    k = 1
    recursive = toks[k].word == "RECURSIVE"
    k += recursive
    names: list[str] = []
    bodies: list[tuple[int, int, frozenset[str]]] = []
    while True:
        if k >= len(toks) or toks[k].kind not in ("word", "name"):
            raise _Refused("WITH must be followed by name AS (query)")
        names.append(toks[k].ident())
        k += 1
        if k < len(toks) and toks[k].kind == "(":  # column names
            k = _closing(toks, k) + 1
        if k >= len(toks) or toks[k].word != "AS":
            raise _Refused("WITH must be followed by name AS (query)")
        k += 1
        while k < len(toks) and toks[k].word in ("NOT", "MATERIALIZED"):
            k += 1
        if k >= len(toks) or toks[k].kind != "(":
            raise _Refused("WITH must be followed by name AS (query)")
        end = _closing(toks, k)
        bodies.append((k + 1, end, frozenset(names if recursive else names[:-1])))
        k = end + 1
        if k < len(toks) and toks[k].kind == ",":
            k += 1
            continue
        if k >= len(toks) or toks[k].word != "SELECT":
            raise _Refused("a WITH query must end in SELECT")
        return k, bodies, frozenset(names)


@dataclass
class _Frame:
    """One parenthesis level of the query."""

    ctes: frozenset[str]
    call: bool = False  # the parenthesis holds a function's arguments
    selects: bool = False  # a SELECT was seen at this level
    in_from: bool = False  # inside a FROM clause
    expect: bool = False  # a table (or subquery, or function) comes next


def _check_tables(toks: list[_Tok], ctes: frozenset[str], allowed: frozenset[TableName]) -> None:
    """Every table read at any level of ``toks`` is allowed or a ``WITH`` name in ``ctes``."""
    stack = [_Frame(ctes)]
    k = 0
    while k < len(toks):
        tok, frame = toks[k], stack[-1]
        before = [t.word for t in toks[max(0, k - 2) : k]]
        word = tok.word.split()[-1] if tok.word else ""
        if tok.kind == "(":
            prev = toks[k - 1] if k else None
            call = prev is not None and (
                prev.kind == "name"
                or (prev.kind == "word" and (not prev.keyword or prev.word in CALL_KEYWORDS))
            )
            stack.append(
                _Frame(ctes, call=call and not frame.expect, in_from=frame.expect, expect=frame.expect)
            )
            frame.expect = False
        elif tok.kind == ")":
            if len(stack) == 1:
                raise _Refused("unbalanced parentheses")
            stack.pop()
        elif word in ("SELECT", "VALUES"):
            frame.selects, frame.in_from, frame.expect = True, False, False
        elif word == "WITH":
            raise _Refused("WITH is allowed only at the start of the query")
        elif word == "FROM":
            compares = before[-1:] == ["DISTINCT"] and before[:1] in (["IS"], ["NOT"])
            if not compares and not (frame.call and not frame.selects):
                frame.in_from = frame.expect = True
        elif word == "JOIN":
            frame.in_from = frame.expect = True
        elif tok.word.split()[:1] and tok.word.split()[0] in CLAUSE_ENDS:
            frame.in_from = frame.expect = False
        elif tok.kind == "," and frame.in_from:
            frame.expect = True
        elif frame.expect and word in ("ONLY", "LATERAL", "ROWS"):
            pass
        elif frame.expect and tok.kind in ("word", "name"):
            parts = [tok]
            while k + 2 < len(toks) and toks[k + 1].kind == "." and toks[k + 2].kind in ("word", "name"):
                parts.append(toks[k + 2])
                k += 2
            frame.expect = False
            if k + 1 >= len(toks) or toks[k + 1].kind != "(":  # a table, not a table function
                _allow(tuple(part.ident() for part in parts), frame.ctes, allowed)
        elif frame.expect:
            raise _Refused(f"cannot read the FROM clause near {tok.text!r}")
        k += 1
    if len(stack) != 1:
        raise _Refused("unbalanced parentheses")


def _allow(name: TableName, ctes: frozenset[str], allowed: frozenset[TableName]) -> None:
    if (len(name) == 1 and name[0] in ctes) or name in allowed:
        return
    listed = ", ".join(".".join(table) for table in sorted(allowed))
    raise _Refused(f"table {'.'.join(name)} is not one of the allowed tables ({listed}), written as listed")


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


__all__ = ["SqlQuery", "check_query", "parse_table", "sql_tool"]
