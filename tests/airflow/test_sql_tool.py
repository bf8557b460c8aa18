"""sql_tool on a real PostgreSQL (127.0.0.1:5432, user postgres): a throwaway database per module, the
Airflow connection from an ``AIRFLOW_CONN_*`` environment variable."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_plan_provider.exceptions import PermanentToolError, TransientToolError
from airflow_plan_provider.tools.registry import ToolRegistry
from airflow_plan_provider.tools.sql import sql_tool
from airflow_plan_provider.tools.sql_check import check_query, parse_table
from airflow_plan_provider.tools.tool import ToolContext, ToolOrigin

psycopg = pytest.importorskip("psycopg")

SERVER = "host=127.0.0.1 port=5432 user=postgres connect_timeout=5"
CONN_ID = "plan_sql_test"
PASSWORD = "pw-Secret-42"  # trust auth ignores it; no message may show it
CTX = ToolContext(node_id="n1", idempotency_key="key-1")
SETUP = """
CREATE TABLE orders (id int PRIMARY KEY, day date, amount numeric(10, 2), note text, paid_at timestamptz);
INSERT INTO orders VALUES
    (1, '2026-01-01', 12.50, 'apple', '2026-01-01 10:00:00+00'),
    (2, '2026-01-02', 7, 'banana', NULL),
    (3, '2026-01-03', 0.10, 'cherry', '2026-01-03 08:30:00+00');
CREATE TABLE secret (id int, v text);
INSERT INTO secret VALUES (1, 'hidden');
CREATE TABLE canary (n int);
CREATE SCHEMA sales;
CREATE TABLE sales.items (id int, name text);
INSERT INTO sales.items VALUES (1, 'pen'), (3, 'ink');
CREATE FUNCTION bump() RETURNS int LANGUAGE plpgsql
    AS $$ BEGIN INSERT INTO canary VALUES (1); RETURN 1; END $$;
