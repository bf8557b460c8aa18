"""Asynchronous tools: start a job, then report its status when polled.

An asynchronous tool's function starts the job and returns a JSON-serialisable handle; its ``poll``
function (a module-level function, so the triggerer can import it) takes the handle and returns a
:class:`JobStatus`. The node waits on Airflow's triggerer, holding no worker slot. Its optional
``cancel`` function (module-level too) takes the handle and stops the job: it is called when the
node's task is killed while the job runs (:func:`cancel_job`)::

    def poll_export(handle: dict) -> JobStatus:
        state = client.status(handle["job_id"])
        if state == "running":
            return JobStatus.pending()
        return JobStatus.done(client.result(handle["job_id"])) if state == "ok" else JobStatus.failed(state)

    def cancel_export(handle: dict) -> None:
        client.cancel(handle["job_id"])

    @registry.tool(poll=poll_export, cancel=cancel_export, poll_interval=10, timeout=3600)
    def export_table(table: str, *, ctx) -> dict:
        return {"job_id": client.submit(table, idempotency_key=ctx.idempotency_key)}
"""

from __future__ import annotations

import time
from collections.abc import Callable
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


@dataclass(frozen=True)
class JobOutcome:
    """How an asynchronous tool's job ended, as :func:`poll_once` tells it (and
    :class:`~airflow_plan_provider.triggers.job.ToolJobTrigger` reports it in its event).

    :param status: ``done`` (``result`` holds the job's result), ``failed`` or ``timeout`` (``reason``
        says why).
    :param result: the job's result when it is done (JSON-serialisable, may be ``None``).
    :param reason: why the job failed or timed out.
    """

    status: Literal["done", "failed", "timeout"]
    result: Any = None
    reason: str = ""

    def payload(self) -> dict[str, Any]:
        """The trigger event's payload."""
        if self.status == "done":
            return {"status": "done", "result": self.result}
        return {"status": self.status, "reason": self.reason}


def poll_once(poll: Callable[[Any], Any], handle: Any, deadline: float | None) -> JobOutcome | None:
    """Poll a job once: its :class:`JobOutcome`, or ``None`` while it is pending and ``deadline`` (epoch
    seconds, ``time.time()``; ``None`` for no limit) has not passed. The one set of polling rules: the
    triggerer (``ToolJobTrigger``) and the local runner both wait for a job by calling this every
    ``poll_interval`` seconds until it returns an outcome.

    A poll that raises, or returns anything but a :class:`JobStatus`, ends the job as failed, with the
    reason.

    >>> poll_once(lambda handle: JobStatus.done({"rows": 3}), "job-1", None)
    JobOutcome(status='done', result={'rows': 3}, reason='')
    >>> poll_once(lambda handle: JobStatus.pending(), "job-1", deadline=0.0).status
    'timeout'
    """
    try:
        status = poll(handle)
    except Exception as error:  # a poll that raises ends the job as failed, with the reason
        return JobOutcome("failed", reason=f"polling raised {type(error).__name__}: {error}")
    if not isinstance(status, JobStatus):
        return JobOutcome("failed", reason=f"poll returned {type(status).__name__}, expected JobStatus")
    if status.state == "done":
        return JobOutcome("done", result=status.result)
    if status.state == "failed":
        return JobOutcome("failed", reason=status.reason or "the job failed")
    if deadline is not None and time.time() >= deadline:
        return JobOutcome("timeout", reason="the job did not finish before its timeout")
    return None


def cancel_job(cancel: Callable[[Any], Any], handle: Any) -> str | None:
    """Stop a job with its tool's ``cancel`` function: None once it returned, else why it could not
    (a cancel that raises is reported, never raised: the task it runs for is being killed anyway).

    >>> cancel_job(lambda handle: None, "job-1") is None
    True
    >>> cancel_job(lambda handle: 1 / 0, "job-1")
    'cancel raised ZeroDivisionError: division by zero'
    """
    try:
        cancel(handle)
    except Exception as error:
        return f"cancel raised {type(error).__name__}: {error}"
    return None


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
