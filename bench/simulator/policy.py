"""The waiting policy as the simulator asks it: what a node that holds a slot does after a state read,
and what a deferred node's trigger does after its poll.

The simulator never decides for a node itself: :class:`RealPolicy` hands what the node read to the
provider's own policy functions and returns their answer. :class:`NeverLetGo` breaks one rule on
purpose (a deferred node never lets go of its task's cap) so that the tests can show the simulator
finds the deadlock that rule prevents.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol


class Kind(StrEnum):
    READY = "ready"
    WAIT = "wait"
    DEFER = "defer"
    STEP_ASIDE = "step_aside"
    MAKE_WAY = "make_way"


@dataclass(frozen=True, slots=True)
class Move:
    """What a node does next: ``kind``; ``after`` seconds (WAIT: until the next state read; MAKE_WAY:
    the reschedule delay); ``checkpoint_pace``: while it waits, it looks for its running parents'
    checkpoints every that many seconds (None: it does not)."""

    kind: Kind
    after: float = 0.0
    checkpoint_pace: float | None = None


@dataclass(frozen=True, slots=True)
class View:
    """What a node holding a slot knows after one state read.

    ``state_of`` gives a node's task instance state as read (None: no instance state, or not read);
    ``queue`` is the node's task's nodes in map-index order; ``task_active`` counts its task's instances
    Airflow counts under ``max_active_tis_per_dagrun`` (queued, running, deferred); ``rows`` is the
    number of task states the read returned and ``pollers`` how many of them are running.
    """

    node: str
    parents: Mapping[str, Sequence[str]]
    state_of: Callable[[str], str | None]
    queue: Sequence[str]
    plan_size: int
    task_cap: int | None
    task_active: int
    waited: float
    reschedules: int
    rows: int
    pollers: int
    checkpoints: bool


class Policy(Protocol):
    name: str

    def next_move(self, view: View) -> Move: ...

    def trigger_move(self, parent_states: Sequence[str | None]) -> Kind | None:
        """READY or MAKE_WAY ends the deferral; None keeps waiting."""
        ...

    @property
    def trigger_poll(self) -> float: ...

    @property
    def reads_all_states(self) -> Callable[[int], bool]:
        """Whether a node of a plan of that many nodes reads every instance's state (else only its
        parents', one by one)."""
        ...


def real_policy(**overrides: float) -> Policy:
    """The provider's waiting policy, with some of its numbers overridden (for the sweeps)."""
    from bench.simulator.real import RealPolicy

    return RealPolicy(**overrides)


class NeverLetGo:
    """``inner`` with one rule broken: a node that should make way for a parent that needs a slot
    defers instead, and its trigger waits until the parents finished, holding its task's cap all the
    while (the module docstring's "without point 3" case of ``triggers/parents.py``)."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = f"{inner.name}, never letting go"

    def next_move(self, view: View) -> Move:
        move = self.inner.next_move(view)
        return Move(Kind.DEFER) if move.kind is Kind.MAKE_WAY else move

    def trigger_move(self, parent_states: Sequence[str | None]) -> Kind | None:
        kind = self.inner.trigger_move(parent_states)
        return None if kind is Kind.MAKE_WAY else kind

    @property
    def trigger_poll(self) -> float:
        return self.inner.trigger_poll

    @property
    def reads_all_states(self) -> Callable[[int], bool]:
        return self.inner.reads_all_states