"""


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    try:
        admin = psycopg.connect(f"{SERVER} dbname=postgres", autocommit=True)
    except psycopg.OperationalError as error:
        pytest.skip(f"no PostgreSQL on 127.0.0.1:5432: {error}")
    name = f"plan_sql_{uuid.uuid4().hex[:12]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        with psycopg.connect(f"{SERVER} dbname={name}", autocommit=True) as db:
            db.execute(SETUP)
        yield name
    finally:
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        admin.close()


def connection(database: str, **fields: Any) -> str:
    conn = {
        "conn_type": "postgres",
        "host": "127.0.0.1",
        "port": 5432,
        "login": "postgres",
        "password": PASSWORD,
        "schema": database,
    }
    return json.dumps({**conn, **fields})


@pytest.fixture
def conn_id(database: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", connection(database))
    return CONN_ID


def contents(database: str) -> dict[str, Any]:
    """What the tool must never change."""
    with psycopg.connect(f"{SERVER} dbname={database}") as db:
        return {
            "orders": db.execute("SELECT * FROM orders ORDER BY id").fetchall(),
            "secret": db.execute("SELECT * FROM secret").fetchall(),
            "canary": db.execute("SELECT count(*) FROM canary").fetchone(),
            "tables": db.execute(
                "SELECT schemaname, tablename FROM pg_tables WHERE schemaname NOT IN "
                "('pg_catalog', 'information_schema') ORDER BY 1, 2"
            ).fetchall(),
        }


def query(tool_sql: str, conn: str = CONN_ID, **options: Any) -> Any:
    tool = sql_tool(conn, tables=["orders", "sales.items"], **options)
    return tool.call({"sql": tool_sql}, CTX)


def test_rows_and_columns_of_a_real_table_as_json(conn_id: str) -> None:
    out = query("SELECT id, day, amount, note, paid_at FROM orders ORDER BY id")
    assert out == {
        "columns": ["id", "day", "amount", "note", "paid_at"],
        "rows": [
            [1, "2026-01-01", 12.5, "apple", "2026-01-01T10:00:00+00:00"],
            [2, "2026-01-02", 7, "banana", None],
            [3, "2026-01-03", 0.1, "cherry", "2026-01-03T08:30:00+00:00"],
        ],
        "truncated": False,
    }
    assert json.loads(json.dumps(out)) == out


def test_the_row_limit_truncates(conn_id: str) -> None:
    out = query("SELECT id FROM orders ORDER BY id", row_limit=2)
    assert out == {"columns": ["id"], "rows": [[1], [2]], "truncated": True}
    assert query("SELECT id FROM orders ORDER BY id", row_limit=3)["truncated"] is False


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        (
            "WITH big AS (SELECT * FROM orders WHERE amount > 5) "
            "SELECT i.name FROM big JOIN sales.items i ON i.id = big.id ORDER BY 1",
            [["pen"]],
        ),
        ("SELECT count(*) AS n FROM orders -- ; DELETE FROM orders", [[3]]),
        ("SELECT note FROM orders WHERE note LIKE 'b%' /* a comment */;", [["banana"]]),
        ("SELECT extract(year FROM day) AS y, count(*) FROM orders GROUP BY 1", [[2026, 3]]),
        ("SELECT id FROM orders WHERE id IN (SELECT id FROM sales.items) ORDER BY id", [[1], [3]]),
    ],
)
def test_read_queries_run(conn_id: str, sql: str, expected: list[list[Any]]) -> None:
    assert query(sql)["rows"] == expected


REFUSED = [
    ("DELETE FROM orders", "starting with SELECT or WITH"),
    ("UPDATE orders SET note = 'x'", "starting with SELECT or WITH"),
    ("INSERT INTO orders (id) VALUES (9)", "starting with SELECT or WITH"),
    ("DROP TABLE orders", "starting with SELECT or WITH"),
    ("TRUNCATE orders", "starting with SELECT or WITH"),
    ("COPY orders TO STDOUT", "starting with SELECT or WITH"),
    ("SELECT 1; DELETE FROM orders", "only one statement"),
    ("SELECT 1 /* ; */ ; DELETE FROM orders", "only one statement"),
    ("SELECT '\\'; DELETE FROM orders; --'", "backslashes"),
    ("SELECT $$x$$; DELETE FROM orders", "'$'"),
    ("WITH gone AS (DELETE FROM orders RETURNING *) SELECT * FROM gone", "DELETE is not allowed"),
    ("SELECT * INTO orders_copy FROM orders", "INTO is not allowed"),
    ("SELECT * FROM orders FOR UPDATE", "UPDATE is not allowed"),
    ("SELECT * FROM orders UNION TABLE secret", "TABLE is not allowed"),
    ("SELECT set_config('default_transaction_read_only', 'off', false)", "set_config() is not allowed"),
    ("SELECT pg_sleep(30)", "pg_sleep() is not allowed"),
    ("SELECT query_to_xml('SELECT * FROM secret', true, true, '')", "query_to_xml() is not allowed"),
    ("SELECT * FROM secret", "table secret is not one of the allowed tables"),
    ("SELECT * FROM public.secret", "table public.secret is not"),
    ("SELECT * FROM items", "table items is not"),  # only sales.items is allowed
    ('SELECT * FROM "ORDERS"', "table ORDERS is not"),
    ("SELECT * FROM orders, secret", "table secret is not"),
    ("SELECT * FROM orders o JOIN secret s ON s.id = o.id", "table secret is not"),
    ("SELECT * FROM orders WHERE id IN (SELECT id FROM secret)", "table secret is not"),
    ("SELECT array(SELECT v FROM secret)", "table secret is not"),
    ("SELECT DISTINCT FROM secret", "table secret is not"),
    ("WITH s AS (SELECT * FROM secret) SELECT * FROM s", "table secret is not"),
    ("WITH secret AS (SELECT * FROM secret) SELECT * FROM secret", "table secret is not"),
    ("SELECT * FROM orders WHERE EXISTS (WITH s AS (SELECT 1) SELECT * FROM s)", "WITH is allowed only"),
    ("SELECT * FROM pg_catalog.pg_authid", "table pg_catalog.pg_authid is not"),
    ("SELECT * FROM orders CROSS JOIN LATERAL (SELECT * FROM secret) s", "table secret is not"),
]


@pytest.mark.parametrize(("sql", "problem"), REFUSED)
def test_refused_statements_never_reach_the_database(
    conn_id: str, database: str, sql: str, problem: str
) -> None:
    before = contents(database)
    with pytest.raises(PermanentToolError, match="refused before it reached the database") as refused:
        query(sql)
    assert problem in refused.value.reason
    # the same refusal from a tool whose connection does not even exist: nothing was looked up
    with pytest.raises(PermanentToolError) as nowhere:
        query(sql, conn="plan_sql_nowhere")
    assert nowhere.value.reason == refused.value.reason
    assert contents(database) == before


def test_an_unknown_connection_fails_for_good_once_the_query_passes() -> None:
    with pytest.raises(PermanentToolError, match="'plan_sql_nowhere' cannot be read"):
        query("SELECT id FROM orders", conn="plan_sql_nowhere")


def test_the_read_only_transaction_stops_a_write_the_parser_cannot_see(conn_id: str, database: str) -> None:
    with psycopg.connect(f"{SERVER} dbname={database}") as db:  # bump() does write, outside the tool
        assert db.execute("SELECT bump()").fetchone() == (1,)
        assert db.execute("SELECT count(*) FROM canary").fetchone() == (1,)
        db.execute("DELETE FROM canary")
    before = contents(database)
    with pytest.raises(PermanentToolError, match="read-only transaction"):
        query("SELECT bump() FROM orders")
    assert contents(database) == before
    assert before["canary"] == (0,)


def test_a_slow_query_is_cancelled(conn_id: str) -> None:
    with pytest.raises(PermanentToolError, match=r"longer than 0\.3 s"):
        query("SELECT count(*) FROM orders, generate_series(1, 500000000) g", timeout=0.3)


def test_an_sql_error_fails_for_good_with_the_database_message(conn_id: str) -> None:
    with pytest.raises(PermanentToolError, match='column "nope" does not exist'):
        query("SELECT nope FROM orders")


def test_a_connection_that_fails_is_transient_and_shows_no_password(
    database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_PLAN_SQL_CLOSED", connection(database, port=1))
    with pytest.raises(TransientToolError, match="could not be reached") as closed:
        query("SELECT id FROM orders", conn="plan_sql_closed")
    assert PASSWORD not in str(closed.value)
    # a database named like the password: the server's message would carry it
    monkeypatch.setenv("AIRFLOW_CONN_PLAN_SQL_LEAKY", connection(database, schema=PASSWORD))
    with pytest.raises(TransientToolError) as leaky:
        query("SELECT id FROM orders", conn="plan_sql_leaky")
    assert 'database "***" does not exist' in str(leaky.value)
    assert PASSWORD not in str(leaky.value)


def test_the_tool_is_built_without_io_and_tells_the_planner_the_tables() -> None:
    tool = sql_tool("no_such_conn", tables=["orders", "sales.items"], row_limit=50, pool="warehouse")
    assert tool.name == "query_no_such_conn"
    assert tool.origin == ToolOrigin(kind="sql", conn_id="no_such_conn")
    assert "orders, sales.items" in tool.description and "at most 50 rows" in tool.description
    assert tool.args_schema["required"] == ["sql"] and tool.pool == "warehouse"
    assert not tool.needs_approval and not tool.wants_ctx
    assert list(tool.validator.iter_errors({"sql": "SELECT 1", "conn_id": "other"}))  # no other params
    assert ToolRegistry([tool]).catalog()[0]["name"] == "query_no_such_conn"


@pytest.mark.parametrize("tables", [[], "orders", ["orders; drop"], ["a.b.c.d"], ["orders("]])
def test_bad_table_lists_are_refused_when_the_tool_is_built(tables: Any) -> None:
    with pytest.raises(ValueError):
        sql_tool("warehouse", tables=tables)


def test_table_names_fold_as_postgresql_does() -> None:
    assert parse_table('Sales."Items"') == ("sales", "Items")
    allowed = [parse_table('Sales."Items"')]
    assert check_query('select * from SALES."Items";', allowed) == 'select * from SALES."Items"'
    with pytest.raises(PermanentToolError, match=r"table sales\.items is not"):
        check_query("select * from sales.items", allowed)
