"""Tool sources: tools a registry lists when a run plans, not when the DAG file is parsed.

A Python tool is known when the DAG is built. A *source* (an MCP server named by an Airflow connection,
:mod:`airflow_plan_provider.tools.mcp`) only knows its tools once it asks the server, which is network
I/O: the planning task lists every source of the DAG's registry (:meth:`ToolRegistry.listed
<airflow_plan_provider.tools.registry.ToolRegistry.listed>`), keeps what it found beside the plan (XCom
``tools``, a :class:`ToolListing`), and every later task rebuilds the same tools from that listing without
asking the server again (:meth:`ToolSource.tool`). So the DAG's serialized form holds only the source's
declaration (connection id, prefix, filters, pool), the same on every parse, and a node checks its params
against the schema the planner saw.

::

    registry = ToolRegistry()
    registry.add_source(McpServer("warehouse_mcp", prefix="wh_", include=["run_query", "list_tables"]))
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import ConfigDict, Field

from airflow_plan_provider.base_model import Model

if TYPE_CHECKING:
    from airflow_plan_provider.tools.tool import Tool


def schema_digest(schema: Any) -> str:
    """SHA-256 of a JSON Schema's canonical JSON: what a node compares with the server's schema."""
    text = json.dumps(schema, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class ListedTool(Model):
    """One tool a source listed, as the planner saw it.

    :param name: the name plan nodes use (the source's prefix, then the server's name).
    :param remote_name: the name the source itself gives the tool.
    :param description: what the planner was told (cut to the source's limit).
    :param args_schema: the tool's input JSON Schema.
    :param schema_sha256: :func:`schema_digest` of ``args_schema``.
    :param needs_approval: whether the tool counts as risky for approval.
    :param annotations: the hints the source gave (``read_only_hint``, ``destructive_hint``, ...).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    remote_name: str
    description: str = ""
    args_schema: dict[str, Any]
    schema_sha256: str
    needs_approval: bool = False
    annotations: dict[str, Any] = Field(default_factory=dict)


class SourceListing(Model):
    """What one source listed when a run planned: its tools, and what it left out and why.

    :param source: the source's name (:attr:`ToolSource.name`).
    :param origin: where its tools come from, as :meth:`ToolOrigin.to_dict
        <airflow_plan_provider.tools.tool.ToolOrigin.to_dict>` gives it (kind, conn_id).
    :param tools: the tools the planner may use.
    :param advertised: how many tools the source advertised (before filters and limits).
    :param skipped: one line per tool left out (filtered, oversized schema, name clash, over the limit).
    :param error: why the source could not be listed at all (an optional source the run planned without).
    """

    model_config = ConfigDict(extra="forbid")

    source: str
    origin: dict[str, str] = Field(default_factory=dict)
    tools: list[ListedTool] = Field(default_factory=list)
    advertised: int = 0
    skipped: list[str] = Field(default_factory=list)
    error: str | None = None


class ToolListing(Model):
    """Every source's listing of one planning, and where each tool the plan calls comes from (kept beside
    the plan, XCom ``tools``)."""

    model_config = ConfigDict(extra="forbid")

    sources: list[SourceListing] = Field(default_factory=list)
    #: tool name → where it comes from (:meth:`ToolOrigin.to_dict`), for the tools the plan calls
    origins: dict[str, dict[str, str]] = Field(default_factory=dict)

    def of(self, source: str) -> SourceListing | None:
        return next((listing for listing in self.sources if listing.source == source), None)

    def summary(self) -> list[dict[str, Any]]:
        """Per source: its name, origin, how many tools it advertised and kept, and its error (for the
        plan view and the planning task's log)."""
        return [
            {
                "source": listing.source,
                **listing.origin,
                "advertised": listing.advertised,
                "tools": [tool.name for tool in listing.tools],
                "skipped": len(listing.skipped),
                **({"error": listing.error} if listing.error else {}),
            }
            for listing in self.sources
        ]


@runtime_checkable
class ToolSource(Protocol):
    """A source of tools listed at planning time (see the module's docstring).

    ``name`` is unique among a registry's sources; ``declaration()`` is what the DAG declared, as
    JSON-able data that is the same in every process (it goes into the registry's digest);
    ``pool``/``pool_slots`` the Airflow pool every node calling one of its tools takes;
    ``may_need_approval`` whether a listed tool may count as risky (the DAG then has an ``approve``
    task); ``list_tools()`` asks the source (network I/O; raises
    :class:`~airflow_plan_provider.exceptions.ToolSourceError` when it cannot); ``tool(entry)`` is the
    tool a listed entry describes, built without I/O.
    """

    name: str
    pool: str | None
    pool_slots: int
    required: bool

    @property
    def may_need_approval(self) -> bool: ...

    def declaration(self) -> dict[str, Any]: ...

    def list_tools(self) -> SourceListing: ...

    def tool(self, entry: ListedTool) -> Tool: ...


def bounded_text(text: Any, limit: int) -> str:
    """``text`` as a string of at most ``limit`` characters, control characters but newlines and tabs
    removed (a source's description reaches the planner's prompt and the UI)."""
    cleaned = "".join(ch for ch in str(text or "") if ch in "\n\t" or ch.isprintable())
    return cleaned if len(cleaned) <= limit else cleaned[: max(0, limit - 1)] + "…"


def declared_names(names: Any, what: str) -> tuple[str, ...] | None:
    """A source's ``include``/``exclude`` list, checked: None, or a sequence of non-empty strings."""
    if names is None:
        return None
    if isinstance(names, str) or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"{what} must be a list of tool names, not {names!r}")
    return tuple(names)


def listing_of(value: Any) -> ToolListing:
    """A :class:`ToolListing` from what XCom gave back (``None``: no source listed anything)."""
    if value is None:
        return ToolListing()
    if isinstance(value, Mapping):
        return ToolListing.model_validate(value)
    raise ValueError(f"a tool listing must be an object, not {type(value).__name__}")
