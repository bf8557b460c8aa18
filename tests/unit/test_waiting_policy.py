"""The waiting policy of barrier-free nodes: what a node does while its parents have not finished."""

from __future__ import annotations

import pytest

from airflow_plan_provider.plan.waiting import (
    FINISHED,
    Move,
    Wait,
    WaitingPolicy,
    WaitView,
    deferral_is_free,
    generations,
    slots_to_spare,
    steps_aside,
)

POLICY = WaitingPolicy()
POLL_NEAR, POLL_FAR, POLL_FARTHEST = POLICY.poll_near, POLICY.poll_far, POLICY.poll_farthest
QUEUED_GRACE, STATE_ROWS_PER_SECOND = POLICY.queued_grace, POLICY.state_rows_per_second
SLOT_WAIT = POLICY.slot_wait


def decide(*states: str | None, waited: float = 0.0) -> Wait:
    return POLICY.parents_wait(list(states), waited)


@pytest.mark.parametrize("finished", ["success", "failed", "skipped", "upstream_failed", "removed"])
def test_every_finished_state_counts_as_finished(finished: str) -> None:
    assert decide("success", finished) is Wait.READY
    assert decide() is Wait.READY  # no parents at all


def test_running_parents_are_waited_for_in_the_slot_until_the_bound() -> None:
    assert decide("running", "success", waited=0.0) is Wait.WAIT
    assert decide("running", "running", waited=SLOT_WAIT - 0.1) is Wait.WAIT
    assert decide("running", waited=SLOT_WAIT) is Wait.DEFER


def test_a_queued_parent_is_waited_for_briefly_only() -> None:
    """Queued holds its slot, but with no free worker it may stay queued: the node does not hold one."""
    assert decide("queued", "running", waited=QUEUED_GRACE - 0.1) is Wait.WAIT
    assert decide("queued", "running", waited=QUEUED_GRACE) is Wait.DEFER


def test_a_parent_waiting_on_the_triggerer_is_waited_for_on_the_triggerer() -> None:
    assert decide("deferred", "running", waited=0.0) is Wait.DEFER


@pytest.mark.parametrize(
    "not_started", [None, "scheduled", "up_for_retry", "up_for_reschedule", "restarting", "anything else"]
)
def test_a_parent_that_needs_a_slot_gets_this_one(not_started: str | None) -> None:
    """Whatever the others do, and however long the node waited: it gives its slot (and its task's cap,
    which a deferred instance keeps) back to the parent."""
    assert decide(not_started, waited=0.0) is Wait.MAKE_WAY
    assert decide("running", not_started, "deferred", waited=SLOT_WAIT * 2) is Wait.MAKE_WAY
    assert decide("success", not_started) is Wait.MAKE_WAY


def test_the_trigger_ignores_time() -> None:
    """The trigger keeps waiting on started parents and releases the node only when they finished or
    one needs a slot."""
    for states, expected in (
        (["running", "queued"], None),
        (["running", "queued", "deferred"], None),
        (["success", "failed"], Wait.READY),
        (["running", "up_for_retry"], Wait.MAKE_WAY),
    ):
        assert POLICY.trigger_move(states) is expected


@pytest.mark.parametrize(
    ("states", "grandparents", "expected"),
    [
        (["running"], [["success", "failed"]], Wait.WAIT),  # the parent runs its tool
        (["running", "success"], [[], ["running"]], Wait.WAIT),  # a finished parent's own do not count
        (["running"], [["success", "running"]], None),  # the parent still waits on its own parent
        (["running"], [["success", None]], None),
        (["queued"], [["success"]], None),  # a queued parent has not started its tool
        (["running", "deferred"], [["success"], ["success"]], None),  # a parent on the triggerer
        (["success"], [["running"]], Wait.READY),
        (["scheduled"], [["success"]], Wait.MAKE_WAY),
    ],
)
def test_a_deferred_node_comes_back_to_wait_once_its_parents_run_their_tools(
    states: list[str | None], grandparents: list[list[str | None]], expected: Wait | None
) -> None:
    """Given its grandparents' states (while it may come back), the trigger has the node come back to
    wait in a slot when every unfinished parent runs and their own parents finished: from then on the
    node picks their results up as a near waiter does."""
    assert POLICY.trigger_move(states, grandparents=grandparents) is expected
    if expected is Wait.WAIT:  # without them (it came back once already) it waits to the end
        assert POLICY.trigger_move(states) is None


