"""An operator that asks to start on the triggerer (``start_from_trigger``), and the trigger it starts
with: imported by every component of ``bench/start_from_trigger.py``'s cluster (the folder is on their
``PYTHONPATH``), the triggerer loading the trigger by its class path.

Each method returns what it saw as the task's XCom, so the script reads from the REST API alone what ran:
``execute`` (the instance started on a worker) or ``execute_complete`` (it started on the triggerer and
resumed on a worker with the trigger's event), the map index the trigger saw, and the value of a
templated trigger kwarg the triggerer rendered for the instance.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.sdk import BaseOperator
from airflow.triggers.base import BaseTrigger, StartTriggerArgs, TriggerEvent

#: a trigger kwarg that is also a template field of the operator (``tag``: an operator's ``label`` is a
#: read-only property), rendered for each task instance
TAG = "{{ ti.map_index }}"
TRIGGER_SECONDS = 1.0


class ReportingTrigger(BaseTrigger):
    """Fires after ``delay`` seconds with the map index of the task instance it runs for and its
    ``tag`` as it was handed over."""

    def __init__(self, tag: str = "", delay: float = TRIGGER_SECONDS) -> None:
        super().__init__()
        self.tag = tag
        self.delay = delay

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{__name__}.ReportingTrigger", {"tag": self.tag, "delay": self.delay})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        await asyncio.sleep(self.delay)
        ti = getattr(self, "task_instance", None)
        yield TriggerEvent({"map_index": getattr(ti, "map_index", None), "tag": self.tag})


class TriggerFirstOperator(BaseOperator):
    """Starts on the triggerer with :class:`ReportingTrigger` where Airflow does that; else ``execute``
    runs on a worker and returns at once."""

    template_fields = ("x", "tag")
    start_from_trigger = True
    tag = TAG
    start_trigger_args = StartTriggerArgs(
        trigger_cls=f"{__name__}.ReportingTrigger",
        trigger_kwargs={"tag": TAG, "delay": TRIGGER_SECONDS},
        next_method="execute_complete",
        next_kwargs=None,
        timeout=None,
    )

    def __init__(self, *, x: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.x = x

    def execute(self, context: Any) -> dict[str, Any]:
        return {"ran": "execute", "map_index": context["ti"].map_index}

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> dict[str, Any]:
        event = event or {}
        return {
            "ran": "execute_complete",
            "map_index": context["ti"].map_index,
            "trigger_map_index": event.get("map_index"),
            "trigger_tag": event.get("tag"),
        }
