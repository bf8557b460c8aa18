"""A node waiting in its slot for its parents: read the run's task instance states, apply the waiting
policy (:mod:`airflow_plan_provider.plan.waiting`), and tell the node what the policy decided.

Nothing here decides: every rule and every number is the policy's. This module reads (the states through
the Task SDK, the parents' checkpoints through the node's own reader), sleeps as told, and logs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from airflow_plan_provider.contract import NodeBrief, node_tasks
from airflow_plan_provider.operators.layout import group_prefix
from airflow_plan_provider.plan.model import ValidatedPlan
from airflow_plan_provider.plan.result import NodeRecord
from airflow_plan_provider.plan.session import RunContext
from airflow_plan_provider.plan.waiting import FINISHED, Move, Wait, WaitingPolicy, WaitView, deferral_is_free
from airflow_plan_provider.triggers.parents import ParentsFinishedTrigger, trigger_of_brief


@dataclass
class SlotWait:
    """The wait of the node of ``brief`` (task instance ``ti``) for its parents, in its slot.

    The brief names the instances of the node's parents and grandparents: all the reads and the policy
    need in a large plan, whose nodes read their parents' instances one by one. In a plan whose nodes
    read every instance of their task at once (see :meth:`WaitingPolicy.reads_one_by_one`), the policy
    also looks at the rest of the task (which nodes are ready, how many generations wait in between):
    ``whole`` then reads the plan and the run's layout, once, the first time the policy looks beyond
    the brief (never when the parents have finished at the first read).

    :param whole: the whole plan and the run's context, as the planning task published them.
    :param pick_up: the records of those of the given parents whose checkpoint was saved in this run
        (a parent saves it the moment its tool returns, before its record and its task's end reach the
        metadata database), so the node starts without waiting for those.
    :param made_way: how many times the node made way already (Airflow's reschedule count).
    :param trigger_made_way: the node's trigger ended its deferral because a parent needs a slot (run
        inline, or its deferral holds a cap): this try makes way for that parent rather than
        deferring again.
    :param came_back: the node's trigger ended its deferral for it to wait near its parents, which run
        their tools (``wait``, once a try): its next deferral waits to the end, and its grandparents
        had all finished (a node reading one by one, which does not read them, counts them so).
    :param task_cap: the node task's ``max_active_tis_per_dagrun``.
    :param pools_count_deferred: whether the node task's pool counts deferred instances
        (``NodeExecution.pools_count_deferred``); with ``task_cap``, whether the node, deferred, holds
        nothing (:func:`~airflow_plan_provider.plan.waiting.deferral_is_free`; the plan's size bounds
        its task's).
    :param checkpoint_keys: each parent → the key of its checkpoint, for the trigger to look for them
        while the node is deferred (empty when the DAG keeps no checkpoints).
    :param artifact_store: the store the checkpoints are in (None: the default store).
    :param sleep: how the node pauses (``time.sleep``, or the node's own, which sends its label when due).
    """

    ti: Any
    brief: NodeBrief
    whole: Callable[[], tuple[ValidatedPlan | None, RunContext]]
    policy: WaitingPolicy
    log: Any
    pick_up: Callable[[Iterable[str]], dict[str, NodeRecord]]
    checkpoints: bool = True
    made_way: int = 0
    trigger_made_way: bool = False
    came_back: bool = False
    task_cap: int | None = None
    pools_count_deferred: bool = False
    checkpoint_keys: Mapping[str, str] = field(default_factory=dict)
    artifact_store: str | None = None
    sleep: Callable[[float], None] = time.sleep
    picked: dict[str, NodeRecord] = field(default_factory=dict)

    def __post_init__(self) -> None:
        brief = self.brief
        self.node_id = brief.node_id
        self.prefix = group_prefix(getattr(self.ti, "task", None))
        self.parent_ids = [parent.id for parent in brief.parents]
        self.tasks = self._where(self.parent_ids)
        self.grandparents = self._where(sorted({g for gs in brief.grandparents.values() for g in gs}))
        self.one_by_one = self.policy.reads_one_by_one(brief.plan_size)
        self.free_deferral = not self.trigger_made_way and deferral_is_free(
            self.task_cap, brief.plan_size, self.pools_count_deferred
        )
        near = {self.node_id: self.parent_ids, **{p: brief.grandparents.get(p, []) for p in self.parent_ids}}
        #: node id -> its task instance's key in a read (Airflow's ``<task id>_<map index>``)
        keys = {
            node: f"{self.prefix}{task}_{index}"
            for task, indexes in brief.at.items()
            for node, index in indexes.items()
        }
        self.parents: Mapping[str, list[str]] = _BriefFirst(near, self._whole_parents)
        self.keys: Mapping[str, str] = _BriefFirst(keys, self._whole_keys)
        self.queue: Sequence[str] = _WholeQueue(self._whole_queue)

    @cached_property
    def finished_grandparents(self) -> dict[str, str]:
        """The grandparents' instance keys this node saw finished (→ the state), which a node reading
        one by one does not read again: at first those its trigger saw finished when it came back."""
        if not self.came_back:
            return {}
        return {key: "success" for keys in self.brief.grandparent_keys(self.prefix).values() for key in keys}

    def _where(self, node_ids: Iterable[str]) -> dict[str, list[int]]:
        """Task id (with the group's prefix) -> the map indexes of ``node_ids``' instances."""
        return self.brief.instances(node_ids, self.prefix)

    @cached_property
    def _layout(self) -> tuple[ValidatedPlan, dict[str, list[str]]]:
        """The whole plan, and node task id (without prefix) -> its nodes in map-index order."""
        try:
            plan, run = self.whole()
        except Exception as error:
            raise _ReadFailed from error
        if plan is None:
            raise RuntimeError("the planning task's plan is missing from XCom")
        return plan, node_tasks(plan, run)

    def _whole_parents(self) -> Mapping[str, list[str]]:
        return self._layout[0].parents

    def _whole_keys(self) -> Mapping[str, str]:
        return {
            node: f"{self.prefix}{task}_{index}"
            for task, nodes in self._layout[1].items()
            for index, node in enumerate(nodes)
        }

    def _whole_queue(self) -> Sequence[str]:
        return self._layout[1].get(self.ti.task_id.removeprefix(self.prefix), [])

    def trigger(self) -> ParentsFinishedTrigger:
        """The trigger that waits for the parents while the node is deferred."""
        return trigger_of_brief(
            self.brief,
            dag_id=self.ti.dag_id,
            run_id=self.ti.run_id,
            prefix=self.prefix,
            poll_interval=self.policy.trigger_poll,
            checkpoint_keys=self.checkpoint_keys,
            artifact_store=self.artifact_store,
            free_deferral=self.free_deferral,
            came_back=self.came_back,
        )

    def wait(self) -> Move:
        """Wait until the policy says READY (the parents finished, or their checkpoints were all picked
        up: :attr:`picked` holds those records), DEFER, STEP_ASIDE or MAKE_WAY, and return that move.

        The parents' checkpoints are looked at first: a node whose parents all saved their results in
        this run (the usual case once they have finished) starts on those, with no read of the run's
        states and none of its parents' records from XCom (``docs/performance.md``)."""
        if not self.parent_ids:
            return Move(Wait.READY)
        if self.checkpoints and self._picked_up(self.parent_ids):
            return Move(Wait.READY)  # every parent saved its result in this run: no state to read
        began = time.monotonic()
        failures = 0
        while True:
            waited = time.monotonic() - began
            try:
                states = self._read()
                move = self.policy.next_move(self._view(states, waited))
            except _ReadFailed as failed:  # the API server or its database away: a delay, never a failure
                error = failed.__cause__
                failures += 1
                move = self.policy.after_failed_read(failures, waited)
                if failures == 1:
                    self.log.warning(
                        "node %s: could not read its parents' states (%s); reading again", self.node_id, error
                    )
                if move.kind is not Wait.WAIT:
                    return move
                self.sleep(move.after)
                continue
            if failures:
                self.log.info(
                    "node %s: read its parents' states again after %d failed read(s)", self.node_id, failures
                )
                failures = 0
            if move.kind is Wait.READY and waited >= self.policy.poll_near:
                self.log.info("node %s: parents finished after %.1f s in its slot", self.node_id, waited)
            if move.kind is not Wait.WAIT:
                return move
            running = [p for p in self.parent_ids if states.get(self.keys[p]) not in FINISHED]
            if self._pause(move, running):
                self.log.info(
                    "node %s: parents' results picked up from their checkpoints after %.1f s in its slot",
                    self.node_id,
                    time.monotonic() - began,
                )
                return Move(Wait.READY)

    def _pause(self, move: Move, running: list[str]) -> bool:
        """Pause ``move.after`` seconds; while the parents run their tools (``move.near``), look for
        their checkpoints every ``checkpoint_poll`` seconds meanwhile. True once every running parent's
        result was picked up."""
        until = time.monotonic() + move.after
        watch = move.near and self.checkpoints
        while True:
            if watch and self._picked_up(running):
                return True
            left = until - time.monotonic()
            if left <= 0:
                return False
            self.sleep(min(self.policy.checkpoint_poll, left) if watch else left)

    def _picked_up(self, parents: Iterable[str]) -> bool:
        """Pick up the checkpoints of those of ``parents`` not picked up yet (:attr:`picked`); True once
        every one of them was."""
        parents = list(parents)
        self.picked.update(self.pick_up([p for p in parents if p not in self.picked]))
        return all(p in self.picked for p in parents)

    def _view(self, states: Mapping[str, Any], waited: float) -> WaitView:
        keys = self.keys
        return WaitView(
            node=self.node_id,
            parents=self.parents,
            state_of=lambda node: states.get(keys[node]),
            queue=self.queue,
            waited=waited,
            made_way=self.made_way,
            task_cap=self.task_cap,
            complete=not self.one_by_one,
            rows=len(states),
            pollers=sum(state == "running" for state in states.values()),
            checkpoints=self.checkpoints,
            free_deferral=self.free_deferral,
        )

    def _read(self) -> dict[str, Any]:
        """:meth:`_read_states`; any failure of the read raised as :class:`_ReadFailed`."""
        try:
            return self._read_states()
        except Exception as error:
            raise _ReadFailed from error

    def _read_states(self) -> dict[str, Any]:
        """The run's task instance states this node needs (Airflow's ``<task id>_<map index>`` keys):
        its parents', its grandparents' and its own task's, in one request, which returns every
        instance of the tasks asked for; or, in a large plan, one instance per request: the parents',
        and while they all run (:meth:`~.WaitingPolicy.reads_grandparents`) the grandparents' not yet
        seen finished (Airflow's API server loads each instance as a full task-instance row, the run's
        conf decoded with each, so a read of every instance grows with the plan twice over)."""
        ti = self.ti  # the Task SDK's RuntimeTaskInstanceProtocol: get_task_states is public
        if not self.one_by_one:
            task_ids = sorted({ti.task_id, *self.tasks, *self.grandparents})
            found = ti.get_task_states(dag_id=ti.dag_id, task_ids=task_ids, run_ids=[ti.run_id])
            return dict(found.get(ti.run_id, {}))
        states = self._read_each(self.tasks)
        unfinished = [p for p in self.parent_ids if states.get(self.keys[p]) not in FINISHED]
        if not self.policy.reads_grandparents(states.get(self.keys[p]) for p in unfinished):
            return states
        seen = self.finished_grandparents
        unseen = sorted({g for p in unfinished for g in self.parents[p] if self.keys[g] not in seen})
        read = self._read_each(self._where(unseen))
        seen.update({key: state for key, state in read.items() if state in FINISHED})
        return {**states, **seen, **read}

    def _read_each(self, tasks: Mapping[str, list[int]]) -> dict[str, Any]:
        """The states of the instances ``tasks`` (task id → map indexes), one request each."""
        ti, states = self.ti, {}
        for task, indexes in tasks.items():
            for index in indexes:
                found = ti.get_task_states(
                    dag_id=ti.dag_id, task_ids=[task], run_ids=[ti.run_id], map_index=index
                )
                states.update(found.get(ti.run_id, {}))
        return states


class _BriefFirst(Mapping[str, Any]):
    """A mapping answered from the brief's entries, and from the whole run's (read once, when first
    needed) for any other key."""

    def __init__(self, near: Mapping[str, Any], read: Callable[[], Mapping[str, Any]]) -> None:
        self.near, self.read = near, read

    @cached_property
    def whole(self) -> Mapping[str, Any]:
        return self.read()

    def __getitem__(self, key: str) -> Any:
        if key in self.near:
            return self.near[key]
        return self.whole[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.whole)

    def __len__(self) -> int:
        return len(self.whole)


class _WholeQueue(Sequence[str]):
    """The nodes of the waiting node's task in map-index order, read when first needed."""

    def __init__(self, read: Callable[[], Sequence[str]]) -> None:
        self.read = read

    @cached_property
    def whole(self) -> Sequence[str]:
        return self.read()

    def __getitem__(self, index: Any) -> Any:
        return self.whole[index]

    def __len__(self) -> int:
        return len(self.whole)

    def __iter__(self) -> Iterator[str]:
        return iter(self.whole)


class _ReadFailed(Exception):
    """A read of the run's states or layout failed (its cause says why): the node reads again."""
