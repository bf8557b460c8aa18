"""Tools a plan can call: a name, a description, an argument schema and a function.

Declare tools on a registry::

    registry = ToolRegistry()

    @registry.tool(description="Latency percentiles of a service for one day")
    def query_metrics(service: str, day: str) -> dict: ...

The argument schema comes from the function's signature unless ``args`` names a pydantic model or a
JSON Schema. A function that accepts a ``ctx`` keyword receives a :class:`~.tool.ToolContext`.
A tool that calls a rate-limited service declares an Airflow pool: every node calling it takes
``pool_slots`` slots of that pool, across every plan run and worker::

    @registry.tool(description="Search the ticket API", pool="ticket_api")
    def search_tickets(query: str) -> list: ...
Teams ship tools in their own packages through the ``airflow_plan_provider.tools`` entry-point
group (the entry point names a :class:`ToolRegistry`). A DAG always names the tools it offers
(:func:`load_tools`): a registry, ``"module:attribute"``, an entry-point name, or ``"*"`` to opt in to
every installed registry.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, overload

from pydantic import BaseModel

from airflow_plan_provider.tools.tool import (
    Tool,
    ToolOrigin,
    args_schema_of,
    schema_from_signature,
)

if TYPE_CHECKING:
    from airflow_plan_provider.tools.sources import ToolListing, ToolSource


ENTRY_POINT_GROUP = "airflow_plan_provider.tools"
F = TypeVar("F", bound=Callable[..., Any])  # a tool's function, returned unchanged by ToolRegistry.tool
ALL_INSTALLED = "*"  # the explicit opt-in to every registry installed under ENTRY_POINT_GROUP
#: characters of the tool catalog in a planner's prompt (about 15,000 tokens), whatever the tool count
CATALOG_BUDGET = 60_000


class ToolRegistry(Mapping[str, Tool]):
    """Tools by name; renders the catalog a planner is shown.

    Its ``repr`` names the tools and a digest of their catalog entries, never a memory address: an
    operator that carries a registry is serialized with it, and the serialized DAG must be the same on
    every parse (otherwise each parse would make a new DAG version).

    :param tools: the tools to start with; more are added with :meth:`tool` or :meth:`add`.
    """

    def __init__(self, tools: list[Tool] | None = None, sources: Sequence[ToolSource] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._sources: dict[str, ToolSource] = {}
        for tool in tools or ():
            self.add(tool)
        for source in sources:
            self.add_source(source)

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    @property
    def sources(self) -> tuple[ToolSource, ...]:
        """The sources whose tools are listed when a run plans (see :mod:`.sources`)."""
        return tuple(self._sources.values())

    def add(self, tool: Tool) -> Tool:
        if tool.name in self._tools and self._tools[tool.name] is not tool:
            raise ValueError(f"tool {tool.name!r} is registered twice")
        self._tools[tool.name] = tool
        return tool

    def add_source(self, source: ToolSource) -> ToolSource:
        """Offer the tools ``source`` lists when a run plans (say an
        :class:`~airflow_plan_provider.tools.mcp.McpServer`). Nothing is asked of the source here: a DAG
        file that declares one does no I/O when parsed."""
        if source.name in self._sources and self._sources[source.name] != source:
            raise ValueError(f"tool source {source.name!r} is declared twice")
        self._sources[source.name] = source
        return source

    def merge(self, other: Mapping[str, Tool]) -> ToolRegistry:
        merged = ToolRegistry(list(self.values()), self.sources)
        for tool in other.values():
            merged.add(tool)
        for source in other.sources if isinstance(other, ToolRegistry) else ():
            merged.add_source(source)
        return merged

    def listed(self, *, strict: bool = True) -> tuple[ToolRegistry, ToolListing]:
        """Ask every source for its tools (network I/O: the planning task does it, never a DAG parse).

        Returns the tools a plan may use now (this registry's own and every listed one) and the listing
        to keep beside the plan (:meth:`with_listing` rebuilds the same tools from it). A source that
        cannot be listed raises :class:`~airflow_plan_provider.exceptions.ToolSourceError`, unless it is
        not ``required`` (or ``strict`` is false: ``airflow-plan tools`` reports every source): its listing
        then records the error and the run plans without it. A listed
        tool whose name is already taken is left out, named in its source's listing.
        """
        from airflow_plan_provider.exceptions import ToolSourceError
        from airflow_plan_provider.tools.sources import SourceListing, ToolListing

        listings: list[SourceListing] = []
        for source in self.sources:
            try:
                listing = source.list_tools()
            except ToolSourceError as error:
                if source.required and strict:
                    raise
                listing = SourceListing(source=source.name, error=str(error))
            listings.append(listing)
        taken = set(self._tools)
        for listing in listings:
            for entry in list(listing.tools):
                if entry.name in taken:
                    listing.tools.remove(entry)
                    listing.skipped.append(
                        f"{entry.remote_name}: the name {entry.name!r} is taken by another tool"
                    )
                taken.add(entry.name)
        kept = ToolListing(sources=listings)
        return self.with_listing(kept), kept

    def with_listing(self, listing: ToolListing) -> ToolRegistry:
        """This registry's tools and those of ``listing`` (as :meth:`listed` kept it), without I/O. A
        listing of a source this registry does not declare is ignored: only the DAG names sources."""
        registry = ToolRegistry(list(self.values()), self.sources)
        for source_listing in listing.sources:
            source = self._sources.get(source_listing.source)
            if source is None:
                continue
            for entry in source_listing.tools:
                if entry.name not in registry:
                    registry.add(source.tool(entry))
        return registry

    @overload
    def tool(
        self,
        func: F,
        *,
        name: str | None = ...,
        description: str | None = ...,
        args: type[BaseModel] | Mapping[str, Any] | None = ...,
        poll: Callable[..., Any] | None = ...,
        poll_interval: float = ...,
        cancel: Callable[[Any], Any] | None = ...,
        timeout: float | None = ...,
        pool: str | None = ...,
        pool_slots: int = ...,
        needs_approval: bool = ...,
    ) -> F: ...

    @overload
    def tool(
        self,
        func: None = None,
        *,
        name: str | None = ...,
        description: str | None = ...,
        args: type[BaseModel] | Mapping[str, Any] | None = ...,
        poll: Callable[..., Any] | None = ...,
        poll_interval: float = ...,
        cancel: Callable[[Any], Any] | None = ...,
        timeout: float | None = ...,
        pool: str | None = ...,
        pool_slots: int = ...,
        needs_approval: bool = ...,
    ) -> Callable[[F], F]: ...

    def tool(
        self,
        func: F | None = None,
        *,
        name: str | None = None,
        description: str | None = None,
        args: type[BaseModel] | Mapping[str, Any] | None = None,
        poll: Callable[..., Any] | None = None,
        poll_interval: float = 5.0,
        cancel: Callable[[Any], Any] | None = None,
        timeout: float | None = None,
        pool: str | None = None,
        pool_slots: int = 1,
        needs_approval: bool = False,
    ) -> F | Callable[[F], F]:
        """Register ``func`` as a tool (usable bare or with arguments); returns ``func`` unchanged.

        ``pool`` names an Airflow pool (create it with ``airflow pools set``): each node calling the tool
        takes ``pool_slots`` of its slots while it runs, whichever plan run or worker it belongs to.
        ``needs_approval=True`` marks a risky tool (a side effect someone should sign off): a plan DAG
        built with ``approval="risky"`` (the default) waits for a human to approve a plan that calls it.

        :param func: the function (when used bare, ``@registry.tool``).
        :param name: the tool's name; default the function's name.
        :param description: what the planner is told; default the function's docstring.
        :param args: a pydantic model or a JSON Schema for the params; default derived from the
            function's signature.
        :param poll: makes the tool asynchronous: see :class:`Tool`.
        :param poll_interval: seconds between two polls of an asynchronous tool's job.
        :param cancel: stops an asynchronous tool's job when its node's task is killed: see :class:`Tool`.
        :param timeout: seconds an asynchronous job may take.
        :param pool: an Airflow pool for the nodes calling the tool.
        :param pool_slots: the pool slots one node takes.
        :param needs_approval: mark the tool as risky.
        """

        def register(fn: F) -> F:
            self.add(
                Tool(
                    name=name or fn.__name__,
                    description=description or inspect.getdoc(fn) or "",
                    func=fn,
                    args_schema=args_schema_of(args) if args is not None else schema_from_signature(fn),
                    poll=poll,
                    poll_interval=poll_interval,
                    cancel=cancel,
                    timeout=timeout,
                    pool=pool,
                    pool_slots=pool_slots,
                    needs_approval=needs_approval,
                    origin=ToolOrigin("python", name=f"{fn.__module__}.{fn.__qualname__}"),
                )
            )
            return fn

        return register(func) if func is not None else register

    def __repr__(self) -> str:
        sources = f", sources={sorted(self._sources)!r}" if self._sources else ""
        return f"ToolRegistry(tools={sorted(self._tools)!r}{sources}, catalog_sha256={self.digest()[:16]!r})"

    def digest(self) -> str:
        """SHA-256 of every tool's name, description, argument schema and job settings, and of every
        source's declaration (not of what a source lists: that is asked when a run plans)."""
        entries: list[Any] = [self._tools[name].fingerprint() for name in sorted(self._tools)]
        if self._sources:  # only when declared, so the digests of catalogs without sources stay as they were
            entries.append({"sources": [self._sources[name].declaration() for name in sorted(self._sources)]})
        text = json.dumps(entries, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()

    def catalog(self) -> list[dict[str, Any]]:
        return [self._tools[name].describe() for name in sorted(self._tools)]

    def catalog_text(self, goal: str = "", budget: int = CATALOG_BUDGET) -> str:
        """The catalog as a planner prompt section, at most about ``budget`` characters
        (:func:`~airflow_plan_provider.tools.catalog.catalog_text`)."""
        from airflow_plan_provider.tools.catalog import catalog_text

        return catalog_text(list(self.values()), goal=goal, budget=budget)


def installed_registries() -> list[str]:
    """Names of the registries installed under the ``airflow_plan_provider.tools`` entry-point group."""
    return sorted({point.name for point in entry_points(group=ENTRY_POINT_GROUP)})


def missing_tools_message() -> str:
    return (
        "name the tools this DAG offers: a ToolRegistry, 'module:attribute' or an installed entry-point "
        f"name ({ALL_INSTALLED!r} offers every installed registry); installed: {installed_registries()}"
    )


def load_tools(spec: str | Mapping[str, Tool] | None) -> ToolRegistry:
    """A registry from ``spec``: a registry (or a mapping of tools), ``"module:attribute"``,
    ``"path/to/file.py:attribute"``, the name of a registry installed under the
    ``airflow_plan_provider.tools`` entry-point group, or ``"*"`` for every installed registry merged.

    A file is imported by its dotted name below the folder above its outermost package, and that folder
    is put on ``sys.path`` (``dags/plan_demo/tools.py`` is ``plan_demo.tools``, with ``dags`` on the path),
    so the file's own imports of its package work.

    ``None`` is refused (``ValueError``): installed registries are never offered unless asked for.
    A module that fails to import raises ``ImportError`` naming the module and the error.
    """
    if isinstance(spec, ToolRegistry):
        return spec
    if isinstance(spec, Mapping):
        return ToolRegistry(list(spec.values()))
    if spec is None:
        raise ValueError(missing_tools_message())
    if not isinstance(spec, str) or not spec.strip():
        raise TypeError(f"tools must be a ToolRegistry or a non-empty spec string, not {spec!r}")
    points = entry_points(group=ENTRY_POINT_GROUP)
    if spec == ALL_INSTALLED:
        registry = ToolRegistry()
        for point in sorted(points, key=lambda p: p.name):
            registry = registry.merge(_as_registry(_load_entry_point(point), point.name))
        return registry
    if ":" in spec:
        return _as_registry(import_spec(spec), spec)
    for point in points:
        if point.name == spec:
            return _as_registry(_load_entry_point(point), spec)
    raise LookupError(f"no tool registry named {spec!r}; installed: {installed_registries() or 'none'}")


def import_spec(spec: str) -> Any:
    """The attribute ``spec`` names: ``"module:attribute"`` or ``"path/to/file.py:attribute"`` (a file
    as :func:`load_tools` imports it). Raises ``ImportError`` naming a module that fails to import, and
    ``AttributeError`` for a missing attribute."""
    module_name, _, attribute = spec.partition(":")
    module = _import_tool_module(module_name)
    if not hasattr(module, attribute):
        raise AttributeError(f"module {module_name!r} has no attribute {attribute!r}")
    return getattr(module, attribute)


def _import_tool_module(module: str) -> Any:
    try:
        return importlib.import_module(_module_of_file(module) if module.endswith(".py") else module)
    except (Exception, SystemExit) as error:  # whatever a module raises on import: name the module
        raise ImportError(
            f"tool module {module!r} failed to import: {type(error).__name__}: {error}"
        ) from error


def _module_of_file(path: str) -> str:
    """The dotted name of the Python file ``path``, once the folder above its outermost package is on
    ``sys.path``."""
    file = Path(path).resolve()
    if not file.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    parts = [] if file.stem == "__init__" else [file.stem]
    folder = file.parent
    while (folder / "__init__.py").is_file():
        parts.insert(0, folder.name)
        folder = folder.parent
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    return ".".join(parts)


def _load_entry_point(point: Any) -> Any:
    try:
        return point.load()
    except (Exception, SystemExit) as error:  # whatever a module raises: name the entry point
        raise ImportError(
            f"tool registry entry point {point.name!r} ({point.value}) failed to load: "
            f"{type(error).__name__}: {error}"
        ) from error


def _as_registry(obj: Any, origin: str) -> ToolRegistry:
    if callable(obj) and not isinstance(obj, Mapping):
        obj = obj()
    if isinstance(obj, ToolRegistry):
        return obj
    raise TypeError(f"{origin} is not a ToolRegistry (got {type(obj).__name__})")
