"""Poll an asynchronous tool's job from the triggerer until it is done, failed or out of time."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_plan_provider.tools.jobs import JobOutcome, cancel_job, import_callable, poll_once


class ToolJobTrigger(BaseTrigger):
    """Call ``poll_path(handle)`` every ``poll_interval`` seconds until the job ends or ``deadline``
    passes. Yields one event: ``{"status": "done", "result": ...}``, ``{"status": "failed", "reason": ...}``
    or ``{"status": "timeout", "reason": ...}``.

    :param poll_path: dotted path (``module:function`` or ``module.function``) of the tool's poll
        function, called with the handle in a thread; it returns a
        :class:`~airflow_plan_provider.tools.jobs.JobStatus`. A poll that raises ends the job as failed.
    :param handle: what the tool's call returned to identify its job (JSON-serialisable).
    :param poll_interval: seconds between two polls.
    :param deadline: epoch time (``time.time()``) after which the job counts as timed out, or ``None``
        for no limit. An epoch, not a ``time.monotonic()`` reading, because the deadline is set in the
        worker and read on the triggerer, another process and possibly another machine.
    :param node_id: the plan node the job belongs to (shown in the triggerer's log).
    :param cancel_path: dotted path of the tool's cancel function, or ``None`` when it has none: called
        with the handle (in a thread) when a user kills the waiting task (:meth:`on_kill`).
    """

    def __init__(
        self,
        *,
        poll_path: str,
        handle: Any,
        poll_interval: float = 5.0,
        deadline: float | None = None,
        node_id: str = "",
        cancel_path: str | None = None,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # BaseTrigger.__init__ is not annotated
        self.poll_path = poll_path
        self.handle = handle
        self.poll_interval = poll_interval
        self.deadline = deadline
        self.node_id = node_id
        self.cancel_path = cancel_path

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "poll_path": self.poll_path,
                "handle": self.handle,
                "poll_interval": self.poll_interval,
                "deadline": self.deadline,
                "node_id": self.node_id,
                "cancel_path": self.cancel_path,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        outcome = await self._wait()
        yield TriggerEvent(outcome.payload())

    async def _wait(self) -> JobOutcome:
        """Poll by :func:`~airflow_plan_provider.tools.jobs.poll_once`'s rules (each poll in a thread)."""
        poll = import_callable(self.poll_path)
        while (outcome := await asyncio.to_thread(poll_once, poll, self.handle, self.deadline)) is None:
            await asyncio.sleep(self.poll_interval)
        return outcome

    async def on_kill(self) -> None:
        """A user killed the waiting task (marked it failed or cleared it): cancel the job, when its tool
        can. Not on a triggerer's restart or a timeout, which Airflow does not report here."""
        if self.cancel_path is None:
            return
        cancel = import_callable(self.cancel_path)
        failed = await asyncio.to_thread(cancel_job, cancel, self.handle)
        if failed:
            self.log.warning("node %s: the job was not cancelled: %s", self.node_id, failed)
        else:
            self.log.info("node %s: the job was cancelled", self.node_id)
