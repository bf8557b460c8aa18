"""Asynchronous tools: start a job, then report its status when polled.

An asynchronous tool's function starts the job and returns a JSON-serialisable handle; its ``poll``
function (a module-level function, so the triggerer can import it) takes the handle and returns a
:class:`JobStatus`. The node waits on Airflow's triggerer, holding no worker slot::

    def poll_export(handle: dict) -> JobStatus:
        state = client.status(handle["job_id"])
        if state == "running":
            return JobStatus.pending()
        return JobStatus.done(client.result(handle["job_id"])) if state == "ok" else JobStatus.failed(state)

    @registry.tool(poll=poll_export, poll_interval=10, timeout=3600)
    def export_table(table: str, *, ctx) -> dict:
        return {"job_id": client.submit(table, idempotency_key=ctx.idempotency_key)}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class JobStatus:
    state: Literal["pending", "done", "failed"]
    result: Any = None
    reason: str = ""

    @classmethod
    def pending(cls) -> JobStatus:
        return cls("pending")

    @classmethod
    def done(cls, result: Any = None) -> JobStatus:
        return cls("done", result=result)

    @classmethod
    def failed(cls, reason: str) -> JobStatus:
        return cls("failed", reason=reason)


def callable_path(func: Any) -> str:
    """The dotted import path of a module-level function (what a trigger stores to find it again)."""
    qualname = getattr(func, "__qualname__", "")
    if not qualname or "<" in qualname:
        raise ValueError(f"{func!r} must be a module-level function so the triggerer can import it")
    return f"{func.__module__}.{qualname}"


def import_callable(path: str) -> Any:
    import importlib

    module, _, name = path.rpartition(".")
    obj: Any = importlib.import_module(module)
    return getattr(obj, name)
