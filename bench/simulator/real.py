"""The provider's waiting policy behind the simulator's :class:`~bench.simulator.policy.Policy`."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from airflow_plan_provider.triggers import parents as rules

from bench.simulator.policy import Kind, Move, View

# the operator's numbers (operators/node.py), until they join the policy object
MAKE_WAY_FIRST, MAKE_WAY_MAX, READ_ALL_STATES_UP_TO, SLOT_WAIT, TRIGGER_POLL = 5.0, 20.0, 100, 30.0, 0.5


class RealPolicy:
    """``parents_wait``, ``steps_aside``, ``poll_pause`` and ``generations`` of
    ``airflow_plan_provider.triggers.parents``, applied as the node operator's waiting loop applies
    them."""

    name = "provider"

    def __init__(self, **overrides: float) -> None:
        self.overrides = overrides
        self.slot_wait = overrides.get("slot_wait", SLOT_WAIT)
        self._trigger_poll = overrides.get("trigger_poll", TRIGGER_POLL)
        self.make_way_first = overrides.get("make_way_first", MAKE_WAY_FIRST)
        self.make_way_max = overrides.get("make_way_max", MAKE_WAY_MAX)

    @property
    def trigger_poll(self) -> float:
        return self._trigger_poll

    @property
    def reads_all_states(self) -> Callable[[int], bool]:
        return lambda size: size <= READ_ALL_STATES_UP_TO

    def next_move(self, view: View) -> Move:
        parents = view.parents[view.node]
        decision = rules.parents_wait([view.state_of(p) for p in parents], view.waited, self.slot_wait)
        if decision is rules.ParentsWait.READY:
            return Move(Kind.READY)
        if decision is rules.ParentsWait.MAKE_WAY:
            made_way = min(view.reschedules, 8)
            return Move(Kind.MAKE_WAY, min(self.make_way_first * 2**made_way, self.make_way_max))
        if decision is rules.ParentsWait.DEFER:
            return Move(Kind.DEFER)
        large = not self.reads_all_states(view.plan_size)
        room = view.task_cap is None or view.task_active < view.task_cap
        if not large and room and rules.steps_aside(view.node, view.queue, view.parents, view.state_of):
            return Move(Kind.STEP_ASIDE)
        grandparents = sorted({g for p in parents for g in view.parents[p]})
        grandparent_states = [None if large else view.state_of(g) for g in grandparents]
        near = all(state in rules.FINISHED for state in grandparent_states)
        pause = rules.poll_pause(
            grandparent_states,
            rows=view.rows,
            pollers=view.pollers,
            checkpoints=view.checkpoints,
            waiting_generations=2 if large else rules.generations(view.node, view.parents, view.state_of),
        )
        return Move(Kind.WAIT, pause, rules.POLL_NEAR if near and view.checkpoints else None)

    def trigger_move(self, parent_states: Sequence[str | None]) -> Kind | None:
        decision = rules.parents_wait(parent_states, 0.0, float("inf"))
        if decision is rules.ParentsWait.READY:
            return Kind.READY
        if decision is rules.ParentsWait.MAKE_WAY:
            return Kind.MAKE_WAY
        return None
