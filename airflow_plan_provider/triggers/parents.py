"""The trigger a node waits on for its parents, holding no worker slot: it reads their task instance
states and applies the waiting policy (:mod:`airflow_plan_provider.plan.waiting`, where the rules and the
argument that they cannot deadlock are written)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from functools import partial
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_plan_provider import compat
from airflow_plan_provider.contract import NodeBrief
from airflow_plan_provider.plan.session import RunSlots
from airflow_plan_provider.plan.waiting import FINISHED, Wait, WaitingPolicy, leaves_a_slot_idle

POLICY = WaitingPolicy()
log = logging.getLogger(__name__)


def parent_states(
    task_states: Mapping[str, Any], run_id: str, parents: Mapping[str, list[int]]
) -> list[str | None]:
    """The states of the task instances ``parents`` (task id → map indexes), from what
    ``RuntimeTaskInstance.get_task_states`` returned; None for an instance without a state."""
    states = task_states.get(run_id, {})
    return [states.get(f"{task_id}_{index}") for task_id, indexes in parents.items() for index in indexes]


class ParentsFinishedTrigger(BaseTrigger):
    """Poll the states of the mapped task instances ``parents`` (task id → map indexes) of one run until
    all have finished (``{"status": "ready"}``), until one of them waits for a slot again
    (``{"status": "make_way"}``: the deferred node lets go of its task's cap, see the module docstring),
    or, given ``grandparents``, until the parents start their tools (``{"status": "wait"}``: the node
    comes back to wait for them in a slot, :meth:`~.WaitingPolicy.trigger_move`; not when they ran
    their tools at the first read already).

    Between two reads, while every unfinished parent runs, the trigger looks for the parents'
    checkpoints (``checkpoints``, in ``artifact_store``; :meth:`~.WaitingPolicy.trigger_watches`): a
    parent saves one the moment its tool returns, before its record and its task's end reach the
    metadata database, so when every unfinished parent saved one in this run the node is ready (it
    resumes and starts on those, as a node waiting in its slot does). The triggers of one triggerer share
    those looks too (:func:`shared_checkpoint`).

    The triggers of one triggerer waiting in the same run share their reads
    (:func:`shared_task_states`): one request per poll interval, however many nodes of the run wait. A
    read that fails (the API server or the metadata database away for a while) is read again after the
    policy's growing pause (:meth:`~airflow_plan_provider.plan.waiting.WaitingPolicy.read_retry_pause`):
    the node keeps waiting, and one log line names the outage and one its end.

    :param dag_id: the plan DAG's id.
    :param run_id: the run whose task instances are waited for.
    :param parents: task id → the map indexes of that task to wait for.
    :param poll_interval: seconds between two reads of the task states.
    :param checkpoints: each parent instance (``<task id>_<map index>``) → the key of its node's
        checkpoint; empty when the DAG keeps none (the trigger then reads states only).
    :param artifact_store: the store the checkpoints are in (None: the default store).
    :param grandparents: each parent instance → its own parents' instances (``<task id>_<map index>``),
        while the node may still come back to wait near its parents in this try; None: it waits to the
        end.
    :param run_slots: in a run without slots to spare, its slots and node tasks
        (:class:`~airflow_plan_provider.plan.session.RunSlots`, the tasks with the group's prefix): the
        node comes back to wait near its parents only while fewer of those tasks' instances than the
        slots hold or wait for one (:func:`~airflow_plan_provider.plan.waiting.leaves_a_slot_idle`; the
        same read). None: as soon as its parents run their tools.
    :param seen_far: the node has not waited near its parents yet (it started on the triggerer,
        :class:`~airflow_plan_provider.triggers.start.NodeStartTrigger`): given ``grandparents``, it comes
        back to wait for them as soon as they run their tools, at the first read too.
    :param free_deferral: the deferred node holds nothing another instance could wait for
        (:class:`~airflow_plan_provider.plan.waiting.WaitView`): it keeps waiting for a parent that
        needs a slot, instead of making way. Only on a triggerer (which gives a trigger its task
        instance): run inline, as ``dag.test()`` runs a deferred task's trigger in the task's own
        process to its first event before any other task runs, the trigger cannot wait for a parent
        that needs a slot, and makes way.
    """

    def __init__(
        self,
        *,
        dag_id: str,
        run_id: str,
        parents: Mapping[str, list[int]],
        poll_interval: float = POLICY.trigger_poll,
        checkpoints: Mapping[str, str] | None = None,
        artifact_store: str | None = None,
        free_deferral: bool = False,
        grandparents: Mapping[str, list[str]] | None = None,
        run_slots: Mapping[str, Any] | None = None,
        seen_far: bool = False,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # BaseTrigger.__init__ is not annotated
        self.dag_id = dag_id
        self.run_id = run_id
        self.parents = {task_id: list(indexes) for task_id, indexes in parents.items()}
        self.poll_interval = poll_interval
        self.checkpoints = dict(checkpoints or {})
        self.artifact_store = artifact_store
        self.free_deferral = free_deferral
        self.grandparents = (
            None if grandparents is None else {key: list(keys) for key, keys in grandparents.items()}
        )
        self.run_slots = None if run_slots is None else RunSlots.model_validate(run_slots)
        self.seen_far = seen_far

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "dag_id": self.dag_id,
                "run_id": self.run_id,
                "parents": self.parents,
                "poll_interval": self.poll_interval,
                "checkpoints": self.checkpoints,
                "artifact_store": self.artifact_store,
                "free_deferral": self.free_deferral,
                "grandparents": self.grandparents,
                "run_slots": None if self.run_slots is None else self.run_slots.model_dump(mode="json"),
                "seen_far": self.seen_far,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        if compat.task_states_reader() is None:  # the node reads its parents' states itself, in its slot
            log.warning("this Airflow has no task states read for triggers: waking the node to look itself")
            await asyncio.sleep(self.poll_interval)
            yield TriggerEvent({"status": Wait.READY.value})
            return
        failures, failing_since, held = 0, 0.0, False
        seen_far = self.seen_far  # a read saw a parent wait on its own parents: the node may come back
        while True:
            try:
                states = await shared_task_states(
                    self.dag_id, self.run_id, self._task_ids(), max_age=self.poll_interval
                )
            except Exception as error:  # a service away for a while costs a delay, never the node
                if not failures:
                    failing_since = time.monotonic()
                    log.warning(
                        "could not read the parents' states of %s (%s); reading again", self.run_id, error
                    )
                failures += 1
                await asyncio.sleep(POLICY.read_retry_pause(failures))
                continue
            if failures:
                log.info(
                    "read the parents' states of %s again after %d failed read(s) over %.1f s",
                    self.run_id,
                    failures,
                    time.monotonic() - failing_since,
                )
                failures = 0
            parents = parent_states(states, self.run_id, self.parents)
            grandparents = self._grandparent_states(states)
            near = grandparents if seen_far else None
            move = POLICY.trigger_move(parents, free_deferral=self._free(), grandparents=near)
            slots = self.run_slots
            if move is Wait.WAIT and slots is not None and not self._slot_idle(states, slots):
                move = None
                if not held:
                    held = True
                    log.info(
                        "its parents run their tools, but the run's %d slots are all taken or waited"
                        " for: it comes near them once one is idle",
                        slots.slots,
                    )
            seen_far = seen_far or (
                grandparents is not None and not POLICY.parents_run_tools(parents, grandparents)
            )
            if move is None and await self._saved_before_next_read(states):
                move = Wait.READY
            if move is not None:
                yield TriggerEvent({"status": move.value})
                return

    def _task_ids(self) -> list[str]:
        """The tasks one read returns: the parents', and while the node may come back to wait, the
        grandparents' (a read returns every instance of the tasks asked for)."""
        tasks = set(self.parents)
        for keys in (self.grandparents or {}).values():
            tasks.update(key.rpartition("_")[0] for key in keys)
        if self.run_slots is not None and self.grandparents is not None:
            tasks.update(self.run_slots.tasks)
        return sorted(tasks)

    def _slot_idle(self, states: RunStates, slots: RunSlots) -> bool:
        """Whether the run leaves one of its ``slots`` idle for the node to wait near its parents in,
        counted over the instances of its node tasks in the read (once per read, for every trigger of
        the run that shares it)."""
        return states.slot_idle(self.run_id, slots)

    def _grandparent_states(self, states: Mapping[str, Any]) -> list[list[str | None]] | None:
        """Each parent's own parents' states (in ``parents`` order), or None when the node does not come
        back to wait."""
        if self.grandparents is None:
            return None
        mine = states.get(self.run_id, {})
        return [
            [mine.get(key) for key in self.grandparents.get(f"{task_id}_{index}", [])]
            for task_id, indexes in self.parents.items()
            for index in indexes
        ]

    def _free(self) -> bool:
        """Whether the node's deferral is free here: only on a triggerer (see ``free_deferral``)."""
        return self.free_deferral and self.task_instance is not None

    async def _saved_before_next_read(self, states: Mapping[str, Any]) -> bool:
        """Wait until the next read: looking, while the policy watches (every unfinished parent runs),
        for the unfinished parents' checkpoints every ``checkpoint_poll`` seconds. True once every one
        of them saved its result in this run."""
        mine = states.get(self.run_id, {})
        instances = [f"{task_id}_{index}" for task_id, indexes in self.parents.items() for index in indexes]
        unfinished = [key for key in instances if mine.get(key) not in FINISHED]
        until = time.monotonic() + self.poll_interval
        watch = all(key in self.checkpoints for key in unfinished) and POLICY.trigger_watches(
            mine.get(key) for key in instances
        )
        while watch:
            looks = [
                shared_checkpoint(self.checkpoints[key], self.run_id, self.artifact_store)
                for key in unfinished
            ]
            if all(await asyncio.gather(*looks)):
                return True
            left = until - time.monotonic()
            if left <= 0:
                return False
            await asyncio.sleep(min(POLICY.checkpoint_poll, left))
        await asyncio.sleep(max(0.0, until - time.monotonic()))
        return False


def trigger_of_brief(
    brief: NodeBrief,
    *,
    dag_id: str,
    run_id: str,
    prefix: str,
    poll_interval: float,
    checkpoint_keys: Mapping[str, str],
    artifact_store: str | None,
    free_deferral: bool,
    came_back: bool,
    seen_far: bool = False,
) -> ParentsFinishedTrigger:
    """The trigger node ``brief`` waits on for its parents, from its brief alone: their instances (task
    ids with the group's ``prefix``), their checkpoints' keys (``checkpoint_keys``: parent → key), and
    unless the node ``came_back`` in this try, their own parents' instances and, in a run without slots
    to spare, its slots and node tasks (see :class:`ParentsFinishedTrigger` for the rest)."""
    parent_ids = [parent.id for parent in brief.parents]
    slots = brief.run.near_while_idle
    run_slots = None
    if slots is not None and not came_back:
        run_slots = {"slots": slots.slots, "tasks": [prefix + task for task in slots.tasks]}
    return ParentsFinishedTrigger(
        dag_id=dag_id,
        run_id=run_id,
        parents=brief.instances(parent_ids, prefix),
        poll_interval=poll_interval,
        checkpoints={
            brief.instance_key(p, prefix): checkpoint_keys[p] for p in parent_ids if p in checkpoint_keys
        },
        artifact_store=artifact_store,
        free_deferral=free_deferral,
        grandparents=None if came_back else brief.grandparent_keys(prefix),
        run_slots=run_slots,
        seen_far=seen_far,
    )


#: (event loop, dag id, run id, task ids) → (when it was asked for, the read): the parents triggers of
#: one triggerer that wait in the same run share one read of their tasks' states per poll interval
_READS: dict[tuple[object, str, str, tuple[str, ...]], tuple[float, asyncio.Future[Any]]] = {}


#: (event loop, store, checkpoint key, run id) → (when it was asked for, the look): the triggers of one
#: triggerer looking for the same parent's checkpoint share one look per ``checkpoint_poll``
_LOOKS: dict[tuple[object, str | None, str, str], tuple[float, asyncio.Future[bool]]] = {}


async def shared_checkpoint(key: str, run_id: str, artifact_store: str | None) -> bool:
    """Whether the checkpoint ``key`` in ``artifact_store`` was saved in run ``run_id``, looked at once
    for every trigger of this triggerer that asks within ``checkpoint_poll`` seconds of the first (the
    children of one parent wait on the same checkpoint). A store that cannot be read just now tells
    nothing (False): the states still do (:func:`~airflow_plan_provider.artifacts.checkpoint_of_run`)."""
    from airflow_plan_provider import artifacts

    def look() -> bool:
        return artifacts.checkpoint_of_run(key, run_id, artifact_store) is not None

    started = partial(asyncio.to_thread, look)
    found = await shared_work(
        _LOOKS, (asyncio.get_running_loop(), artifact_store, key, run_id), POLICY.checkpoint_poll, started
    )
    return bool(found)


async def shared_work(
    cache: dict[Any, tuple[float, Any]], key: Any, max_age: float, start: Callable[[], Any]
) -> Any:
    """The result of the work ``start()`` begins, done once for every caller that asks under ``key``
    within ``max_age`` seconds of the first (``cache`` holds when each was asked for, and the work)."""
    now = time.monotonic()
    for cached, (asked_at, _) in list(cache.items()):
        if now - asked_at >= max_age:
            del cache[cached]
    if key not in cache:
        cache[key] = (now, asyncio.ensure_future(start()))
    return await asyncio.shield(cache[key][1])


class RunStates(dict[str, dict[str, Any]]):
    """One read of task states (run id → ``<task id>_<map index>`` → state), shared by the triggers of
    the run that asked for it within a poll interval; whether it leaves one of the run's slots idle is
    counted once, for all of them, not once per held node over every instance of the run."""

    __slots__ = ("_idle",)

    def __init__(self, states: Mapping[str, dict[str, Any]]) -> None:
        super().__init__(states)
        self._idle: dict[tuple[str, int, tuple[str, ...]], bool] = {}

    def slot_idle(self, run_id: str, slots: RunSlots) -> bool:
        """:func:`~airflow_plan_provider.plan.waiting.leaves_a_slot_idle` over run ``run_id``'s instances
        of the ``slots``' node tasks in this read."""
        key = (run_id, slots.slots, tuple(slots.tasks))
        if key not in self._idle:
            tasks = set(slots.tasks)
            mine = self.get(run_id, {})
            in_run = (state for k, state in mine.items() if k.rpartition("_")[0] in tasks)
            self._idle[key] = leaves_a_slot_idle(in_run, slots.slots)
        return self._idle[key]


async def shared_task_states(
    dag_id: str, run_id: str, task_ids: Sequence[str], *, max_age: float
) -> RunStates:
    """The task states of ``task_ids`` in run ``run_id``
    (:func:`~airflow_plan_provider.compat.task_states_reader`), read once for every trigger of this
    triggerer that asks within ``max_age`` seconds of the first: the deferred
    nodes of a run wait on the same node task, and a read returns every instance of it, so a hundred
    of them cost the API server one read a poll interval, not a hundred. A failed read fails every
    trigger that shared it, as its own read would have."""
    from asgiref.sync import sync_to_async

    reader = compat.task_states_reader()
    if reader is None:
        raise compat.AirflowCompatError("this Airflow has no task states read for triggers")
    read_states = sync_to_async(reader)

    async def read() -> RunStates:
        return RunStates(await read_states(dag_id=dag_id, task_ids=list(task_ids), run_ids=[run_id]))

    states: RunStates = await shared_work(
        _READS, (asyncio.get_running_loop(), dag_id, run_id, tuple(task_ids)), max_age, read
    )
    return states
