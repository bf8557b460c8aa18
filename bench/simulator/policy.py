"""The waiting policy as the simulator drives it.

The simulator never decides for a node itself: it hands what a node read to
:meth:`~airflow_plan_provider.plan.waiting.WaitingPolicy.next_move` (a node in its slot) or
:meth:`~airflow_plan_provider.plan.waiting.WaitingPolicy.trigger_move` (a deferred node's trigger) and
applies the answer. Any object with those methods and the policy's pacing numbers will do:
:class:`NeverLetGo` breaks one rule on purpose, so that the tests can show the simulator finds the
deadlock that rule prevents.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from airflow_plan_provider.plan.waiting import Move, Wait, WaitingPolicy, WaitView


class Policy(Protocol):
    """What the simulator asks of a waiting policy (:class:`WaitingPolicy` is one)."""

    @property
    def trigger_poll(self) -> float: ...

    @property
    def checkpoint_poll(self) -> float: ...

    def next_move(self, view: WaitView) -> Move: ...

    def trigger_move(
        self,
        states: Iterable[str | None],
        free_deferral: bool = False,
        grandparents: Iterable[Iterable[str | None]] | None = None,
    ) -> Wait | None: ...

    def parents_run_tools(
        self, states: Iterable[str | None], grandparents: Iterable[Iterable[str | None]]
    ) -> bool: ...

    def reads_one_by_one(self, plan_size: int) -> bool: ...

    def reads_grandparents(self, states: Iterable[str | None]) -> bool: ...

    def trigger_watches(self, states: Iterable[str | None]) -> bool: ...


@dataclass(frozen=True)
class NeverLetGo:
    """``inner`` with point 3 of the deadlock-freedom argument (``plan/waiting.py``) broken: a node that
    should make way for a parent needing a slot defers instead, and its trigger waits until the parents
    finished, holding its task's cap all the while."""

    inner: WaitingPolicy = WaitingPolicy()  # noqa: RUF009  # frozen

    @property
    def trigger_poll(self) -> float:
        return self.inner.trigger_poll

    @property
    def checkpoint_poll(self) -> float:
        return self.inner.checkpoint_poll

    def next_move(self, view: WaitView) -> Move:
        move = self.inner.next_move(view)
        return Move(Wait.DEFER) if move.kind is Wait.MAKE_WAY else move

    def trigger_move(
        self,
        states: Iterable[str | None],
        free_deferral: bool = False,
        grandparents: Iterable[Iterable[str | None]] | None = None,
    ) -> Wait | None:
        kind = self.inner.trigger_move(states, free_deferral, grandparents)
        return None if kind is Wait.MAKE_WAY else kind

    def parents_run_tools(
        self, states: Iterable[str | None], grandparents: Iterable[Iterable[str | None]]
    ) -> bool:
        return self.inner.parents_run_tools(states, grandparents)

    def reads_one_by_one(self, plan_size: int) -> bool:
        return self.inner.reads_one_by_one(plan_size)

    def reads_grandparents(self, states: Iterable[str | None]) -> bool:
        return self.inner.reads_grandparents(states)

    def trigger_watches(self, states: Iterable[str | None]) -> bool:
        return self.inner.trigger_watches(states)
