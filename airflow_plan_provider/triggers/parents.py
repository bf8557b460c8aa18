"""Wait on the triggerer until a node's parents (instances of the run's node tasks) have finished."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_plan_provider.triggers.payloads import PARENTS_READY

FINISHED = frozenset({"success", "failed", "skipped", "upstream_failed", "removed"})


def finished_states(task_states: dict[str, Any], run_id: str, parents: Mapping[str, list[int]]) -> bool:
    """Whether every task instance named in ``parents`` (task id → map indexes) has finished."""
    states = task_states.get(run_id, {})
    return all(
        states.get(f"{task_id}_{index}") in FINISHED
        for task_id, indexes in parents.items()
        for index in indexes
    )


class ParentsFinishedTrigger(BaseTrigger):
    """Poll the states of the mapped task instances ``parents`` (task id → map indexes) of one run until
    all have finished, then yield ``{"status": "ready"}``.

    :param dag_id: the plan DAG's id.
    :param run_id: the run whose task instances are waited for.
    :param parents: task id → the map indexes of that task to wait for.
    :param node_task_id: with ``map_indexes``, the form triggers serialized before nodes ran in several
        tasks (pool lanes); it is still read, so a trigger deferred by an earlier version resumes.
    :param map_indexes: the map indexes of ``node_task_id``.
    :param poll_interval: seconds between two reads of the task states.
    """

    def __init__(
        self,
        *,
        dag_id: str,
        run_id: str,
        parents: Mapping[str, list[int]] | None = None,
        node_task_id: str | None = None,
        map_indexes: list[int] | None = None,
        poll_interval: float = 1.0,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # BaseTrigger.__init__ is not annotated
        self.dag_id = dag_id
        self.run_id = run_id
        merged = {task_id: list(indexes) for task_id, indexes in (parents or {}).items()}
        if node_task_id is not None:
            merged.setdefault(node_task_id, []).extend(map_indexes or [])
        self.parents = merged
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "dag_id": self.dag_id,
                "run_id": self.run_id,
                "parents": self.parents,
                "poll_interval": self.poll_interval,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance
        from asgiref.sync import sync_to_async

        while True:
            states = await sync_to_async(RuntimeTaskInstance.get_task_states)(
                dag_id=self.dag_id, task_ids=sorted(self.parents), run_ids=[self.run_id]
            )
            if finished_states(states, self.run_id, self.parents):
                yield TriggerEvent({"status": PARENTS_READY})
                return
            await asyncio.sleep(self.poll_interval)
