"""A tool as a plan calls it: its name, description, argument schema, function and origin, and what a
call of it may know (:class:`ToolContext`). Tools are declared on a :class:`~.registry.ToolRegistry`."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

import jsonschema
from pydantic import BaseModel, create_model

# a tool's pool name becomes part of task ids (``nodes__<pool>``): the characters Airflow allows there
POOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")


@dataclass(frozen=True)
class ToolContext:
    """What a tool may know about the call: where it runs and how to stay idempotent.

    ``idempotency_key`` is the same for every try of one node in one revision of a session (and differs
    for a revised node in a later revision), so a tool that performs a side effect can perform it once.

    :param node_id: the plan node being run.
    :param idempotency_key: the call's key (DAG, root run, node, tool, params).
    :param attempt: the try number, from 1.
    :param missing_inputs: the optional parents that did not succeed; their references reach the tool
        as ``None``.
    :param run_id: the Airflow run the node runs in.
    :param revision: the plan's revision in the session (0 before any replan).
    :param dag_id: the DAG the node runs in.
    """

    node_id: str
    idempotency_key: str
    attempt: int = 1
    missing_inputs: tuple[str, ...] = ()
    run_id: str = ""
    revision: int = 0
    dag_id: str = ""


OriginKind = Literal["python", "mcp", "sql", "http", "common-ai"]


@dataclass(frozen=True)
class ToolOrigin:
    """Where a tool comes from, as shown in the plan view, the node log and ``airflow-plan tools``.

    :param kind: ``python`` (a function registered here), ``mcp`` (a tool of an MCP server), ``sql``
        (a read-only query over an Airflow connection), ``http`` (an endpoint behind an Airflow
        connection) or ``common-ai`` (a common-ai ``AirflowTool``).
    :param conn_id: the Airflow connection the tool goes through, if any.
    :param name: what the source calls the tool (an MCP server's own tool name, a function's module
        and name, an endpoint's method and path).
    """

    kind: OriginKind = "python"
    conn_id: str | None = None
    name: str | None = None

    def label(self) -> str:
        """One line, say ``mcp · conn demo_mcp · get_latency`` or ``python · plan_demo.tools.latency``."""
        return " · ".join(
            [
                self.kind,
                *([f"conn {self.conn_id}"] if self.conn_id else []),
                *([self.name] if self.name else []),
            ]
        )

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in (("kind", self.kind), ("conn_id", self.conn_id), ("name", self.name)) if v}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToolOrigin:
        return cls(kind=data.get("kind", "python"), conn_id=data.get("conn_id"), name=data.get("name"))


@dataclass
class Tool:
    """A function a plan node can call, with what the planner is told about it and how it runs.

    Usually made by :meth:`ToolRegistry.tool`.

    :param name: the name plan nodes use in ``tool``.
    :param description: what the planner is told the tool does.
    :param func: the function, called with the node's resolved params as keyword arguments (and
        ``ctx``, a :class:`ToolContext`, when it accepts one).
    :param args_schema: the JSON Schema of the params; checked when the plan is validated and again
        after references are resolved.
    :param poll: for an asynchronous tool, the module-level function that takes what ``func`` returned
        (the job's handle) and returns a :class:`~airflow_plan_provider.tools.jobs.JobStatus`.
    :param poll_interval: seconds between two polls.
    :param timeout: seconds an asynchronous job may take, ``None`` for the task's ``execution_timeout``.
    :param pool: an Airflow pool whose slots every node calling the tool takes.
    :param pool_slots: how many of the pool's slots one node takes.
    :param needs_approval: a risky tool: a plan DAG asks a human before a node calling it runs.
    :param origin: where the tool comes from (default: a Python function).
    :param cancel: for an asynchronous tool, the module-level function that takes the job's handle and
        stops the job: called when the node's task is killed (marked failed or cleared) while its job
        runs (:func:`~airflow_plan_provider.tools.jobs.cancel_job`).
    """

    name: str
    description: str
    func: Callable[..., Any] = field(repr=False)  # a function's repr carries its memory address
    args_schema: dict[str, Any]
    poll: Callable[..., Any] | None = field(default=None, repr=False)  # asynchronous tools (tools.jobs)
    poll_interval: float = 5.0
    timeout: float | None = None
    pool: str | None = None  # an Airflow pool: nodes calling this tool take slots from it
    pool_slots: int = 1
    needs_approval: bool = False  # risky: a plan DAG asks a human before a node calling it runs
    origin: ToolOrigin = field(default_factory=ToolOrigin)
    cancel: Callable[[Any], Any] | None = field(default=None, repr=False)  # stops an asynchronous job
    wants_ctx: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self.wants_ctx = "ctx" in inspect.signature(self.func).parameters
        if self.pool is not None and (not isinstance(self.pool, str) or not POOL_NAME.fullmatch(self.pool)):
            raise ValueError(
                f"tool {self.name!r}: pool {self.pool!r} must be 1 to 100 letters, digits, '_', '.' or '-' "
                "(it names the node tasks that use it)"
            )
        if isinstance(self.pool_slots, bool) or not isinstance(self.pool_slots, int) or self.pool_slots < 1:
            raise ValueError(
                f"tool {self.name!r}: pool_slots must be an integer >= 1, got {self.pool_slots!r}"
            )
        if self.pool is None and self.pool_slots != 1:
            raise ValueError(f"tool {self.name!r}: pool_slots needs a pool")
        if self.cancel is not None:
            if self.poll is None:
                raise ValueError(f"tool {self.name!r}: cancel stops a job, so it needs poll")
            from airflow_plan_provider.tools.jobs import callable_path

            callable_path(self.cancel)  # the triggerer imports it: a module-level function

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

    def fingerprint(self) -> dict[str, Any]:
        """What the tool offers, as JSON-able data that is the same in every process."""
        pooled = {"pool": self.pool, "pool_slots": self.pool_slots} if self.pool else {}
        return {
            **self.describe(),
            "async": self.is_async,
            "poll_interval": self.poll_interval,
            "timeout": self.timeout,
            **pooled,
            # only when set, so the digests of catalogs without risky tools stay as they were
            **({"needs_approval": True} if self.needs_approval else {}),
            **({"origin": self.origin.to_dict()} if self.origin.kind != "python" else {}),
        }


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
