"""Waiting for a node's parents: what to do given their task instances' states, and the trigger that
waits for them on the triggerer.

A node instance whose parents have not all finished decides with :func:`parents_wait` (a pure function
of the parents' states and how long it has waited in its slot):

- ``READY``: every parent finished; read their records and run.
- ``WAIT``: every unfinished parent is running (or was queued a moment ago): keep the slot and poll
  again shortly. The parent's result is picked up without a scheduler hop or a second task start (from
  the checkpoint it saves when its tool returns, see ``operators/node.py``).
- ``DEFER``: the parents have their slots but are slow (the in-slot bound passed, a parent stays
  queued, or a parent waits on the triggerer for a job): wait on the triggerer, holding no worker slot.
- Stepping aside (:func:`steps_aside`): the parents run, but a node of the same task is ready to run
  and has no slot while nodes that cannot run yet hold them: the waiting nodes last in the run order
  defer (as ``DEFER``) and the ready node gets the slot, as in a static DAG, where only ready tasks
  hold slots. Only while the task's own cap has room: Airflow counts a deferred instance under
  ``max_active_tis_per_dagrun``, so it is the DAG's ``max_active_tasks``, a pool or the executor's
  parallelism that stepping aside frees.
- ``MAKE_WAY``: a parent has not started (no state yet, scheduled, up for retry or reschedule): it
  needs a slot, so give this one back (the node reschedules itself) and look again after a delay (5 s
  at first: a shorter one races Airflow's report of the rescheduled try, see
  ``operators/node.py``).

Why this cannot deadlock, whatever the caps (``max_active_tis_per_dagrun``, pools, the DAG's
``max_active_tasks``, the executor's parallelism) and however parents retry:

1. What a node instance holds. Running, it holds a slot under every cap. Deferred, it holds no worker,
   pool or DAG slot, but Airflow counts it toward its task's ``max_active_tis_per_dagrun``
   (``airflow.ti_deps.dependencies_states.ACTIVE_STATES``). Up for reschedule, it holds nothing.
2. A waiting node holds a slot only while every parent it waits for is running, and for a bounded
   time (the in-slot bound; a queued parent for :data:`QUEUED_GRACE` seconds only); a running parent
   makes progress (its tool, or its own bounded wait) and so does not depend on the waiter's slot.
3. A deferred node holds its task's cap only while its parents have started: the trigger releases it
   (``make_way``) as soon as one goes back to waiting for a slot (a retry), and the node then makes way.
4. Map indexes follow the plan's topological order, and the scheduler hands out a task's free slots in
   map-index order (same priority weight). Take the unfinished node ``u`` earliest in that order: its
   parents all finished, and every other unfinished instance of its task comes after it. Every
   instance holding a slot or cap of ``u``'s task lets go within a bounded time or when a running
   instance finishes (1 to 3), so a slot frees, and ``u`` gets it before any later instance. ``u`` runs;
   by induction every node runs. Caps shared by several tasks (pools, the DAG's
   ``max_active_tasks``, parallelism) count no deferred or rescheduled instance, and a running waiter
   lets go within its bound, so they free too.

Without point 3 a cap of 2 deadlocks: a root retries while two of its children wait deferred; the
deferred children fill the task's cap and the root's retry never gets a slot.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_plan_provider.triggers.payloads import PARENTS_MAKE_WAY, PARENTS_READY

FINISHED = frozenset({"success", "failed", "skipped", "upstream_failed", "removed"})
#: states of a parent that has its slot (or is about to run): waiting on it needs no slot of its own
STARTED = frozenset({"running", "queued", "deferred"})
#: how long a node waits in its slot for a parent that is queued but not yet running (seconds): longer
#: means the executor has no room for it (say, every worker slot is held), so the node defers
QUEUED_GRACE = 10.0


#: seconds between two polls by a waiting node whose parents are all running their tools (every
#: grandparent finished): any of them may finish at any moment
POLL_NEAR = 0.2
#: ... and by one whose parents still wait on their own parents: they cannot finish before those do
POLL_FAR = 1.0
#: task states per second that the waiting nodes of one run read together, at most (each poll returns
#: the state of every instance of the parents' tasks, so a plan of 100 nodes costs 100 rows a poll)
STATE_ROWS_PER_SECOND = 5000.0


#: the longest pause of a waiting node many generations away from running
POLL_FARTHEST = 4.0


def generations(
    node: str, parents: Mapping[str, Iterable[str]], state_of: Callable[[str], str | None]
) -> int:
    """How many generations of unfinished nodes lie between ``node`` and the nodes that can run now
    (every parent finished): 0 for such a node, 1 for a node whose unfinished parents can all run, 2
    when one of those waits on its own parents, and so on.

    >>> parents = {"a": [], "b": ["a"], "c": ["b"], "d": ["c", "a"]}
    >>> states = {"a": "running", "b": "running", "c": "running", "d": "running"}
    >>> [generations(n, parents, states.get) for n in "abcd"]
    [0, 1, 2, 3]
    >>> generations("d", parents, {"a": "success", "b": "success"}.get)
    1
    """
    seen: dict[str, int] = {}

    def depth(n: str) -> int:
        if n not in seen:
            unfinished = [p for p in parents[n] if state_of(p) not in FINISHED]
            seen[n] = 1 + max(map(depth, unfinished)) if unfinished else 0
        return seen[n]

    return depth(node)


def poll_pause(
    grandparent_states: Iterable[str | None],
    *,
    rows: int = 0,
    pollers: int = 0,
    checkpoints: bool = False,
    waiting_generations: int = 2,
) -> float:
    """Seconds a node waiting in its slot pauses before it reads its parents' states again, given the
    states of its parents' parents, the number of task states one read returned (``rows``), how many
    instances of the run are running (``pollers``, at most that many poll) and whether the node looks
    for its parents' checkpoints in between.

    The pickup latency, about half a pause, is paid on every edge, so the node that will run next
    polls often: its parents' states when the DAG keeps no checkpoints, else their checkpoints (every
    ``POLL_NEAR`` seconds, which cost the metadata database nothing), the states then only telling a
    parent that failed, was skipped or needs a slot again. The nodes further down poll seldom: a node
    ``waiting_generations`` (:func:`generations`) away from running cannot run before a tool of every
    generation in between has, so it pauses ``POLL_FAR`` seconds per generation beyond the first, up
    to ``POLL_FARTHEST`` (a chain of 30 with 15 nodes waiting in their slots read the states 15 times a
    second at one ``POLL_FAR`` each, which kept the API server busy that the running nodes need).
    Together the run's pollers read at most :data:`STATE_ROWS_PER_SECOND` task states a second,
    whatever the plan's size, so a large plan cannot swamp the API server that also serves its tasks'
    starts and results.

    >>> poll_pause(["success", "skipped"])
    0.2
    >>> poll_pause(["success", "skipped"], checkpoints=True)
    1.0
    >>> poll_pause(["success", "running"])
    1.0
    >>> poll_pause(["success"], rows=100, pollers=100)
    2.0
    """
    near = all(state in FINISHED for state in grandparent_states)
    pause = POLL_NEAR if near and not checkpoints else POLL_FAR
    if not near:
        pause = min(POLL_FAR * max(1, waiting_generations - 1), POLL_FARTHEST)
    return max(pause, rows * pollers / STATE_ROWS_PER_SECOND)


class ParentsWait(StrEnum):
    READY = PARENTS_READY
    WAIT = "wait"
    DEFER = "defer"
    MAKE_WAY = PARENTS_MAKE_WAY


def parents_wait(states: Iterable[str | None], waited: float, slot_wait: float) -> ParentsWait:
    """What a node does given its parents' task instance states, having waited ``waited`` seconds in
    its slot out of at most ``slot_wait`` (see the module docstring).

    >>> parents_wait(["success", "running"], waited=1.0, slot_wait=30.0)
    <ParentsWait.WAIT: 'wait'>
    >>> parents_wait(["up_for_retry", "running"], waited=0.0, slot_wait=30.0)
    <ParentsWait.MAKE_WAY: 'make_way'>
    """
    unfinished = [state for state in states if state not in FINISHED]
    if not unfinished:
        return ParentsWait.READY
    if any(state not in STARTED for state in unfinished):
        return ParentsWait.MAKE_WAY
    if waited >= slot_wait or "deferred" in unfinished:
        return ParentsWait.DEFER
    if "queued" in unfinished and waited >= QUEUED_GRACE:
        return ParentsWait.DEFER
    return ParentsWait.WAIT


#: states of an instance that waits for a slot
SLOTLESS = frozenset({None, "scheduled"})
#: states Airflow counts under a task's ``max_active_tis_per_dagrun`` (deferred ones too)
ACTIVE = frozenset({"queued", "running", "deferred"})


def steps_aside(
    node: str,
    queue: Iterable[str],
    parents: Mapping[str, Iterable[str]],
    state_of: Callable[[str], str | None],
) -> bool:
    """Whether waiting node ``node`` gives its slot to a node that is ready to run and has none.

    ``queue`` is the nodes of ``node``'s task in map-index order, the order in which Airflow hands out
    the task's free slots; ``state_of`` tells a node's task instance state (None: none yet). The ready
    nodes without a slot at the head of the queue (before any node that waits for a slot but still
    waits for its parents too) get the next free slots: for each of them one waiting node steps aside,
    first the *far* waiters (whose parents wait on their own parents) last in the queue, then the
    *near* ones (whose parents run their tools) last in the queue. A node that steps aside waits on the
    triggerer for its parents, holding no worker slot, and is picked up as a static DAG's task is;
    the ready node no longer waits for a slot held by a node that cannot run yet.

    >>> parents = {"a": [], "b": ["a"], "c": ["b"], "d": []}
    >>> states = {"a": "running", "b": "running", "c": "running", "d": "scheduled"}
    >>> [n for n in "abcd" if steps_aside(n, "abcd", parents, states.get)]
    ['c']
    """
    queue = list(queue)

    def finished(n: str) -> bool:
        return state_of(n) in FINISHED

    ready = 0
    for n in queue:
        if state_of(n) in SLOTLESS:
            if not all(map(finished, parents[n])):
                break
            ready += 1
    if not ready:
        return False
    waiting = [n for n in reversed(queue) if state_of(n) == "running" and not all(map(finished, parents[n]))]
    far = [n for n in waiting if not all(finished(g) for p in parents[n] for g in parents[p])]
    near = [n for n in waiting if n not in far]
    return node in (far + near)[:ready]


def parent_states(
    task_states: Mapping[str, Any], run_id: str, parents: Mapping[str, list[int]]
) -> list[str | None]:
    """The states of the task instances ``parents`` (task id → map indexes), from what
    ``RuntimeTaskInstance.get_task_states`` returned; None for an instance without a state."""
    states = task_states.get(run_id, {})
    return [states.get(f"{task_id}_{index}") for task_id, indexes in parents.items() for index in indexes]


class ParentsFinishedTrigger(BaseTrigger):
    """Poll the states of the mapped task instances ``parents`` (task id → map indexes) of one run until
    all have finished (``{"status": "ready"}``), or until one of them waits for a slot again
    (``{"status": "make_way"}``: the deferred node lets go of its task's cap, see the module docstring).

    The triggers of one triggerer waiting in the same run share their reads
    (:func:`shared_task_states`): one request per poll interval, however many nodes of the run wait.

    :param dag_id: the plan DAG's id.
    :param run_id: the run whose task instances are waited for.
    :param parents: task id → the map indexes of that task to wait for.
    :param poll_interval: seconds between two reads of the task states.
    """

    def __init__(
        self,
        *,
        dag_id: str,
        run_id: str,
        parents: Mapping[str, list[int]],
        poll_interval: float = 0.5,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # BaseTrigger.__init__ is not annotated
        self.dag_id = dag_id
        self.run_id = run_id
        self.parents = {task_id: list(indexes) for task_id, indexes in parents.items()}
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
        while True:
            states = await shared_task_states(
                self.dag_id, self.run_id, sorted(self.parents), max_age=self.poll_interval
            )
            decision = parents_wait(parent_states(states, self.run_id, self.parents), 0.0, float("inf"))
            if decision in (ParentsWait.READY, ParentsWait.MAKE_WAY):
                yield TriggerEvent({"status": decision.value})
                return
            await asyncio.sleep(self.poll_interval)


#: (event loop, dag id, run id, task ids) → (when it was asked for, the read): the parents triggers of
#: one triggerer that wait in the same run share one read of their tasks' states per poll interval
_READS: dict[tuple[object, str, str, tuple[str, ...]], tuple[float, asyncio.Future[Any]]] = {}


async def shared_task_states(dag_id: str, run_id: str, task_ids: Sequence[str], *, max_age: float) -> Any:
    """What ``RuntimeTaskInstance.get_task_states`` returns for ``task_ids`` in run ``run_id``, read once
    for every trigger of this triggerer that asks within ``max_age`` seconds of the first: the deferred
    nodes of a run wait on the same node task, and a read returns every instance of it, so a hundred
    of them cost the API server one read a poll interval, not a hundred. A failed read fails every
    trigger that shared it, as its own read would have."""
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance
    from asgiref.sync import sync_to_async

    now = time.monotonic()
    for key, (asked_at, _) in list(_READS.items()):
        if now - asked_at >= max_age:
            del _READS[key]
    key = (asyncio.get_running_loop(), dag_id, run_id, tuple(task_ids))
    if key not in _READS:
        read = sync_to_async(RuntimeTaskInstance.get_task_states)(
            dag_id=dag_id, task_ids=list(task_ids), run_ids=[run_id]
        )
        _READS[key] = (now, asyncio.ensure_future(read))
    return await asyncio.shield(_READS[key][1])
