"""The check a :func:`~airflow_plan_provider.tools.sql.sql_tool` query passes before anything reaches
the database: one read statement over the allowed tables.

:func:`check_query` tokenizes with sqlparse (common-sql's dependency), then walks each parenthesis level:
a statement word, a function known to write, wait or read files, a second statement, or a table after
``FROM``/``JOIN`` that is not allowed (``WITH`` names visible where PostgreSQL sees them) is refused with a
:class:`~airflow_plan_provider.exceptions.PermanentToolError` naming it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from airflow_plan_provider.exceptions import PermanentToolError

MAX_SQL_CHARS = 20_000
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
