"""http_tool against a real HTTP server on 127.0.0.1 (a thread of the test), through an Airflow
connection from an ``AIRFLOW_CONN_*`` environment variable."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from airflow_plan_provider.exceptions import PermanentToolError, TransientToolError
from airflow_plan_provider.tools.http import http_tool
from airflow_plan_provider.tools.tool import Tool, ToolContext, ToolOrigin

CONN_ID = "plan_http_test"
CTX = ToolContext(node_id="n1", idempotency_key="idem-123", attempt=2)
DAY_SCHEMA = {
    "type": "object",
    "properties": {"day": {"type": "string"}, "limit": {"type": "integer"}, "tags": {"type": "array"}},
    "required": ["day"],
}


class Handler(BaseHTTPRequestHandler):
    """Records every request; answers by the path's first segment."""

    seen: list[dict[str, Any]] = []

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        self.seen.append(
            {"method": self.command, "path": self.path, "headers": dict(self.headers), "body": body}
        )
        first = self.path.split("?")[0].split("/")[1]
        status, headers, payload = {
            "orders": (200, {"Content-Type": "application/json"}, json.dumps({"path": self.path}).encode()),
            "text": (200, {"Content-Type": "text/plain; charset=utf-8"}, b"plain words"),
            "empty": (204, {}, b""),
            "big": (200, {"Content-Type": "application/json"}, b'"' + b"x" * 5000 + b'"'),
            "fail": (500, {"Content-Type": "text/plain"}, b"database on fire"),
            "busy": (429, {"Retry-After": "7"}, b"slow down"),
            "moved": (302, {"Location": "http://127.0.0.1:1/elsewhere"}, b""),
        }.get(first, (404, {"Content-Type": "text/plain"}, b"no such thing: " + self.path.encode()))
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_DELETE = do_PUT = answer


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadingHTTPServer]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def seen(server: ThreadingHTTPServer, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    port = server.server_address[1]
    conn = {"conn_type": "http", "host": "127.0.0.1", "port": port, "schema": "http"}
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(conn))
    Handler.seen.clear()
    return Handler.seen


def tool(path: str = "/orders/{day}", method: str = "GET", **options: Any) -> Tool:
    options.setdefault("args_schema", DAY_SCHEMA)
    return http_tool(CONN_ID, name="orders", method=method, path=path, description="orders", **options)


def test_get_fills_the_path_and_sends_the_rest_as_the_query(seen: list[dict[str, Any]]) -> None:
    out = tool().call({"day": "2026-01-01", "limit": 5, "tags": ["a", "b"]}, CTX)
    assert out == {"path": "/orders/2026-01-01?limit=5&tags=a&tags=b"}
    assert [request["path"] for request in seen] == ["/orders/2026-01-01?limit=5&tags=a&tags=b"]
    assert seen[0]["headers"]["Idempotency-Key"] == "idem-123"


@pytest.mark.parametrize(
    ("day", "sent"),
    [
        ("../admin", "/orders/..%2Fadmin"),
        ("x?admin=1#frag", "/orders/x%3Fadmin%3D1%23frag"),
        ("@evil.example", "/orders/%40evil.example"),
        ("//evil.example/x", "/orders/%2F%2Fevil.example%2Fx"),
        ("%2e%2e", "/orders/%252e%252e"),
        ("a b", "/orders/a%20b"),
    ],
)
def test_path_params_are_quoted_as_one_segment(seen: list[dict[str, Any]], day: str, sent: str) -> None:
    assert tool().call({"day": day}, CTX) == {"path": sent}
    assert [request["path"] for request in seen] == [sent]


@pytest.mark.parametrize("day", ["..", ".", ""])
def test_dot_segments_are_refused_before_any_request(seen: list[dict[str, Any]], day: str) -> None:
    with pytest.raises(PermanentToolError, match="path parameter 'day' cannot be"):
        tool().call({"day": day}, CTX)
    assert seen == []


