"""Poll an asynchronous tool's job from the triggerer until it is done, failed or out of time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_plan_provider.tools.jobs import JobStatus, import_callable


class ToolJobTrigger(BaseTrigger):
    """Call ``poll_path(handle)`` every ``poll_interval`` seconds until the job ends or ``deadline`` (an
    epoch time) passes. Yields one event: ``{"status": "done", "result": ...}``,
    ``{"status": "failed", "reason": ...}`` or ``{"status": "timeout", "reason": ...}``.
    """

    def __init__(
        self,
        *,
        poll_path: str,
        handle: Any,
        poll_interval: float = 5.0,
        deadline: float | None = None,
        node_id: str = "",
    ) -> None:
        super().__init__()
        self.poll_path = poll_path
        self.handle = handle
        self.poll_interval = poll_interval
        self.deadline = deadline
        self.node_id = node_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "poll_path": self.poll_path,
                "handle": self.handle,
                "poll_interval": self.poll_interval,
                "deadline": self.deadline,
                "node_id": self.node_id,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        poll = import_callable(self.poll_path)
        while True:
            try:
                status = await asyncio.to_thread(poll, self.handle)
            except Exception as error:  # a poll that raises ends the job as failed, with the reason
                yield TriggerEvent(
                    {"status": "failed", "reason": f"polling raised {type(error).__name__}: {error}"}
                )
                return
            if not isinstance(status, JobStatus):
                yield TriggerEvent(
                    {
                        "status": "failed",
                        "reason": f"poll returned {type(status).__name__}, expected JobStatus",
                    }
                )
                return
            if status.state == "done":
                yield TriggerEvent({"status": "done", "result": status.result})
                return
            if status.state == "failed":
                yield TriggerEvent({"status": "failed", "reason": status.reason or "the job failed"})
                return
            if self.deadline is not None and time.time() >= self.deadline:
                yield TriggerEvent(
                    {"status": "timeout", "reason": "the job did not finish before its timeout"}
                )
                return
            await asyncio.sleep(self.poll_interval)
