"""An MCP server named by an Airflow connection, as a source of plan tools.

::

    registry = ToolRegistry()
    registry.add_source(McpServer("warehouse_mcp", include=["run_query", "list_tables"], pool="warehouse"))

The connection is the one Airflow's common-ai provider defines for conn type ``mcp``, read without
common-ai (no second connection type is registered): :mod:`~airflow_plan_provider.tools.mcp_connection`.
Only the DAG names a server (by its connection id): a plan or a run's conf can name a tool, never a
connection, a URL or a command.

When a run plans, the planning task lists the server's tools (paged; the first ``max_tools`` that pass
the checks below are kept, and the tools after them are left out unchecked): each
becomes the plan tool ``<prefix><name>`` (the prefix defaults to ``<conn_id>.``), with the server's
description (cut to ``max_description_chars``) and input schema (a tool whose schema is over
``max_schema_bytes`` is left out, named in the listing). A tool marked read-only
(``annotations.read_only_hint``) or non-destructive (``destructive_hint`` false) is not risky; every
other tool counts as risky for ``ApprovalPolicy`` (MCP's own default: a tool may be destructive unless
it says otherwise), unless ``needs_approval`` says otherwise for the whole server.

A node calling one of these tools opens its own client for the call (the SDK is asynchronous: nothing is
shared between tasks or event loops; calls run in the worker, never on the triggerer), checks that the
server still offers the tool with the schema the planner saw, and calls it with the node's idempotency
key in the request's ``_meta`` (:data:`IDEMPOTENCY_META_KEY`). A result with ``is_error`` fails the node
for good with the server's text (so the session may replan); a timeout or a connection that fails is
transient (Airflow retries the node, with the same key). The output is the result's structured content
when it has one, otherwise its text blocks joined.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

from airflow_plan_provider.exceptions import PermanentToolError, ToolSourceError, TransientToolError
from airflow_plan_provider.tools.mcp_connection import McpConnection, read_connection
from airflow_plan_provider.tools.sources import (
    ListedTool,
    SourceListing,
    bounded_text,
    declared_names,
    schema_digest,
)
from airflow_plan_provider.tools.tool import POOL_NAME, Tool, ToolContext, ToolOrigin

if TYPE_CHECKING:
    pass

T = TypeVar("T")

CONN_TYPE = "mcp"
#: where the node's idempotency key goes in a call's ``_meta`` (a server that performs side effects
#: reads it there to perform each once)
IDEMPOTENCY_META_KEY = "airflow_plan_provider/idempotency_key"
MCP_TIMEOUT_CODE = -32001  # the SDK's code for a request that got no answer in time
#: JSON-RPC codes a server answers when a tool or its arguments are unknown to it
UNKNOWN_TOOL_CODES = frozenset({-32601, -32602})
MAX_PAGES = 1000  # of a listing: a server that keeps answering with a next cursor is cut off here
MAX_ERROR_CHARS = 2000  # of a server's error text kept in the node's record


@dataclass(frozen=True)
class McpServer:
    """The tools of the MCP server behind Airflow connection ``conn_id`` (see the module's docstring).

    :param conn_id: the Airflow connection (conn type ``mcp``).
    :param prefix: put before each tool's name in plans; default ``"<conn_id>."``.
    :param include: only these tools (the server's names); default all.
    :param exclude: never these tools.
    :param pool: an Airflow pool every node calling one of these tools takes ``pool_slots`` of.
    :param pool_slots: the pool slots one node takes.
    :param timeout: seconds of one request; default the connection's ``extra.timeout``.
    :param required: when the server cannot be listed, planning fails (and Airflow retries it);
        ``False``: the run plans without this server's tools, and the listing says why.
    :param needs_approval: ``None``: as the tools' annotations say; ``True``/``False``: for every tool.
    :param max_tools: the most tools kept from one listing.
    :param max_schema_bytes: a tool whose input schema is larger is left out.
    :param max_description_chars: a description is cut to this many characters.
    :param max_result_bytes: a larger result fails the node for good.
    """

    conn_id: str
    prefix: str | None = None
    include: Sequence[str] | None = None
    exclude: Sequence[str] | None = None
    pool: str | None = None
    pool_slots: int = 1
    timeout: float | None = None
    required: bool = True
    needs_approval: bool | None = None
    max_tools: int = 500
    max_schema_bytes: int = 65_536
    max_description_chars: int = 1_000
    max_result_bytes: int = 16_000_000

    def __post_init__(self) -> None:
        if not isinstance(self.conn_id, str) or not self.conn_id:
            raise ValueError(f"McpServer needs an Airflow connection id, not {self.conn_id!r}")
        object.__setattr__(self, "include", declared_names(self.include, "include"))
        object.__setattr__(self, "exclude", declared_names(self.exclude, "exclude"))
        if self.pool is not None and not POOL_NAME.fullmatch(str(self.pool)):
            raise ValueError(f"McpServer {self.conn_id!r}: pool {self.pool!r} is not a valid pool name")
        for name in ("max_tools", "max_schema_bytes", "max_description_chars", "max_result_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"McpServer {self.conn_id!r}: {name} must be an integer >= 1, not {value!r}")

    @property
    def name(self) -> str:
        return f"mcp:{self.conn_id}"

    @property
    def tool_prefix(self) -> str:
        return f"{self.conn_id}." if self.prefix is None else self.prefix

    @property
    def may_need_approval(self) -> bool:
        return self.needs_approval is not False

    def origin(self, remote_name: str | None = None) -> ToolOrigin:
        return ToolOrigin("mcp", conn_id=self.conn_id, name=remote_name)

    def declaration(self) -> dict[str, Any]:
        return {
            "kind": "mcp",
            "conn_id": self.conn_id,
            "prefix": self.tool_prefix,
            "include": list(self.include) if self.include is not None else None,
            "exclude": list(self.exclude) if self.exclude is not None else None,
            "pool": self.pool,
            "pool_slots": self.pool_slots,
            "timeout": self.timeout,
            "required": self.required,
            "needs_approval": self.needs_approval,
            "limits": [
                self.max_tools,
                self.max_schema_bytes,
                self.max_description_chars,
                self.max_result_bytes,
            ],
        }

    # -- listing (the planning task) ------------------------------------------------------------------

    def list_tools(self) -> SourceListing:
        """Ask the server for its tools (see the module's docstring); raises :class:`ToolSourceError`
        naming the server when it cannot be reached or answers with an error."""
        conn = read_connection(self.conn_id)
        try:
            advertised = run_async(lambda: self._advertised(conn))
        except Exception as error:
            raise ToolSourceError(
                f"MCP server {self.conn_id!r} could not be listed: {describe(error)}"
            ) from None
        return self.listing(advertised)

    async def _advertised(self, conn: McpConnection) -> list[Any]:
        """Every tool the server advertises, page by page (at most :data:`MAX_PAGES`, and no more tools
        than ten times ``max_tools``: a server advertising more is cut off there)."""
        found: list[Any] = []
        async with conn.client(self.timeout or conn.timeout) as client:
            async for page in _pages(client):
                found.extend(page)
                if len(found) > 10 * self.max_tools:
                    break
        return found

    def listing(self, advertised: Sequence[Any]) -> SourceListing:
        """What the planner may use of the ``advertised`` tools (the SDK's ``Tool`` objects, or objects
        of the same fields): filtered, checked against the limits, named with the prefix."""
        kept: list[ListedTool] = []
        skipped: list[str] = []
        seen: set[str] = set()
        for item in advertised:
            remote = getattr(item, "name", None)
            if not isinstance(remote, str) or not remote or len(remote) > 128:
                skipped.append(f"a tool with an invalid name ({bounded_text(repr(remote), 80)})")
                continue
            if remote in seen:
                skipped.append(f"{remote}: listed twice (the first kept)")
                continue
            seen.add(remote)
            if (self.include is not None and remote not in self.include) or remote in (self.exclude or ()):
                continue
            if len(kept) >= self.max_tools:  # not checked: a schema check costs a millisecond or more
                skipped.append(f"{remote}: over max_tools={self.max_tools}")
                continue
            problem = self._problem(item)
            if problem:
                skipped.append(f"{remote}: {problem}")
                continue
            kept.append(self._listed(item))
        total = len(advertised)
        return SourceListing(
            source=self.name,
            origin=self.origin().to_dict(),
            tools=kept,
            advertised=total,
            skipped=skipped[:200] + ([f"... and {len(skipped) - 200} more"] if len(skipped) > 200 else []),
        )

    def _problem(self, item: Any) -> str | None:
        schema = getattr(item, "input_schema", None)
        if not isinstance(schema, Mapping):
            return "its input schema is not a JSON object"
        size = len(json.dumps(schema, default=str))
        if size > self.max_schema_bytes:
            return f"its input schema is {size} bytes, over max_schema_bytes={self.max_schema_bytes}"
        from jsonschema import SchemaError, validators

        try:
            validators.validator_for(schema).check_schema(dict(schema))
        except SchemaError as error:
            return f"its input schema is not a valid JSON Schema ({bounded_text(error.message, 200)})"
        return None

    def _listed(self, item: Any) -> ListedTool:
        annotations = getattr(item, "annotations", None)
        dump = getattr(annotations, "model_dump", None)
        hints: dict[str, Any] = dump(exclude_none=True) if dump else dict(annotations or {})
        hints = {k: v for k, v in hints.items() if isinstance(v, bool | str) and k != "title"} | (
            {"title": bounded_text(hints["title"], 200)} if isinstance(hints.get("title"), str) else {}
        )
        risky = self.needs_approval
        if risky is None:
            risky = not (hints.get("read_only_hint") is True or hints.get("destructive_hint") is False)
        schema = dict(item.input_schema)
        return ListedTool(
            name=f"{self.tool_prefix}{item.name}",
            remote_name=item.name,
            description=bounded_text(getattr(item, "description", "") or "", self.max_description_chars),
            args_schema=schema,
            schema_sha256=schema_digest(schema),
            needs_approval=risky,
            annotations=hints,
        )

    # -- calls (a node) -------------------------------------------------------------------------------

    def tool(self, entry: ListedTool) -> Tool:
        """The plan tool ``entry`` describes (no I/O: the server is asked when a node calls it)."""
        return Tool(
            name=entry.name,
            description=entry.description,
            func=McpToolCall(self, entry.remote_name, entry.schema_sha256),
            args_schema=entry.args_schema,
            pool=self.pool,
            pool_slots=self.pool_slots,
            needs_approval=entry.needs_approval,
            origin=self.origin(entry.remote_name),
        )


@dataclass(frozen=True)
class McpToolCall:
    """Calls one tool of a server as a node's tool function (see the module's docstring)."""

    server: McpServer
    remote_name: str
    schema_sha256: str

    def __call__(self, ctx: ToolContext, **params: Any) -> Any:
        conn = read_connection(self.server.conn_id)
        timeout = self.server.timeout or conn.timeout
        try:
            result = run_async(lambda: self._call(conn, timeout, params, ctx))
        except Exception as error:  # raised through the SDK's task groups: the first exception inside
            raise self._classified(error) from None
        return self._output(result)

    async def _call(
        self, conn: McpConnection, timeout: float, params: dict[str, Any], ctx: ToolContext
    ) -> Any:
        where = f"tool {self.remote_name!r} of MCP server {self.server.conn_id!r}"
        async with conn.client(timeout, self.server.max_result_bytes) as client:
            listed = await _find(client, self.remote_name)
            if listed is None:
                raise PermanentToolError(
                    f"{where} is no longer offered by the server (it was when the plan was made)"
                )
            if schema_digest(dict(listed.input_schema)) != self.schema_sha256:
                raise PermanentToolError(
                    f"{where} changed since the plan was made: its input schema is not the one the "
                    "planner saw"
                )
            return await client.call_tool(
                self.remote_name,
                params,
                read_timeout_seconds=timeout,
                meta=cast(Any, {IDEMPOTENCY_META_KEY: ctx.idempotency_key}),
            )

    def _output(self, result: Any) -> Any:
        where = f"tool {self.remote_name!r} of MCP server {self.server.conn_id!r}"
        text = "\n".join(_block_text(block) for block in result.content or [])
        if result.is_error:
            raise PermanentToolError(f"{where} answered with an error: {bounded_text(text, MAX_ERROR_CHARS)}")
        output = result.structured_content if result.structured_content is not None else text
        size = len(json.dumps(output, default=str))
        if size > self.server.max_result_bytes:
            raise PermanentToolError(
                f"{where} returned {size} bytes, over the server's "
                f"max_result_bytes={self.server.max_result_bytes}"
            )
        return output

    def _classified(self, error: BaseException) -> Exception:
        """A failed call as the node sees it: a timeout or a lost connection is transient; an error the
        server answered with is permanent."""
        from mcp.shared.exceptions import MCPError

        where = f"tool {self.remote_name!r} of MCP server {self.server.conn_id!r}"
        leaf = _leaf(error)
        if isinstance(leaf, PermanentToolError | TransientToolError):
            return leaf
        if isinstance(leaf, MCPError) and leaf.code not in (MCP_TIMEOUT_CODE, -32000):
            return PermanentToolError(f"{where}: {bounded_text(leaf.message, MAX_ERROR_CHARS)}")
        return TransientToolError(f"{where}: {describe(error)}")


async def _pages(client: Any) -> AsyncIterator[list[Any]]:
    """The server's tools, page by page, as it lists them now (at most :data:`MAX_PAGES` pages)."""
    cursor: str | None = None
    for _ in range(MAX_PAGES):
        page = await client.list_tools(cursor=cursor, cache_mode="refresh")
        yield list(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return


async def _find(client: Any, name: str) -> Any:
    """The server's listing of tool ``name`` (paged until found), or None."""
    async for page in _pages(client):
        for item in page:
            if item.name == name:
                return item
    return None


def _block_text(block: Any) -> str:
    text = getattr(block, "text", None)
    if isinstance(text, str):
        return text
    kind = getattr(block, "type", "content")
    mime = getattr(block, "mime_type", None)
    return f"[{kind}{' ' + mime if mime else ''}]"


def _leaf(error: BaseException) -> BaseException:
    """The first exception inside (nested) exception groups: what the SDK's task groups raised."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def describe(error: BaseException) -> str:
    """One line naming an error, through the exception groups the SDK's task groups raise."""
    leaf = _leaf(error)
    text = str(leaf) or type(leaf).__name__
    return bounded_text(f"{type(leaf).__name__}: {text}", 500)


def run_async(make: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to its end from synchronous code: in this thread's own new event loop, or in a
    new thread's when this thread already runs one (no loop or client is shared)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_awaited(make))
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(_awaited(make))).result()


async def _awaited(make: Callable[[], Awaitable[T]]) -> T:
    return await make()