def test_no_param_can_name_another_path_or_host(seen: list[dict[str, Any]]) -> None:
    strict = {**DAY_SCHEMA, "additionalProperties": False}
    assert list(tool(args_schema=strict).validator.iter_errors({"day": "d", "url": "http://evil/"}))
    # params the schema lets through still go to the query string of the declared path
    out = tool().call({"day": "d", "path": "/admin", "url": "http://evil.example/"}, CTX)
    assert out == {"path": "/orders/d?path=%2Fadmin&url=http%3A%2F%2Fevil.example%2F"}
    assert len(seen) == 1


@pytest.mark.parametrize(
    "path",
    [
        "orders",
        "http://evil.example/orders",
        "//evil.example/x",
        "/orders?x=1",
        "/a/../b",
        "/orders/{day!r}",
        "/{x}",
    ],
)
def test_undeclarable_paths_are_refused_when_the_tool_is_built(path: str) -> None:
    with pytest.raises(ValueError):
        tool(path=path)


def test_post_sends_the_rest_as_json_with_the_idempotency_key(seen: list[dict[str, Any]]) -> None:
    post = tool(method="POST")
    assert post.needs_approval and post.wants_ctx
    assert post.origin == ToolOrigin(kind="http", conn_id=CONN_ID, name="POST /orders/{day}")
    post.call({"day": "2026-01-02", "limit": 3}, CTX)
    assert seen[0]["method"] == "POST" and seen[0]["path"] == "/orders/2026-01-02"
    assert json.loads(seen[0]["body"]) == {"limit": 3}
    assert seen[0]["headers"]["Idempotency-Key"] == "idem-123"
    assert seen[0]["headers"]["Content-Type"] == "application/json"


def test_text_and_empty_responses(seen: list[dict[str, Any]]) -> None:
    assert tool(path="/text/{day}").call({"day": "d"}, CTX) == "plain words"
    assert tool(path="/empty/{day}").call({"day": "d"}, CTX) is None


def test_a_500_is_transient(seen: list[dict[str, Any]]) -> None:
    with pytest.raises(TransientToolError, match=r"HTTP 500.*database on fire"):
        tool(path="/fail/{day}").call({"day": "d"}, CTX)


def test_a_429_is_transient_with_its_retry_after(seen: list[dict[str, Any]]) -> None:
    with pytest.raises(TransientToolError, match="HTTP 429") as busy:
        tool(path="/busy/{day}").call({"day": "d"}, CTX)
    assert busy.value.retry_after == 7.0


def test_a_404_fails_for_good_with_the_start_of_the_body(seen: list[dict[str, Any]]) -> None:
    with pytest.raises(PermanentToolError, match=r"HTTP 404 Not Found: no such thing: /nowhere/d") as missing:
        tool(path="/nowhere/{day}").call({"day": "d"}, CTX)
    assert "GET /nowhere/{day}" in missing.value.reason


def test_redirects_are_not_followed(seen: list[dict[str, Any]]) -> None:
    with pytest.raises(PermanentToolError, match="redirects are not followed"):
        tool(path="/moved/{day}").call({"day": "d"}, CTX)
    assert len(seen) == 1


def test_a_response_over_the_cap_fails(seen: list[dict[str, Any]]) -> None:
    assert len(tool(path="/big/{day}", max_response_bytes=6000).call({"day": "d"}, CTX)) == 5000
    with pytest.raises(PermanentToolError, match="over 1000 bytes"):
        tool(path="/big/{day}", max_response_bytes=1000).call({"day": "d"}, CTX)


def test_a_closed_port_is_transient(monkeypatch: pytest.MonkeyPatch) -> None:
    conn = {"conn_type": "http", "host": "127.0.0.1", "port": 1, "schema": "http"}
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(conn))
    with pytest.raises(TransientToolError, match="could not be reached"):
        tool().call({"day": "d"}, CTX)


def test_an_unknown_connection_fails_for_good() -> None:
    unknown = http_tool("plan_http_nowhere", name="x", method="GET", path="/x", args_schema={
        "type": "object", "properties": {}}, description="x")  # fmt: skip
    with pytest.raises(PermanentToolError, match="'plan_http_nowhere' cannot be read"):
        unknown.call({}, CTX)


def test_the_idempotency_header_can_be_left_out(seen: list[dict[str, Any]]) -> None:
    tool(idempotency_header=None).call({"day": "d"}, CTX)
    assert "Idempotency-Key" not in seen[0]["headers"]
