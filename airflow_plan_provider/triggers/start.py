"""The trigger a node that has parents starts with, on the triggerer (``NodeExecution(start_on_triggerer=
True)``): Airflow defers the instance the moment it schedules it, so the node takes no task start and
no slot until its parents run their tools or have finished.

Airflow hands the trigger the same keyword arguments for every instance of the task (those of the
operator's ``start_trigger_args``), and the instance's own task instance (its run, task and map index) on
the triggerer. From those the trigger reads the node's brief (:class:`~airflow_plan_provider.contract.
NodeBrief`, which the planning task publishes in groups for these tasks whatever their size; the
triggers of one group, which Airflow starts together, share one read of it) and then
waits as a node deferred from its slot does (:class:`~.parents.ParentsFinishedTrigger`, whose
``seen_far`` has the node come back to a slot as soon as its parents run their tools; in a run without
slots to spare, :attr:`~airflow_plan_provider.plan.session.RunContext.near_while_idle`, only while the run
leaves a slot idle). The node resumes
in :meth:`~airflow_plan_provider.operators.node.PlanNodeOperator.resume_after_parents` with that
trigger's event, and from there runs as any node does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_plan_provider.contract import BRIEFS_PER_XCOM, PLAN_TASK, NodeBrief, briefs_key
from airflow_plan_provider.plan.calls import key_scope
from airflow_plan_provider.plan.waiting import Wait, WaitingPolicy
from airflow_plan_provider.triggers.parents import ParentsFinishedTrigger, shared_work, trigger_of_brief

POLICY = WaitingPolicy()
log = logging.getLogger(__name__)

#: seconds a read of a group of briefs serves the other start triggers of its group: Airflow starts a
#: run's start triggers within a few rounds of the triggerer, so one read serves a whole group
#: (:data:`~airflow_plan_provider.contract.BRIEFS_PER_XCOM` nodes) instead of one read per node
BRIEF_GROUP_AGE = 10.0
#: (event loop, DAG, run, planning task, brief group key, try) → (when it was asked for, the read). The
#: try is in the key: a run cleared and planned again gives its nodes a new try, never the old briefs
_BRIEF_GROUPS: dict[tuple[object, str, str, str, str, int], tuple[float, asyncio.Future[Any]]] = {}


class NodeStartTrigger(BaseTrigger):
    """Read the brief of the node instance this trigger runs for, then wait for its parents
    (:class:`~.parents.ParentsFinishedTrigger`, its events passed on). Fires ``{"status": "ready",
    "parents_read": False}`` at once when it has no task instance (run outside a triggerer), when the
    brief cannot be read, or when the node has no parent: the node then starts in its slot and reads its
    brief itself, which names any fault.

    :param poll_interval: seconds between two reads of the parents' states.
    :param checkpoints: whether the DAG keeps checkpoints (the trigger then also looks for the parents'
        results in ``artifact_store``).
    :param artifact_store: the store the checkpoints are in (None: the default store).
    """

    def __init__(
        self,
        *,
        poll_interval: float = POLICY.trigger_poll,
        checkpoints: bool = True,
        artifact_store: str | None = None,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # BaseTrigger.__init__ is not annotated
        self.poll_interval = poll_interval
        self.checkpoints = checkpoints
        self.artifact_store = artifact_store

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "poll_interval": self.poll_interval,
                "checkpoints": self.checkpoints,
                "artifact_store": self.artifact_store,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        ti = self.task_instance
        brief = await self._brief(ti) if ti is not None else None
        if brief is None or not brief.parents:
            # the node reads its parents in its slot: say so, so its log does not claim they finished
            yield TriggerEvent({"status": Wait.READY.value, "parents_read": False})
            return
        waiting = self.waiting(ti, brief)
        waiting.task_instance = ti
        async for event in waiting.run():
            yield event

    def waiting(self, ti: Any, brief: NodeBrief) -> ParentsFinishedTrigger:
        """The wait of node ``brief`` (task instance ``ti``) for its parents: what a node deferred from
        its slot waits on (:func:`~.parents.trigger_of_brief`), coming back to a slot as soon as its
        parents run their tools (in a run without slots to spare, ``brief.run.near_while_idle``, only
        while the run leaves a slot idle). Its deferral holds nothing (``start_on_triggerer`` needs no
        task cap and no pool counting deferred instances)."""
        prefix = _group_prefix(ti.task_id)
        scope = key_scope(ti.dag_id, prefix.rstrip("."))
        return trigger_of_brief(
            brief,
            dag_id=ti.dag_id,
            run_id=ti.run_id,
            prefix=prefix,
            poll_interval=self.poll_interval,
            checkpoint_keys=brief.parent_keys(scope, ti.run_id) if self.checkpoints else {},
            artifact_store=self.artifact_store,
            free_deferral=True,
            came_back=False,
            seen_far=True,
        )

    @staticmethod
    async def _brief(ti: Any) -> NodeBrief | None:
        """The node's brief, from its group published by the planning task (None when it cannot be read).
        The triggers of one group read it once (:data:`BRIEF_GROUP_AGE`); a shared read that fails is
        tried again alone, so one failure does not move a whole group to its slots."""
        prefix = _group_prefix(ti.task_id)
        task_id = ti.task_id.removeprefix(prefix)
        key = briefs_key(task_id, ti.map_index)

        def read() -> Any:
            return ti.axcom_pull(task_ids=prefix + PLAN_TASK, key=key, map_indexes=-1)

        shared = (asyncio.get_running_loop(), ti.dag_id, ti.run_id, prefix + PLAN_TASK, key, ti.try_number)
        try:
            try:
                briefs = await shared_work(_BRIEF_GROUPS, shared, BRIEF_GROUP_AGE, read)
            except Exception:
                briefs = await read()
            return NodeBrief.model_validate(briefs[ti.map_index % BRIEFS_PER_XCOM])
        except Exception as error:  # the node reads it again in its slot, and names the fault there
            log.warning(
                "could not read the brief of %s[%s] (%s); starting it in a slot",
                ti.task_id,
                ti.map_index,
                error,
            )
            return None


def _group_prefix(task_id: str) -> str:
    """The task group prefix of a node task's id (``triage.nodes__after`` → ``triage.``): a node task's
    own id has no dot."""
    return task_id[: task_id.rfind(".") + 1]