def near(grandparent_states: list[str | None]) -> bool:
    """Whether a node whose grandparents are in these states is near running (its parents run tools)."""
    return all(state in FINISHED for state in grandparent_states)


def test_the_next_node_to_run_polls_often_the_ones_further_down_seldom() -> None:
    """Pacing by the grandparents: parents whose own parents all finished are running their tools."""
    assert POLL_NEAR < POLL_FAR
    assert POLICY.poll_pause(near([])) == POLL_NEAR  # the parents are roots
    assert (
        POLICY.poll_pause(near(["success", "failed", "skipped", "upstream_failed", "removed"])) == POLL_NEAR
    )
    for unfinished in (None, "scheduled", "queued", "running", "deferred", "up_for_retry"):
        assert POLICY.poll_pause(near(["success", unfinished])) == POLL_FAR, unfinished


def test_a_node_that_watches_its_parents_checkpoints_reads_their_states_seldom() -> None:
    """The checkpoints (looked at every POLL_NEAR) tell a parent's success; the states, read at the far
    pace, tell only a parent that failed, was skipped or needs a slot."""
    assert POLICY.poll_pause(near([]), checkpoints=True) == POLL_FAR
    assert POLICY.poll_pause(near(["success"]), checkpoints=True) == POLL_FAR
    assert POLICY.poll_pause(near(["running"]), checkpoints=True) == POLL_FAR


def test_a_large_plan_polls_less_often_so_the_run_reads_a_bounded_number_of_states() -> None:
    """Each poll returns every instance's state: 16 pollers of a 500-node plan must slow down, those of a
    60-node plan need not; the far pause is never shortened."""
    assert POLICY.poll_pause(near(["success"]), rows=60, pollers=16) == POLL_NEAR
    slow = POLICY.poll_pause(near(["success"]), rows=500, pollers=16)
    assert slow > POLL_NEAR
    assert 16 * 500 / slow == pytest.approx(STATE_ROWS_PER_SECOND)
    assert POLICY.poll_pause(near(["running"]), rows=60, pollers=16) == POLL_FAR


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
    assert POLICY.poll_pause(near(far), waiting_generations=2) == POLL_FAR
    assert POLICY.poll_pause(near(far), waiting_generations=3) == 2 * POLL_FAR
    assert POLICY.poll_pause(near(far), waiting_generations=40) == POLL_FARTHEST
    assert POLICY.poll_pause(near(["success"]), waiting_generations=1) == POLL_NEAR
    assert POLICY.poll_pause(near(["success"]), waiting_generations=1, checkpoints=True) == POLL_FAR


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


def test_near_waiters_step_aside_when_no_far_one_is_left_for_a_node_that_holds_up_more() -> None:
    # w waits for p, which runs its tool; s and t are ready and have no slot. s has a child: more of
    # the plan waits on s than on w, so w gives s its slot
    parents = {"p": [], "s": [], "t": [], "w": ["p"], "u": ["s"]}
    states = {"p": "running", "w": "running", "s": None, "t": "scheduled"}
    assert _aside(states, parents) == ["w"]


def test_a_near_waiter_keeps_its_slot_from_ready_nodes_that_hold_up_no_more_than_it() -> None:
    """Stepping aside would cost the near waiter a trip through the triggerer, seconds, for a ready node
    a static DAG would start after it anyway (its weight is not higher)."""
    states = {"p": "running", "w": "running", "s": None, "t": "scheduled"}
    assert _aside(states, {"p": [], "s": [], "t": [], "w": ["p"]}) == []
    # w holds up a chain of two: a ready node with one child does not outrank it
    chain = {"p": [], "s": [], "t": [], "w": ["p"], "v": ["w"], "x": ["v"], "u": ["s"]}
    assert _aside(states, chain) == []
    # a far waiter steps aside whatever it holds up
    far = {"q": [], "p": ["q"], "s": [], "w": ["p"], "v": ["w"], "x": ["v"]}
    assert _aside({"q": "running", "p": "running", "w": "running", "s": None}, far) == ["w"]


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


