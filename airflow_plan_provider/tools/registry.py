"""Tools a plan can call: a name, a description, an argument schema and a function.

Declare tools on a registry::

    registry = ToolRegistry()

    @registry.tool(description="Latency percentiles of a service for one day")
    def query_metrics(service: str, day: str) -> dict: ...

The argument schema comes from the function's signature unless ``args`` names a pydantic model or a
JSON Schema. A function that accepts a ``ctx`` keyword receives a :class:`ToolContext`.
Teams ship tools in their own packages through the ``airflow_plan_provider.tools`` entry-point
group (the entry point names a :class:`ToolRegistry`).
"""

from __future__ import annotations

import importlib
import inspect
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from importlib.metadata import entry_points
from typing import Any

import jsonschema
from pydantic import BaseModel, create_model

ENTRY_POINT_GROUP = "airflow_plan_provider.tools"


@dataclass(frozen=True)
class ToolContext:
    """What a tool may know about the call: where it runs and how to stay idempotent.

    ``idempotency_key`` is the same for every try of one node in one revision of a session (and differs
    for a revised node in a later revision), so a tool that performs a side effect can perform it once.
    """

    node_id: str
    idempotency_key: str
    attempt: int = 1
    missing_inputs: tuple[str, ...] = ()
    run_id: str = ""
    revision: int = 0


@dataclass
class Tool:
    name: str
    description: str
    func: Callable[..., Any]
    args_schema: dict[str, Any]
    poll: Callable[..., Any] | None = None  # set for asynchronous tools (see tools.jobs)
    poll_interval: float = 5.0
    timeout: float | None = None
    wants_ctx: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self.wants_ctx = "ctx" in inspect.signature(self.func).parameters

    @property
    def is_async(self) -> bool:
        return self.poll is not None

    @cached_property
    def validator(self) -> jsonschema.protocols.Validator:
        cls = jsonschema.validators.validator_for(self.args_schema)
        return cls(self.args_schema)

    def call(self, params: Mapping[str, Any], ctx: ToolContext) -> Any:
        if self.wants_ctx:
            return self.func(**params, ctx=ctx)
        return self.func(**params)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "args_schema": self.args_schema}


def schema_from_signature(func: Callable[..., Any]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for name, param in inspect.signature(func, eval_str=True).parameters.items():
        if name == "ctx" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        annotation = param.annotation if param.annotation is not inspect.Parameter.empty else Any
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[name] = (annotation, default)
    model = create_model(f"{func.__name__}_args", **fields)
    return args_schema_of(model)


def args_schema_of(args: type[BaseModel] | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(args, type) and issubclass(args, BaseModel):
        schema = args.model_json_schema()
        schema.setdefault("additionalProperties", False)
        return schema
    return dict(args)


class ToolRegistry(Mapping[str, Tool]):
    """Tools by name; renders the catalog a planner is shown."""

    def __init__(self, tools: list[Tool] | None = None) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools or ():
            self.add(tool)

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    def add(self, tool: Tool) -> Tool:
        if tool.name in self._tools and self._tools[tool.name] is not tool:
            raise ValueError(f"tool {tool.name!r} is registered twice")
        self._tools[tool.name] = tool
        return tool

    def merge(self, other: Mapping[str, Tool]) -> ToolRegistry:
        merged = ToolRegistry(list(self.values()))
        for tool in other.values():
            merged.add(tool)
        return merged

    def tool(
        self,
        func: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        description: str | None = None,
        args: type[BaseModel] | Mapping[str, Any] | None = None,
        poll: Callable[..., Any] | None = None,
        poll_interval: float = 5.0,
        timeout: float | None = None,
    ) -> Any:
        """Register ``func`` as a tool (usable bare or with arguments)."""

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.add(
                Tool(
                    name=name or fn.__name__,
                    description=description or inspect.getdoc(fn) or "",
                    func=fn,
                    args_schema=args_schema_of(args) if args is not None else schema_from_signature(fn),
                    poll=poll,
                    poll_interval=poll_interval,
                    timeout=timeout,
                )
            )
            return fn

        return register(func) if func is not None else register

    def catalog(self) -> list[dict[str, Any]]:
        return [self._tools[name].describe() for name in sorted(self._tools)]

    def catalog_text(self) -> str:
        """The catalog as a planner prompt section: one tool a paragraph, with its argument schema."""
        parts = []
        for item in self.catalog():
            schema = json.dumps(item["args_schema"], sort_keys=True, separators=(",", ":"))
            parts.append(f"- {item['name']}: {item['description']}\n  args JSON Schema: {schema}")
        return "\n".join(parts)


def load_tools(spec: str | Mapping[str, Tool] | None = None) -> ToolRegistry:
    """A registry from ``spec``: a registry, ``"module:attribute"``, an entry-point name, or None for all
    registries installed under the ``airflow_plan_provider.tools`` entry-point group."""
    if isinstance(spec, ToolRegistry):
        return spec
    if isinstance(spec, Mapping):
        return ToolRegistry(list(spec.values()))
    points = entry_points(group=ENTRY_POINT_GROUP)
    if spec is None:
        registry = ToolRegistry()
        for point in points:
            registry = registry.merge(_as_registry(point.load(), point.name))
        return registry
    if ":" in spec:
        module, _, attribute = spec.partition(":")
        return _as_registry(getattr(importlib.import_module(module), attribute), spec)
    for point in points:
        if point.name == spec:
            return _as_registry(point.load(), spec)
    known = sorted(p.name for p in points)
    raise LookupError(f"no tool registry named {spec!r}; installed: {known or 'none'}")


def _as_registry(obj: Any, origin: str) -> ToolRegistry:
    if callable(obj) and not isinstance(obj, Mapping):
        obj = obj()
    if isinstance(obj, ToolRegistry):
        return obj
    raise TypeError(f"{origin} is not a ToolRegistry (got {type(obj).__name__})")
