"""How to reach an MCP server: its Airflow connection (conn type ``mcp``, as common-ai defines it), read.

- ``host``: the streamable-HTTP URL; ``password``: a bearer token;
- ``extra.transport``: ``http`` (default) or ``stdio``; for stdio, ``extra.command``, ``extra.args`` (a
  list) and ``extra.env`` (an object) start the server as a subprocess of the task, with only the SDK's
  safe variables (``PATH``, ``HOME``...) of the worker's environment and the connection's own env;
- ``extra.timeout``: seconds one request may take (default :data:`DEFAULT_TIMEOUT`).

The token and every env value are registered with Airflow's secrets masker when the connection is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from airflow_plan_provider.exceptions import ToolSourceError

if TYPE_CHECKING:
    from mcp import Client

DEFAULT_TIMEOUT = 30.0  # seconds, of one request to the server, when the connection sets none


@dataclass(frozen=True)
class McpConnection:
    """How to reach a server, as its Airflow connection says (see the module's docstring)."""

    conn_id: str
    transport: Literal["http", "stdio"]
    url: str | None = None
    token: str | None = field(default=None, repr=False)
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    timeout: float = DEFAULT_TIMEOUT

    @classmethod
    def from_fields(
        cls, conn_id: str, *, host: str | None, password: str | None, extra: Mapping[str, Any]
    ) -> McpConnection:
        """The connection from its fields; a field of the wrong shape is a :class:`ToolSourceError`
        naming the connection and the field."""

        def bad(what: str) -> ToolSourceError:
            return ToolSourceError(f"MCP connection {conn_id!r}: {what}")

        transport = str(extra.get("transport") or "http").lower()
        if transport == "streamable-http":
            transport = "http"
        if transport not in ("http", "stdio"):
            raise bad(f"extra.transport must be 'http' or 'stdio', not {transport!r}")
        timeout = extra.get("timeout", DEFAULT_TIMEOUT)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float | str):
            raise bad(f"extra.timeout must be a number of seconds, not {timeout!r}")
        try:
            seconds = float(timeout)
        except ValueError:
            raise bad(f"extra.timeout must be a number of seconds, not {timeout!r}") from None
        if not seconds > 0:
            raise bad(f"extra.timeout must be more than 0 seconds, not {timeout!r}")
        if transport == "http":
            if not host or not str(host).startswith(("http://", "https://")):
                raise bad(f"host must be the server's http(s) URL for transport 'http', not {host!r}")
            return cls(conn_id, "http", url=str(host), token=password or None, timeout=seconds)
        command, args, env = extra.get("command"), extra.get("args") or [], extra.get("env") or {}
        if not isinstance(command, str) or not command:
            raise bad("extra.command must name the program that starts the server for transport 'stdio'")
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise bad("extra.args must be a list of strings")
        if not isinstance(env, Mapping) or not all(isinstance(v, str) for v in env.values()):
            raise bad("extra.env must be an object of strings")
        return cls(conn_id, "stdio", command=command, args=tuple(args), env=dict(env), timeout=seconds)

    def secrets(self) -> list[str]:
        """What the secrets masker must hide: the token and every env value."""
        return [s for s in (self.token, *self.env.values()) if s]

    def client(self, timeout: float, max_bytes: int = 16_000_000) -> Client:
        """A new client for this connection (one per call or listing, never shared); an event of the
        server's stream may carry ``max_bytes`` of JSON (a result up to the server's limit, escaped)."""
        from mcp import Client, StdioServerParameters

        if self.transport == "stdio":
            assert self.command is not None
            from mcp.client.stdio import get_default_environment

            # the SDK's safe variables (PATH, HOME, USER...) and the connection's own env: never the
            # worker's environment, which holds Airflow's own secrets
            env = {**get_default_environment(), **self.env}
            params = StdioServerParameters(command=self.command, args=list(self.args), env=env)
            return Client(params, read_timeout_seconds=timeout, cache=None)
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        assert self.url is not None
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(timeout, read=timeout))
        return Client(
            streamable_http_client(self.url, http_client=http, max_sse_event_size=2 * max_bytes),
            read_timeout_seconds=timeout,
            cache=None,
        )


def read_connection(conn_id: str) -> McpConnection:
    """The Airflow connection ``conn_id`` as an :class:`McpConnection`, its secrets masked."""
    from airflow.sdk import BaseHook

    from airflow_plan_provider.compat import mask_secret

    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception as error:  # Airflow raises its own "not defined" error
        raise ToolSourceError(f"MCP connection {conn_id!r} cannot be read: {error}") from None
    if conn.password:
        mask_secret(conn.password)
    extra = conn.extra_dejson if isinstance(conn.extra_dejson, Mapping) else {}
    parsed = McpConnection.from_fields(conn_id, host=conn.host, password=conn.password, extra=extra)
    for secret in parsed.secrets():
        mask_secret(secret)
    return parsed
