"""One endpoint behind an Airflow HTTP connection, as a plan tool.

::

    registry.add(
        http_tool(
            "orders_api",
            name="get_orders",
            method="GET",
            path="/orders/{day}",
            args_schema={
                "type": "object",
                "properties": {"day": {"type": "string", "format": "date"}, "limit": {"type": "integer"}},
                "required": ["day"],
                "additionalProperties": False,
            },
            description="The orders of one day",
        )
    )

The DAG declares the endpoint: the method, and a path template whose ``{placeholders}`` are filled
from params of the same name, each URL-quoted as one path segment (``/``, ``?``, ``#``, ``@`` and ``%``
are encoded; ``.``, ``..`` and empty values are refused), so a param can never change the path, add a
query or name a host. The base URL (and the credentials) come only from the connection
(``airflow.providers.http``'s ``HttpHook``). The other params go as the query string (GET, HEAD,
DELETE) or as the JSON body (POST, PUT, PATCH). Redirects are not followed.

A node calling the tool sends its idempotency key in the ``Idempotency-Key`` header (renamed or left out
with ``idempotency_header``). The output is the response's JSON when it says it is JSON, its text
otherwise (``None`` when empty); a body over ``max_response_bytes`` fails the node. 5xx, 408, 429 (with
``Retry-After``) and connection failures are transient: Airflow retries the node with the same key. Any
other status from 300 up fails the node for good with the status and the start of the body.
"""

from __future__ import annotations

import copy
import email.utils
import json
import re
import string
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

from airflow_plan_provider.exceptions import PermanentToolError, TransientToolError
from airflow_plan_provider.tools.tool import Tool, ToolContext, ToolOrigin