# -- the whole move of a node in its slot, and the numbers behind it -----------------------------------


def view(
    node: str, states: dict[str, str | None], parents: dict[str, list[str]] = CHAIN, **kw: object
) -> WaitView:
    queue = [n for n in QUEUE if n in parents] if parents is CHAIN else list(parents)
    return WaitView(node, parents, states.get, queue=queue, **kw)  # type: ignore[arg-type]


def test_next_move_reads_the_parents_then_steps_aside_then_paces() -> None:
    running = dict.fromkeys(["r", "y", "a", "b", "c"], "running")
    # c: far waiter behind a ready z without a slot -> steps aside, unless the task's cap is full
    states = {**running, "x": "success", "z": "scheduled"}
    assert POLICY.next_move(view("c", states)).kind is Wait.STEP_ASIDE
    # the task's cap counts its queued, running and deferred instances (here r, y, a, b, c)
    assert POLICY.next_move(view("c", states, task_cap=5)).kind is Wait.WAIT
    assert POLICY.next_move(view("c", states, task_cap=6)).kind is Wait.STEP_ASIDE
    assert POLICY.next_move(view("c", {**states, "y": "deferred"}, task_cap=5)).kind is Wait.WAIT
    # a large plan's node does not see its whole task: it never steps aside and paces as 2 generations
    assert POLICY.next_move(view("c", states, complete=False)) == Move(Wait.WAIT, POLL_FAR, near=False)
    # a: parent r runs its tool (no grandparent): near, checkpoints looked for, states read at the far pace
    assert POLICY.next_move(view("a", states)) == Move(Wait.WAIT, POLL_FAR, near=True)
    assert POLICY.next_move(view("a", states, checkpoints=False)) == Move(Wait.WAIT, POLL_NEAR, near=True)
    # c is 3 generations away from running (b, a wait; r runs): 2 far pauses
    everyone = dict.fromkeys(QUEUE, "running")
    assert POLICY.next_move(view("c", everyone)) == Move(Wait.WAIT, 2 * POLL_FAR, near=False)


def test_next_move_passes_the_parents_rule_through() -> None:
    assert POLICY.next_move(view("a", {"r": "success"})) == Move(Wait.READY)
    assert POLICY.next_move(view("a", {"r": "running"}, waited=POLICY.slot_wait)) == Move(Wait.DEFER)
    made_way = POLICY.next_move(view("a", {"r": "up_for_retry"}, made_way=1))
    assert made_way == Move(Wait.MAKE_WAY, 2 * POLICY.make_way_first)


def test_a_node_whose_deferral_holds_nothing_waits_on_the_triggerer_for_a_parent_needing_a_slot() -> None:
    """Instead of making way (and coming back after each delay, taking a slot each time), a node that
    deferred holds no cap another instance could wait for: it defers, and its trigger keeps waiting
    through the parent's slot wait and retries, until every parent finished."""
    free = {"free_deferral": True}
    assert POLICY.next_move(view("a", {"r": "scheduled"}, **free)) == Move(Wait.DEFER)
    assert POLICY.next_move(view("a", {"r": "up_for_retry"}, made_way=3, **free)) == Move(Wait.DEFER)
    assert POLICY.next_move(view("a", {"r": "success"}, **free)) == Move(Wait.READY)
    assert POLICY.next_move(view("a", {"r": "scheduled"})).kind is Wait.MAKE_WAY
    for states in (["scheduled"], ["running", "up_for_retry"], [None, "success"]):
        assert POLICY.trigger_move(states, free_deferral=True) is None
        assert POLICY.trigger_move(states) is Wait.MAKE_WAY
    assert POLICY.trigger_move(["success", "failed"], free_deferral=True) is Wait.READY


