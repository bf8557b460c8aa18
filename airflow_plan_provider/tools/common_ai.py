"""The ``AirflowTool`` objects of Airflow's common-ai provider as plan tools (when common-ai is installed).

A team that already configured common-ai toolsets (``SQLToolset``, ``HookToolset``, ...) reuses them as
they are::

    from airflow.providers.common.ai.toolsets.hook import HookToolset
    from airflow.providers.postgres.hooks.postgres import PostgresHook

    toolset = HookToolset(PostgresHook(postgres_conn_id="warehouse"), allowed_methods=["get_records"])
    for tool in common_ai_tools(toolset, prefix="wh."):
        registry.add(tool)

Each ``AirflowTool`` (name, description, JSON Schema ``parameters``, async function) becomes a plan tool
of the same schema, called through ``AirflowTool.call`` (which runs common-ai's secrets masker on what it
returns); its output is the result's content (JSON text decoded, so a plan can reference into it). A
result common-ai marks ``is_error`` (a call the model could correct) fails the node for good with its
text, so the session may replan; a ``ToolCallError`` (a failure the arguments cannot fix) is transient,
and Airflow retries the node. The toolset's tools are read when the DAG is built, as common-ai's
toolsets build them (no connection is opened for it).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from airflow_plan_provider.exceptions import PermanentToolError, TransientToolError
from airflow_plan_provider.tools.mcp import run_async
from airflow_plan_provider.tools.sources import bounded_text
from airflow_plan_provider.tools.tool import Tool, ToolOrigin

MAX_ERROR_CHARS = 2000


def common_ai_tools(
    source: Any,
    *,
    prefix: str = "",
    needs_approval: bool = False,
    pool: str | None = None,
    pool_slots: int = 1,
) -> list[Tool]:
    """Plan tools from common-ai ``AirflowTool`` objects: ``source`` is a toolset (anything with
    ``airflow_tools()``, common-ai's ``ToolProvider``) or a sequence of ``AirflowTool``.

    :param prefix: put before each tool's name in plans.
    :param needs_approval: whether a plan calling these tools waits for approval.
    :param pool: an Airflow pool every node calling one of them takes ``pool_slots`` of.
    """
    tools: Sequence[Any] = source.airflow_tools() if hasattr(source, "airflow_tools") else list(source)
    conn_id = _conn_id(source)
    return [
        Tool(
            name=f"{prefix}{tool.name}",
            description=str(tool.description or ""),
            func=CommonAiCall(tool),
            args_schema=dict(tool.parameters),
            pool=pool,
            pool_slots=pool_slots,
            needs_approval=needs_approval,
            origin=ToolOrigin("common-ai", conn_id=conn_id, name=tool.name),
        )
        for tool in tools
    ]


@dataclass(frozen=True)
class CommonAiCall:
    """Calls one ``AirflowTool`` as a node's tool function."""

    tool: Any

    def __repr__(self) -> str:  # a DAG carries its tools: no memory address in what it serializes
        return f"CommonAiCall({self.tool.name!r})"

    def __call__(self, **params: Any) -> Any:
        from airflow.providers.common.ai.tools import ToolCallError

        where = f"common-ai tool {self.tool.name!r}"
        try:
            result = run_async(lambda: self.tool.call(params))
        except ToolCallError as error:
            raise TransientToolError(f"{where}: {bounded_text(error, MAX_ERROR_CHARS)}") from None
        if result.is_error:
            raise PermanentToolError(
                f"{where} answered with an error: {bounded_text(result.content, MAX_ERROR_CHARS)}"
            )
        return _decoded(result.content)


def _decoded(content: Any) -> Any:
    """What a node outputs: common-ai's toolsets hand the model JSON text (a hook's records, say); text
    holding a JSON array or object becomes that value, so a plan can reference into it (``${1.0}``)."""
    if isinstance(content, str) and content.lstrip()[:1] in ("[", "{"):
        try:
            return json.loads(content)
        except ValueError:
            return content
    return content


def _conn_id(source: Any) -> str | None:
    """The connection a toolset's hook uses, where it says (``conn_name_attr``)."""
    hook = getattr(source, "hook", None) or getattr(source, "_hook", None)
    attr = getattr(hook, "conn_name_attr", None)
    value = getattr(hook, attr, None) if isinstance(attr, str) else None
    return value if isinstance(value, str) else None
