"""What a node does while its parents have not finished: the pure decision behind barrier-free nodes."""

from __future__ import annotations

import pytest

from airflow_plan_provider.triggers.parents import (
    POLL_FAR,
    POLL_FARTHEST,
    POLL_NEAR,
    QUEUED_GRACE,
    STATE_ROWS_PER_SECOND,
    ParentsWait,
    generations,
    parent_states,
    parents_wait,
    poll_pause,
    steps_aside,
)

SLOT_WAIT = 30.0


def decide(*states: str | None, waited: float = 0.0) -> ParentsWait:
    return parents_wait(list(states), waited, SLOT_WAIT)


@pytest.mark.parametrize("finished", ["success", "failed", "skipped", "upstream_failed", "removed"])
def test_every_finished_state_counts_as_finished(finished: str) -> None:
    assert decide("success", finished) is ParentsWait.READY
    assert decide() is ParentsWait.READY  # no parents at all


def test_running_parents_are_waited_for_in_the_slot_until_the_bound() -> None:
    assert decide("running", "success", waited=0.0) is ParentsWait.WAIT
    assert decide("running", "running", waited=SLOT_WAIT - 0.1) is ParentsWait.WAIT
    assert decide("running", waited=SLOT_WAIT) is ParentsWait.DEFER


def test_a_queued_parent_is_waited_for_briefly_only() -> None:
    """Queued holds its slot, but with no free worker it may stay queued: the node does not hold one."""
    assert decide("queued", "running", waited=QUEUED_GRACE - 0.1) is ParentsWait.WAIT
    assert decide("queued", "running", waited=QUEUED_GRACE) is ParentsWait.DEFER


def test_a_parent_waiting_on_the_triggerer_is_waited_for_on_the_triggerer() -> None:
    assert decide("deferred", "running", waited=0.0) is ParentsWait.DEFER


@pytest.mark.parametrize(
    "not_started", [None, "scheduled", "up_for_retry", "up_for_reschedule", "restarting", "anything else"]
)
def test_a_parent_that_needs_a_slot_gets_this_one(not_started: str | None) -> None:
    """Whatever the others do, and however long the node waited: it gives its slot (and its task's cap,
    which a deferred instance keeps) back to the parent."""
    assert decide(not_started, waited=0.0) is ParentsWait.MAKE_WAY
    assert decide("running", not_started, "deferred", waited=SLOT_WAIT * 2) is ParentsWait.MAKE_WAY
    assert decide("success", not_started) is ParentsWait.MAKE_WAY


def test_the_trigger_decision_ignores_time() -> None:
    """The trigger asks with no bound: it keeps waiting (wait or defer) on started parents and releases
    the node only when they finished or one needs a slot."""
    for states, expected in (
        (["running", "queued"], ParentsWait.WAIT),
        (["running", "queued", "deferred"], ParentsWait.DEFER),
        (["success", "failed"], ParentsWait.READY),
        (["running", "up_for_retry"], ParentsWait.MAKE_WAY),
    ):
        assert parents_wait(states, 0.0, float("inf")) is expected


def test_parent_states_reads_mapped_instances_of_several_tasks() -> None:
    found = {"r": {"nodes_0": "success", "nodes_3": "running", "nodes__api_1": "scheduled", "nodes": "x"}}
    parents = {"nodes": [0, 3, 5], "nodes__api": [1]}
    assert parent_states(found, "r", parents) == ["success", "running", None, "scheduled"]
    assert decide(*parent_states(found, "r", parents)) is ParentsWait.MAKE_WAY


def test_the_next_node_to_run_polls_often_the_ones_further_down_seldom() -> None:
    """Pacing by the grandparents: parents whose own parents all finished are running their tools."""
    assert POLL_NEAR < POLL_FAR
    assert poll_pause([]) == POLL_NEAR  # the parents are roots
    assert poll_pause(["success", "failed", "skipped", "upstream_failed", "removed"]) == POLL_NEAR
    for unfinished in (None, "scheduled", "queued", "running", "deferred", "up_for_retry"):
        assert poll_pause(["success", unfinished]) == POLL_FAR, unfinished


def test_a_node_that_watches_its_parents_checkpoints_reads_their_states_seldom() -> None:
    """The checkpoints (looked at every POLL_NEAR) tell a parent's success; the states, read at the far
    pace, tell only a parent that failed, was skipped or needs a slot."""
    assert poll_pause([], checkpoints=True) == POLL_FAR
    assert poll_pause(["success"], checkpoints=True) == POLL_FAR
    assert poll_pause(["running"], checkpoints=True) == POLL_FAR


