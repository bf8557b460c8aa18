"""A node waiting in its slot for its parents: read the run's task instance states, apply the waiting
policy (:mod:`airflow_plan_provider.plan.waiting`), and tell the node what the policy decided.

Nothing here decides: every rule and every number is the policy's. This module reads (the states through
the Task SDK, the parents' checkpoints through the node's own reader), sleeps as told, and logs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_plan_provider.contract import locations, node_tasks
from airflow_plan_provider.operators.layout import group_prefix, task_id_in
from airflow_plan_provider.plan.model import ValidatedPlan
from airflow_plan_provider.plan.result import NodeRecord
from airflow_plan_provider.plan.session import RunContext
from airflow_plan_provider.plan.waiting import FINISHED, Move, Wait, WaitingPolicy, WaitView
from airflow_plan_provider.triggers.parents import ParentsFinishedTrigger


@dataclass
class SlotWait:
    """The wait of node ``node_id`` (task instance ``ti``) for its parents, in its slot.

    :param pick_up: the records of those of the given parents whose checkpoint was saved in this run
        (a parent saves it the moment its tool returns, before its record and its task's end reach the
        metadata database), so the node starts without waiting for those.
    :param made_way: how many times the node made way already (Airflow's reschedule count).
    :param task_cap: the node task's ``max_active_tis_per_dagrun``.
    """

    ti: Any
    plan: ValidatedPlan
    run_context: RunContext
    node_id: str
    policy: WaitingPolicy
    log: Any
    pick_up: Callable[[Iterable[str]], dict[str, NodeRecord]]
    checkpoints: bool = True
    made_way: int = 0
    task_cap: int | None = None
    picked: dict[str, NodeRecord] = field(default_factory=dict)

    def __post_init__(self) -> None:
        plan, prefix = self.plan, group_prefix(getattr(self.ti, "task", None))
        self.parent_ids = list(plan.parents[self.node_id])
        self.tasks = self._where(self.parent_ids)
        self.grandparents = self._where(sorted({g for p in self.parent_ids for g in plan.parents[p]}))
        tasks = node_tasks(plan, self.run_context)
        #: node id -> its task instance's key in a read (Airflow's ``<task id>_<map index>``)
        self.keys = {
            node: f"{prefix}{task}_{index}"
            for task, nodes in tasks.items()
            for index, node in enumerate(nodes)
        }
        self.queue = tasks.get(self.ti.task_id.removeprefix(prefix), [])
        self.one_by_one = self.policy.reads_one_by_one(len(plan.nodes))

    def _where(self, node_ids: Iterable[str]) -> dict[str, list[int]]:
        """Task id (with the group's prefix) -> the map indexes of ``node_ids``' instances."""
        found = locations(self.plan, self.run_context, node_ids)
        return {task_id_in(self.ti, task): indexes for task, indexes in found.items()}

    def trigger(self) -> ParentsFinishedTrigger:
        """The trigger that waits for the parents while the node is deferred."""
        return ParentsFinishedTrigger(
            dag_id=self.ti.dag_id,
            run_id=self.ti.run_id,
            parents=self.tasks,
            poll_interval=self.policy.trigger_poll,
        )

    def wait(self) -> Move:
        """Wait until the policy says READY (the parents finished, or their checkpoints were all picked
        up: :attr:`picked` holds those records), DEFER, STEP_ASIDE or MAKE_WAY, and return that move."""
        if not self.parent_ids:
            return Move(Wait.READY)
        began = time.monotonic()
        failures = 0
        while True:
            waited = time.monotonic() - began
            try:
                states = self._read()
            except Exception as error:  # the API server or its database away: a delay, never a failure
                failures += 1
                move = self.policy.after_failed_read(failures, waited)
                if failures == 1:
                    self.log.warning(
                        "node %s: could not read its parents' states (%s); reading again", self.node_id, error
                    )
                if move.kind is not Wait.WAIT:
                    return move
                time.sleep(move.after)
                continue
            if failures:
                self.log.info(
                    "node %s: read its parents' states again after %d failed read(s)", self.node_id, failures
                )
                failures = 0
            move = self.policy.next_move(self._view(states, waited))
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
            if watch:
                self.picked.update(self.pick_up([p for p in running if p not in self.picked]))
                if all(p in self.picked for p in running):
                    return True
            left = until - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(self.policy.checkpoint_poll, left) if watch else left)

    def _view(self, states: Mapping[str, Any], waited: float) -> WaitView:
        keys = self.keys
        return WaitView(
            node=self.node_id,
            parents=self.plan.parents,
            state_of=lambda node: states.get(keys[node]),
            queue=self.queue,
            waited=waited,
            made_way=self.made_way,
            task_cap=self.task_cap,
            complete=not self.one_by_one,
            rows=len(states),
            pollers=sum(state == "running" for state in states.values()),
            checkpoints=self.checkpoints,
        )

    def _read(self) -> dict[str, Any]:
        """The run's task instance states this node needs (Airflow's ``<task id>_<map index>`` keys):
        its parents', its grandparents' and its own task's, in one request, which returns every
        instance of the tasks asked for; or, in a large plan, only the parents', one instance per
        request (Airflow's API server loads each instance as a full task-instance row, the run's conf
        decoded with each: with a 500-node plan in the conf a read of all took 11 s on PostgreSQL and
        stalled the run, one instance's 30 ms)."""
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

        ti = self.ti
        if not self.one_by_one:
            task_ids = sorted({ti.task_id, *self.tasks, *self.grandparents})
            found = RuntimeTaskInstance.get_task_states(
                dag_id=ti.dag_id, task_ids=task_ids, run_ids=[ti.run_id]
            )
            return dict(found.get(ti.run_id, {}))
        states: dict[str, Any] = {}
        for task, indexes in self.tasks.items():
            for index in indexes:
                found = RuntimeTaskInstance.get_task_states(
                    dag_id=ti.dag_id, task_ids=[task], run_ids=[ti.run_id], map_index=index
                )
                states.update(found.get(ti.run_id, {}))
        return states
