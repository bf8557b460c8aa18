"""Wait on the triggerer until a node's parents (instances of the same mapped task) have finished."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

FINISHED = frozenset({"success", "failed", "skipped", "upstream_failed", "removed"})


def finished_states(task_states: dict[str, Any], run_id: str, task_id: str, map_indexes: list[int]) -> bool:
    states = task_states.get(run_id, {})
    return all(states.get(f"{task_id}_{index}") in FINISHED for index in map_indexes)


class ParentsFinishedTrigger(BaseTrigger):
    """Poll the states of ``node_task_id``'s mapped instances ``map_indexes`` in one run until all have
    finished, then yield ``{"status": "ready"}``."""

    def __init__(
        self,
        *,
        dag_id: str,
        run_id: str,
        node_task_id: str,
        map_indexes: list[int],
        poll_interval: float = 1.0,
    ) -> None:
        super().__init__()
        self.dag_id = dag_id
        self.run_id = run_id
        self.node_task_id = node_task_id
        self.map_indexes = list(map_indexes)
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "dag_id": self.dag_id,
                "run_id": self.run_id,
                "node_task_id": self.node_task_id,
                "map_indexes": self.map_indexes,
                "poll_interval": self.poll_interval,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance
        from asgiref.sync import sync_to_async

        while True:
            states = await sync_to_async(RuntimeTaskInstance.get_task_states)(
                dag_id=self.dag_id, task_ids=[self.node_task_id], run_ids=[self.run_id]
            )
            if finished_states(states, self.run_id, self.node_task_id, self.map_indexes):
                yield TriggerEvent({"status": "ready"})
                return
            await asyncio.sleep(self.poll_interval)