def test_a_large_plan_polls_less_often_so_the_run_reads_a_bounded_number_of_states() -> None:
    """Each poll returns every instance's state: 16 pollers of a 500-node plan must slow down, those of a
    60-node plan need not; the far pause is never shortened."""
    assert poll_pause(["success"], rows=60, pollers=16) == POLL_NEAR
    slow = poll_pause(["success"], rows=500, pollers=16)
    assert slow > POLL_NEAR
    assert 16 * 500 / slow == pytest.approx(STATE_ROWS_PER_SECOND)
    assert poll_pause(["running"], rows=60, pollers=16) == POLL_FAR


def test_waiting_generations_count_the_unfinished_nodes_between_a_node_and_the_runnable_ones() -> None:
    parents = {"r": [], "a": ["r"], "b": ["a"], "c": ["b", "r"], "x": [], "d": ["x", "c"]}
    all_running = {n: "running" for n in parents}
    assert [generations(n, parents, all_running.get) for n in "rabcxd"] == [0, 1, 2, 3, 0, 4]
    # finished ancestors end the count; a node not started yet counts as waiting
    states = {"r": "success", "a": "success", "b": None, "c": None, "x": "failed", "d": "running"}
    assert [generations(n, parents, states.get) for n in "bcd"] == [0, 1, 2]


def test_a_node_far_from_running_polls_less_the_further_it_is() -> None:
    """A node whose parents wait on their own parents cannot run before a tool of each generation in
    between has run: it reads the states once a generation's worth of far pauses, up to POLL_FARTHEST.
    The next node to run (parents running their tools) keeps its pace."""
    far = ["running"]  # a grandparent has not finished: the node is far
    assert poll_pause(far, waiting_generations=2) == POLL_FAR
    assert poll_pause(far, waiting_generations=3) == 2 * POLL_FAR
    assert poll_pause(far, waiting_generations=40) == POLL_FARTHEST
    assert poll_pause(["success"], waiting_generations=1) == POLL_NEAR
    assert poll_pause(["success"], waiting_generations=1, checkpoints=True) == POLL_FAR


# a chain r → a → b → c beside roots x and y; z depends on x; the task's map-index order
CHAIN = {"r": [], "x": [], "y": [], "a": ["r"], "z": ["x"], "b": ["a"], "c": ["b"]}
QUEUE = ["r", "x", "y", "a", "z", "b", "c"]


def _aside(states: dict[str, str | None], parents: dict[str, list[str]] = CHAIN) -> list[str]:
    queue = [n for n in QUEUE if n in parents] if parents is CHAIN else list(parents)
    return [n for n in queue if steps_aside(n, queue, parents, states.get)]


def test_far_waiters_last_in_the_queue_give_their_slots_to_ready_nodes_without_one() -> None:
    running = dict.fromkeys(["r", "y", "a", "b", "c"], "running")
    # z is ready (x finished) and has no slot: the far waiter last in the queue (c) steps aside
    assert _aside({**running, "x": "success", "z": "scheduled"}) == ["c"]
    # two ready nodes without a slot (root y, and z): both far waiters step aside; a is near (its
    # parent r runs its tool) and keeps its slot
    assert _aside({**running, "x": "success", "y": None, "z": "scheduled"}) == ["b", "c"]


def test_near_waiters_step_aside_when_no_far_one_is_left() -> None:
    parents = {"p": [], "s": [], "t": [], "w": ["p"]}
    states = {"p": "running", "w": "running", "s": None, "t": "scheduled"}
    assert _aside(states, parents) == ["w"]


def test_no_waiter_steps_aside_when_no_ready_node_waits_for_a_slot() -> None:
    running = dict.fromkeys(QUEUE, "running")
    assert _aside(running) == []
    # z waits for a slot but its parent x still runs: it could not run anyway
    assert _aside({**running, "z": "scheduled"}) == []
    # a retrying root is not ready: the parents rule (make way) gives it a slot, not this one
    assert _aside({**running, "x": "up_for_retry", "z": "scheduled"}) == []


def test_a_ready_node_behind_one_that_cannot_run_gets_no_slot_from_a_waiter() -> None:
    # the task's next free slot goes to z (first in the queue), which still waits for x: giving it one
    # would not let b run
    states = {"r": "success", "a": "success", "x": "running", "y": "running"}
    assert _aside({**states, "z": "scheduled", "b": "scheduled", "c": "running"}) == []