@pytest.mark.parametrize(
    ("task_cap", "size", "pool_counts_deferred", "free"),
    [
        (None, 500, False, True),
        (500, 500, False, True),
        (499, 500, False, False),  # the cap can fill: a deferred node may hold what another needs
        (5, 500, False, False),
        (None, 500, True, False),  # the pool counts it
    ],
)
def test_a_deferral_is_free_only_when_no_cap_could_fill_with_it(
    task_cap: int | None, size: int, pool_counts_deferred: bool, free: bool
) -> None:
    assert deferral_is_free(task_cap, size, pool_counts_deferred) is free


def test_make_way_delays_double_up_to_their_bound() -> None:
    delays = [POLICY.make_way_delay(n) for n in range(0, 60)]
    assert delays[0] == POLICY.make_way_first >= 5.0  # apache/airflow#71172: not less than 5 s
    assert delays == sorted(delays)
    assert max(delays) == POLICY.make_way_max == delays[-1]


def test_a_failed_read_is_retried_with_backoff_within_the_slot_bound_then_the_node_defers() -> None:
    pauses = [POLICY.after_failed_read(n, waited=0.0).after for n in range(1, 12)]
    assert pauses[0] == POLICY.read_retry_first
    assert pauses == sorted(pauses) and pauses[-1] == POLICY.read_retry_max
    assert all(POLICY.after_failed_read(n, waited=0.0).kind is Wait.WAIT for n in range(1, 12))
    # never past the bound, and at the bound the trigger takes over the reads
    assert POLICY.after_failed_read(10, waited=POLICY.slot_wait - 1.0).after == 1.0
    assert POLICY.after_failed_read(1, waited=POLICY.slot_wait) == Move(Wait.DEFER)


def test_the_large_plan_switch_is_one_number() -> None:
    assert not POLICY.reads_one_by_one(POLICY.read_all_states_up_to)
    assert POLICY.reads_one_by_one(POLICY.read_all_states_up_to + 1)


def test_a_deferred_job_gets_its_timeout_with_a_margin() -> None:
    assert POLICY.job_timeout(None) is None
    assert POLICY.job_timeout(60.0) == 60.0 * POLICY.job_timeout_margin


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"poll_near": -1}, "WaitingPolicy.poll_near must be a number >= 0, got -1"),
        ({"poll_far": "1"}, "WaitingPolicy.poll_far must be a number >= 0, got '1'"),
        ({"trigger_poll": 0}, "WaitingPolicy.trigger_poll must be > 0, got 0"),
        ({"poll_farthest": 0.5}, "WaitingPolicy.poll_farthest (0.5) must be >= poll_far (1.0)"),
        ({"make_way_max": 1.0}, "WaitingPolicy: a *_max delay must be >= its *_first delay"),
        ({"job_timeout_margin": 0.5}, "WaitingPolicy.job_timeout_margin must be >= 1, got 0.5"),
        ({"read_all_states_up_to": True}, "WaitingPolicy.read_all_states_up_to must be a number >= 0"),
    ],
)
def test_a_policy_with_a_wrong_number_names_it(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as error:
        WaitingPolicy(**changes)  # type: ignore[arg-type]
    assert str(error.value).startswith(message)


def test_a_generation_count_over_a_long_chain_does_not_recurse() -> None:
    parents = {"n0": []} | {f"n{i}": [f"n{i - 1}"] for i in range(1, 5000)}
    assert generations("n4999", parents, lambda n: "running") == 4999


@pytest.mark.parametrize(
    ("nodes", "layers", "slots", "spare"),
    [(20, 10, 2, True), (20, 10, 1, False), (21, 10, 2, False), (5, 5, 1, True), (500, 20, 32, True)],
)
def test_a_run_has_slots_to_spare_while_its_nodes_are_at_most_its_slots_times_its_layers(
    nodes: int, layers: int, slots: int, spare: bool
) -> None:
    """Equal tools need max(layers, nodes / slots) rounds: the slots bound the run only past
    ``slots * layers`` nodes, and only then is a slot held near a running parent one a ready node needs."""
    assert slots_to_spare(nodes, layers, slots) is spare