METHODS = ("GET", "HEAD", "DELETE", "POST", "PUT", "PATCH")
BODY_METHODS = ("POST", "PUT", "PATCH")  # the other methods send params as the query string
SAFE_METHODS = ("GET", "HEAD")  # a tool with another method needs approval unless told otherwise
DEFAULT_TIMEOUT = 30.0
DEFAULT_MAX_RESPONSE_BYTES = 1024 * 1024
MAX_ERROR_BODY_CHARS = 500
TRANSIENT_STATUSES = frozenset({408, 425, 429})  # and every 5xx
PLACEHOLDER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class HttpEndpoint:
    """The function of an :func:`http_tool`: calls ``method path`` on the connection's base URL."""

    conn_id: str
    method: str
    path: str
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout: float = DEFAULT_TIMEOUT
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    idempotency_header: str | None = "Idempotency-Key"

    @property
    def placeholders(self) -> tuple[str, ...]:
        return tuple(name for _, name, _, _ in string.Formatter().parse(self.path) if name is not None)

    def endpoint(self, params: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        """The path with its placeholders filled, and the params left over."""
        rest = {key: value for key, value in params.items() if value is not None}
        filled = []
        for literal, name, _, _ in string.Formatter().parse(self.path):
            filled.append(literal)
            if name is not None:
                filled.append(_segment(name, rest.pop(name, None)))
        return "".join(filled), rest

    def __call__(self, ctx: ToolContext | None = None, **params: Any) -> Any:
        from requests.exceptions import ConnectionError, RequestException, Timeout

        path, rest = self.endpoint(params)
        body = rest if self.method in BODY_METHODS and rest else None
        if rest and self.method not in BODY_METHODS:
            path += "?" + urlencode({key: _query_value(value) for key, value in rest.items()}, doseq=True)
        headers = dict(self.headers)
        if ctx is not None and self.idempotency_header:
            headers[self.idempotency_header] = ctx.idempotency_key
        where = f"{self.method} {self.path} (connection {self.conn_id!r})"
        try:
            response = self._hook().run(
                endpoint=path,
                headers=headers,
                json=body,
                extra_options={
                    "check_response": False,
                    "timeout": self.timeout,
                    "allow_redirects": False,
                    "stream": True,
                },
            )
        except (ConnectionError, Timeout) as error:
            raise TransientToolError(f"{where}: the server could not be reached: {error}") from None
        except RequestException as error:
            raise PermanentToolError(f"{where}: the request failed: {error}") from None
        try:
            return self._read(response, where)
        except (ConnectionError, Timeout) as error:
            raise TransientToolError(f"{where}: the response broke off: {error}") from None
        finally:
            response.close()

    def _hook(self) -> Any:
        from airflow.providers.http.hooks.http import HttpHook

        try:
            hook = HttpHook(method=self.method, http_conn_id=self.conn_id)
            hook.get_connection(self.conn_id)  # a missing connection is named here, not deep in run()
        except Exception as error:
            cls = PermanentToolError if "NotFound" in type(error).__name__ else TransientToolError
            raise cls(f"HTTP connection {self.conn_id!r} cannot be read: {error}") from None
        return hook

    def _read(self, response: Any, where: str) -> Any:
        status = int(response.status_code)
        if status >= 300:
            excerpt = _body(response, MAX_ERROR_BODY_CHARS * 4)[:MAX_ERROR_BODY_CHARS]
            reason = f"{where}: HTTP {status} {response.reason or ''}".rstrip()
            if 300 <= status < 400:
                location = response.headers.get("Location", "")
                raise PermanentToolError(f"{reason}: redirects are not followed (to {location!r})")
            detail = f"{reason}: {excerpt}" if excerpt else reason
            if status >= 500 or status in TRANSIENT_STATUSES:
                raise TransientToolError(
                    detail, retry_after=_retry_after(response.headers.get("Retry-After"))
                )
            raise PermanentToolError(detail)
        length = response.headers.get("Content-Length")
        if length and length.isdigit() and int(length) > self.max_response_bytes:
            raise PermanentToolError(f"{where}: the response is over {self.max_response_bytes} bytes")
        raw = b""
        for chunk in response.iter_content(64 * 1024):
            raw += chunk
            if len(raw) > self.max_response_bytes:
                raise PermanentToolError(f"{where}: the response is over {self.max_response_bytes} bytes")
        if not raw:
            return None
        text = raw.decode(response.encoding or "utf-8", errors="replace")
        media = response.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if media == "application/json" or media.endswith("+json"):
            try:
                return json.loads(text)
            except ValueError:
                raise PermanentToolError(
                    f"{where}: the response says JSON but is not: {text[:200]!r}"
                ) from None
        return text


def _segment(name: str, value: Any) -> str:
    """``value`` as one path segment, quoted."""
    if value is None:
        raise PermanentToolError(f"path parameter {name!r} is missing")
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise PermanentToolError(f"path parameter {name!r} must be a string or a number, not {value!r}")
    text = str(value)
    if text in ("", ".", ".."):
        raise PermanentToolError(f"path parameter {name!r} cannot be {text!r}")
    return quote(text, safe="")


def _query_value(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return [_query_value(item) for item in value]
    if isinstance(value, Mapping):
        return json.dumps(value, separators=(",", ":"))
    return value


def _body(response: Any, limit: int) -> str:
    """The first ``limit`` bytes of the body, as text."""
    try:
        raw = next(response.iter_content(limit), b"")
    except Exception:  # the body of an error response is only for the message
        return ""
    return " ".join(raw.decode(response.encoding or "utf-8", errors="replace").split())


def _retry_after(header: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (seconds or an HTTP date)."""
    if not header:
        return None
    if header.strip().isdigit():
        return float(header.strip())
    try:
        when = email.utils.parsedate_to_datetime(header)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def http_tool(
    conn_id: str,
    *,
    name: str,
    method: str,
    path: str,
    args_schema: Mapping[str, Any],
    description: str,
    headers: Mapping[str, str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    idempotency_header: str | None = "Idempotency-Key",
    pool: str | None = None,
    pool_slots: int = 1,
    needs_approval: bool | None = None,
) -> Tool:
    """A tool calling one endpoint of the HTTP API behind Airflow connection ``conn_id``.

    Building it does no I/O (the connection is read when a node calls the tool).

    :param conn_id: an Airflow connection of type ``http``; its host (and schema, port) is the base URL.
    :param name: the tool's name in plans.
    :param method: ``GET``, ``HEAD``, ``DELETE``, ``POST``, ``PUT`` or ``PATCH``.
    :param path: the path below the base URL, ``/`` first, with ``{name}`` placeholders for params.
    :param args_schema: the JSON Schema of the params (an object; every placeholder a required property).
    :param description: what the planner is told the endpoint does.
    :param headers: fixed headers of every request (the connection's extra may add more).
    :param timeout: seconds to wait for the server.
    :param max_response_bytes: a longer response body fails the node.
    :param idempotency_header: the header carrying the node's idempotency key (``None``: not sent).
    :param pool: an Airflow pool the nodes calling the tool take ``pool_slots`` of.
    :param pool_slots: the pool's slots one node takes.
    :param needs_approval: a risky tool (see ``ToolRegistry.tool``); default: every method but GET and HEAD.
    """
    method = method.upper() if isinstance(method, str) else method
    if method not in METHODS:
        raise ValueError(f"tool {name!r}: method must be one of {', '.join(METHODS)}, not {method!r}")
    _check_path(name, path)
    schema = copy.deepcopy(dict(args_schema))
    properties = schema.get("properties", {})
    if schema.get("type") != "object" or not isinstance(properties, Mapping):
        raise ValueError(f"tool {name!r}: args_schema must be a JSON Schema of type object with properties")
    endpoint = HttpEndpoint(
        conn_id, method, path, dict(headers or {}), timeout, max_response_bytes, idempotency_header
    )
    missing = [p for p in endpoint.placeholders if p not in properties or p not in schema.get("required", ())]
    if missing:
        raise ValueError(
            f"tool {name!r}: path placeholders {missing} must be required properties of args_schema"
        )
    if "ctx" in properties:
        raise ValueError(f"tool {name!r}: a param cannot be named 'ctx'")
    if not timeout > 0 or max_response_bytes < 1:
        raise ValueError(f"tool {name!r}: timeout and max_response_bytes must be positive")
    return Tool(
        name=name,
        description=description,
        func=endpoint,
        args_schema=schema,
        pool=pool,
        pool_slots=pool_slots,
        needs_approval=method not in SAFE_METHODS if needs_approval is None else needs_approval,
        origin=ToolOrigin(kind="http", conn_id=conn_id, name=f"{method} {path}"),
    )


def _check_path(name: str, path: str) -> None:
    if not isinstance(path, str) or not path.startswith("/") or path.startswith("//"):
        raise ValueError(
            f"tool {name!r}: path {path!r} must start with a single '/' (the base URL is the connection's)"
        )
    try:
        parts = list(string.Formatter().parse(path))
    except ValueError as error:
        raise ValueError(f"tool {name!r}: path {path!r} is not a template: {error}") from None
    for literal, placeholder, spec, conversion in parts:
        if any(char in literal for char in "?#\\") or any(char.isspace() for char in literal):
            raise ValueError(f"tool {name!r}: path {path!r} cannot hold '?', '#', '\\' or spaces")
        if placeholder is not None and (not PLACEHOLDER.fullmatch(placeholder) or spec or conversion):
            raise ValueError(f"tool {name!r}: placeholder {{{placeholder}}} must be a plain param name")
    if any(segment in (".", "..") for segment in path.split("/")):
        raise ValueError(f"tool {name!r}: path {path!r} cannot hold '.' or '..' segments")


__all__ = ["HttpEndpoint", "http_tool"]
