"""The waiting policy (``plan/waiting.py``) never deadlocks, checked by the simulator of Airflow's slot
hand-out (``bench/simulator``) on thousands of random plans, caps and retries; and the check can fail.

A deadlock here is either of: no event left that could change a state while nodes are unfinished (the
scheduler loop and the triggers are simulated only when a state they look at changed, so a stable
state is an empty event heap), no state changed for longer than any timer of the model (twice the
longest tool plus 600 s), or the run not finished after a time far above the list-scheduling bound
(:class:`~bench.simulator.engine.Simulation`'s ``time_bound``).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

from airflow_plan_provider.plan.waiting import WaitingPolicy
from bench.plan_families import CAPS, FAMILIES, generate
from bench.simulator.cases import random_case, random_plan
from bench.simulator.engine import Outcome, simulate
from bench.simulator.model import CALIBRATED, Caps, Costs, SimPlan, list_scheduling_bound
from bench.simulator.policy import NeverLetGo, Policy

POLICY = WaitingPolicy()
CASES = 5000
LARGE = (2000, 1200, 700)  # plan sizes of the few large cases


def run_case(seed: int, size: int | None = None, policy: Policy = POLICY) -> Outcome:
    case = random_case(seed, size)
    return simulate(
        case.plans, policy, case.caps, case.costs, checkpoints=case.checkpoints, run_gap=case.run_gap
    )


def test_no_random_case_deadlocks() -> None:
    failures = []
    moves: Counter[str] = Counter()
    for seed in range(CASES):
        out = run_case(seed)
        moves.update(out.moves)
        if out.deadlock or out.finished != out.nodes:
            failures.append((seed, out.deadlock, out.finished, out.nodes))
    assert failures == []
    # the cases reach every move of the policy, many times
    assert (
        min(
            moves[kind]
            for kind in ("wait", "defer", "step_aside", "make_way", "checkpoint", "ready", "came_back")
        )
        > 100
    )


def test_large_plans_complete() -> None:
    for seed, size in enumerate(LARGE, start=CASES):
        out = run_case(seed, size)
        assert (out.deadlock, out.finished, out.nodes) == (None, size, size), (seed, size)


def test_the_check_finds_the_deadlock_of_a_policy_that_never_lets_go() -> None:
    """Without point 3 of the argument (a deferred node lets go of its task's cap when a parent needs a
    slot again), random cases deadlock, and the first one found is the docstring's: children deferred
    on a parent that retries fill the task's cap."""
    found = [seed for seed in range(300) if run_case(seed, policy=NeverLetGo()).deadlock]
    assert len(found) >= 10
    assert all(run_case(seed).deadlock is None for seed in found)


def test_a_retrying_root_under_a_cap_of_two() -> None:
    """The docstring's case, built by hand: a root whose first try fails (halfway through its 80 s tool,
    after slot_wait) once its two children were deferred, task cap 2. The real policy makes way and
    finishes; the broken one deadlocks with the root up for retry and both children deferred."""
    plan = SimPlan({"r": [], "a": ["r"], "b": ["r"]}, {"r": 80.0, "a": 1.0, "b": 1.0}, {"r": frozenset({1})})
    caps = Caps(task_cap=2, dag_cap=16, parallelism=16, retries=1, retry_delay=5.0)
    costs = Costs()
    good = simulate(plan, POLICY, caps, costs)
    assert good.deadlock is None and good.finished == 3
    assert good.makespan < 200
    bad = simulate(plan, NeverLetGo(POLICY), caps, costs)
    assert bad.deadlock is not None and bad.finished == 0


def test_makespans_respect_the_list_scheduling_bound() -> None:
    """No simulated schedule beats max(critical path, work / cap): the model cannot run more tools at
    once than its caps allow, nor a node before its parents."""
    for seed in range(300):
        case = random_case(seed)
        plan = replace(case.plans[0], failing_tries={}, lanes={})
        out = simulate(plan, POLICY, case.caps, case.costs, checkpoints=case.checkpoints)
        caps = case.caps
        cap = min(c for c in (caps.task_cap, caps.dag_cap, caps.parallelism, caps.pool) if c is not None)
        assert out.deadlock is None
        assert out.makespan >= list_scheduling_bound(plan, cap), seed


def test_same_inputs_same_schedule() -> None:
    case = random_case(11, 80)
    first = simulate(case.plans, POLICY, case.caps, CALIBRATED)
    second = simulate(case.plans, POLICY, case.caps, CALIBRATED)
    assert (first.makespans, first.events, first.moves) == (second.makespans, second.events, second.moves)


def test_lanes_sharing_one_slot_starve_only_without_weights_by_place() -> None:
    """Point 5 of the argument (``plan/waiting.py``): the package weighs every node instance by its
    node's place in the run order (``SessionsInTurn``; the simulator's default), so across the tasks of
    pooled lanes the scheduler's order is the plan's. Without those weights (``node_weights=None``, one
    weight per task) it is each task's map index: with one slot shared by the run's tasks (the DAG's
    max_active_tasks = 1), nodes of one lane that wait for their parents take the slot before a ready
    node of another lane with a higher map index. When their deferral is free (no task cap that can
    fill, no pool counting deferred instances) they defer and come back only to run: every plan
    finishes. When it is not, they make way and come back after each delay, and a ready node can wait
    for ever: the simulator finds such plans. With two shared slots none of them starves, nor with one
    when the instances are weighed by place."""
    starved, with_two, by_place = [], [], []
    for seed in range(30):
        rng = random.Random(seed)
        plan = random_plan(rng, rng.randint(20, 120), 1)
        lanes = {node: rng.choice(("gpu", "db")) for node in plan.parents if rng.random() < 0.3}
        plan = replace(plan, lanes=lanes, failing_tries={})
        free = Caps(task_cap=None, dag_cap=1, parallelism=32, lane_pools={"gpu": 4, "db": 4})
        assert simulate(plan, POLICY, free, Costs(), node_weights=None).deadlock is None, seed
        capped = replace(free, task_cap=4)
        if simulate(plan, POLICY, capped, Costs(), node_weights=None).deadlock:
            starved.append(seed)
            with_two.append(
                simulate(plan, POLICY, replace(capped, dag_cap=2), Costs(), node_weights=None).deadlock
            )
            by_place.append(simulate(plan, POLICY, capped, Costs()).deadlock)
    assert starved
    assert with_two == by_place == [None] * len(starved)


def test_plan_families_finish_at_every_cap() -> None:
    """The generated plan families (``bench/plan_families.py``: random local DAGs, fan-out / fan-in,
    long chains, mixed durations, pooled lanes) at every DAG cap from 1 to 32, as plan DAG and static
    DAG, with the costs calibrated on the bench: every run finishes."""
    stuck = []
    for family in FAMILIES:
        for seed in range(4):
            for cap in CAPS:
                plan = generate(family, seed, size=20 + 25 * seed, cap=cap)
                for static in (False, True):
                    out = simulate(plan.sim_plan(), POLICY, plan.caps(), CALIBRATED, static=static)
                    if out.deadlock or out.finished != out.nodes:
                        stuck.append((plan.name, static, out.deadlock))
    assert stuck == []


def test_a_deferred_nodes_trigger_looks_for_its_running_parents_checkpoints() -> None:
    """A child deferred on a parent whose tool outlasts slot_wait resumes when the parent's checkpoint
    is saved (``WaitingPolicy.trigger_watches``), before the parent's task ends and the trigger's next
    state read; without the looks (states only) it resumes later. Simulated time: deterministic."""
    plan = SimPlan({"p": [], "c": ["p"]}, {"p": 40.0, "c": 1.0})
    policy = WaitingPolicy(slot_wait=5.0)
    caps = Caps(task_cap=None, dag_cap=4, parallelism=4)
    costs = replace(CALIBRATED, triggerer_tick=0.0)  # a tick would hand both events on at the same one
    looking = simulate(plan, policy, caps, costs)
    reading = simulate(plan, policy, caps, costs, trigger_looks=False)
    assert looking.moves.get("trigger_checkpoint") == 1 and "trigger_checkpoint" not in reading.moves
    assert looking.handoff < reading.handoff


def test_a_fired_trigger_schedules_its_node_at_the_triggerers_next_tick() -> None:
    """The triggerer starts triggers and hands their events on once a tick (Airflow's trigger runner
    waits a second between two rounds): a child deferred on a parent whose tool ends between two ticks
    runs up to a tick later than it would if events were handed on at once."""
    plan = SimPlan({"p": [], "c": ["p"]}, {"p": 40.3, "c": 1.0})  # the child waits past slot_wait
    caps = Caps(dag_cap=4, parallelism=4)
    at_once = simulate(plan, POLICY, caps, replace(CALIBRATED, triggerer_tick=0.0))
    ticking = simulate(plan, POLICY, caps, replace(CALIBRATED, triggerer_tick=1.0))
    assert at_once.moves.get("defer", 0) == ticking.moves.get("defer", 0) == 1
    assert 0.0 < ticking.handoff - at_once.handoff <= 1.0 + 1e-9


def test_a_node_deferred_far_from_running_comes_back_and_starts_as_a_near_waiter() -> None:
    """Chain p (40 s) -> m (10 s) -> c: c defers while m still waits on p, and comes back to its slot
    once m starts its tool, so it picks m's result up from its checkpoint; m defers on p, which runs its
    tool already, and does not come back. Without coming back, c starts through the triggerer and a
    second task start after m's end: its hand-off is longer."""
    plan = SimPlan({"p": [], "m": ["p"], "c": ["m"]}, {"p": 40.0, "m": 10.0, "c": 1.0})
    caps = Caps(task_cap=None, dag_cap=4, parallelism=4)
    back = simulate(plan, POLICY, caps, CALIBRATED)
    stays = simulate(plan, POLICY, caps, CALIBRATED, comes_back=False)
    assert back.moves.get("came_back") == 1 and "came_back" not in stays.moves
    assert back.moves.get("defer") == stays.moves.get("defer") == 2
    assert max(back.handoffs) < max(stays.handoffs)


def test_a_node_of_a_large_plan_reads_its_grandparents_and_picks_its_parent_up_near() -> None:
    """Chain p (6 s) -> m (6 s) -> c, read one by one (a large plan's nodes): c waits in its slot, reads
    p while m runs, and once p finished it knows m runs its tool, so it looks for m's checkpoint every
    ``checkpoint_poll`` seconds. Reading m alone, it never knows and picks m up only at a state read,
    ``poll_far`` apart."""
    from bench.simulator.families import ParentsOnly

    plan = SimPlan({"p": [], "m": ["p"], "c": ["m"]}, {"p": 6.0, "m": 6.0, "c": 1.0})
    caps = Caps(task_cap=None, dag_cap=4, parallelism=4)
    one_by_one = WaitingPolicy(read_all_states_up_to=1)
    reading = simulate(plan, one_by_one, caps, CALIBRATED)
    parents_only = simulate(plan, ParentsOnly(one_by_one), caps, CALIBRATED)
    assert "defer" not in reading.moves and "defer" not in parents_only.moves
    assert max(reading.handoffs) <= one_by_one.checkpoint_poll + CALIBRATED.checkpoint_read + 1e-9
    assert max(parents_only.handoffs) > max(reading.handoffs)


def test_a_node_started_on_the_triggerer_takes_a_slot_only_near_its_parents() -> None:
    """Chain p (20 s) -> m (20 s) -> c (1 s): started on the triggerer (``starts_deferred``, Airflow's
    start_from_trigger), m and c hold no slot while their parents wait on their own parents. With "near"
    each is resumed when its parent runs its tool, and starts from that parent's checkpoint; with "ready"
    only once the parent saved it. Started in a slot, c waits there (or defers) from the start."""
    plan = SimPlan({"p": [], "m": ["p"], "c": ["m"]}, {"p": 20.0, "m": 20.0, "c": 1.0})
    caps = Caps(task_cap=None, dag_cap=4, parallelism=4)
    near = simulate(plan, POLICY, caps, CALIBRATED, starts_deferred="near")
    ready = simulate(plan, POLICY, caps, CALIBRATED, starts_deferred="ready")
    in_slot = simulate(plan, POLICY, caps, CALIBRATED)
    assert near.deadlock is None and ready.deadlock is None
    assert near.moves.get("came_back") == 2 and "came_back" not in ready.moves
    assert near.moves.get("checkpoint") == 2 and ready.moves.get("trigger_checkpoint") == 2
    assert ready.slot_seconds < near.slot_seconds < in_slot.slot_seconds
    assert max(near.handoffs) < min(ready.handoffs)  # a slot near the end, against a triggerer hand-off


def test_chain_cover_continues_each_node_from_its_deepest_free_parent() -> None:
    """``chain_cover``: a node continues the chain of one of its own parents, each parent is continued by
    one node at most, and of two free parents the deeper one is continued (d, two hops from the root,
    over b, one hop)."""
    from bench.simulator.engine import chain_cover

    plan = SimPlan(
        {"a": [], "b": ["a"], "c": ["a"], "d": ["c"], "e": ["b", "d"], "f": ["b"]},
        dict.fromkeys("abcdef", 1.0),
    )
    cover = chain_cover(plan)
    assert cover == {"b": "a", "d": "c", "e": "d", "f": "b"}  # c: a is b's; e: d deeper than b
    for seed in range(200):
        parents = random_plan(random.Random(seed), 30, retries=0).parents
        cover = chain_cover(SimPlan(parents, dict.fromkeys(parents, 1.0)))
        assert all(parent in parents[child] for child, parent in cover.items())
        assert len(set(cover.values())) == len(cover)
        assert {n for n, ps in parents.items() if ps and n not in cover} <= {
            n for n, ps in parents.items() if all(p in cover.values() for p in ps)
        }


def test_a_chain_child_is_scheduled_when_its_chain_parent_ends_and_waits_for_its_other_parents() -> None:
    """Laid out in chains (``chain_lanes``), chain p (20 s) -> c (1 s) with a second parent q (30 s)
    of c: c holds no slot while p runs (its instance is scheduled only when p ended, as a mapped task
    group's next step), then waits for q as any node does; the run finishes. Chain a (20 s) -> b (1 s)
    alone: b starts a static DAG's hand-off after a (and its parent's checkpoint read), not the
    triggerer's."""
    caps = Caps(task_cap=None, dag_cap=4, parallelism=4)
    plan = SimPlan({"p": [], "q": [], "c": ["p", "q"]}, {"p": 20.0, "q": 30.0, "c": 1.0})
    laid = simulate(plan, POLICY, caps, CALIBRATED, chain_lanes=True)
    flat = simulate(plan, POLICY, caps, CALIBRATED)
    assert laid.deadlock is None and laid.finished == 3
    assert laid.slot_seconds < flat.slot_seconds  # c took no slot for p's 20 s
    chain = SimPlan({"a": [], "b": ["a"]}, {"a": 20.0, "b": 1.0})
    laid = simulate(chain, POLICY, caps, CALIBRATED, chain_lanes=True)
    static = simulate(chain, POLICY, caps, CALIBRATED, static=True)
    deferred = simulate(chain, POLICY, caps, CALIBRATED, starts_deferred="ready")
    assert "wait" not in laid.moves and "defer" not in laid.moves
    assert abs(laid.handoff - static.handoff) <= 0.05 < deferred.handoff - laid.handoff


def test_plan_families_laid_out_in_chains_finish_at_every_cap() -> None:
    """The families at every cap from 1 to 32, laid out in chains (heads started in slots, and heads
    started on the triggerer): every run finishes."""
    stuck = []
    for family in FAMILIES:
        for seed in range(3):
            for cap in CAPS:
                plan = generate(family, seed, size=20 + 25 * seed, cap=cap)
                for options in ({}, {"starts_deferred": "near"}):
                    out = simulate(
                        plan.sim_plan(), POLICY, plan.caps(), CALIBRATED, chain_lanes=True, **options
                    )
                    if out.deadlock or out.finished != out.nodes:
                        stuck.append((plan.name, options, out.deadlock))
    assert stuck == []


def test_an_oracle_trigger_brings_its_node_to_a_slot_just_before_its_parent_ends() -> None:
    """``near_within``: started on the triggerer, c (child of p, 30 s) takes its slot about 2 s before
    p's tool ends instead of when it begins, so it holds a slot some 28 s less, and still picks p's
    result up from its checkpoint (in its slot, not through the triggerer)."""
    plan = SimPlan({"p": [], "c": ["p"]}, {"p": 30.0, "c": 1.0})
    caps = Caps(task_cap=None, dag_cap=4, parallelism=4)
    near = simulate(plan, POLICY, caps, CALIBRATED, starts_deferred="near")
    timed = simulate(plan, POLICY, caps, CALIBRATED, starts_deferred="near", near_within=2.0)
    assert near.moves.get("checkpoint") == timed.moves.get("checkpoint") == 1
    assert 25.0 < near.slot_seconds - timed.slot_seconds < 30.0


def ten_chains_of_two() -> SimPlan:
    """Ten chains p (10 s) -> c (1 s): 20 nodes in two layers."""
    parents = {f"{kind}{i}": ([f"p{i}"] if kind == "c" else []) for i in range(10) for kind in "pc"}
    return SimPlan(parents, {n: 10.0 if n.startswith("p") else 1.0 for n in parents})


def test_started_nodes_come_near_their_parents_freely_only_in_a_run_with_slots_to_spare() -> None:
    """The start on the triggerer as built (``families.STARTED_AS_BUILT``): ten chains of two nodes (two
    layers) on 16 slots come near their parents (coming back while the parents run); on 4 slots (20
    nodes > 4 x 2) only while fewer of the run's instances than its slots hold or wait for one: the two
    children whose parents run in the last round, with slots idle beside them, come near; the other
    eight take a slot once their parents saved their results. They hold fewer slot-seconds waiting than
    coming near freely, and the rule run at 4 slots without the idle gate never comes near."""
    from bench.simulator.families import MECHANISMS, STARTED_AS_BUILT

    options = MECHANISMS[STARTED_AS_BUILT][2]
    plan = ten_chains_of_two()
    spare = simulate(plan, POLICY, Caps(dag_cap=16, parallelism=16), CALIBRATED, **options)
    short = simulate(plan, POLICY, Caps(dag_cap=4, parallelism=4), CALIBRATED, **options)
    ungated = {key: value for key, value in options.items() if key != "near_if_idle"}
    ready = simulate(plan, POLICY, Caps(dag_cap=4, parallelism=4), CALIBRATED, **ungated)
    near = simulate(plan, POLICY, Caps(dag_cap=4, parallelism=4), CALIBRATED, starts_deferred="near")
    assert spare.moves.get("came_back") == 10
    assert short.moves.get("came_back") == 2 and short.moves.get("trigger_checkpoint") == 8
    assert "came_back" not in ready.moves
    assert short.waiting < near.waiting


def test_a_share_of_slots_times_layers_below_one_takes_slots_to_spare_from_full_plans_only() -> None:
    """``spare_share``: a run has slots to spare only where its nodes fill at most that share of its
    slots times its layers. Ten chains of two nodes (20 nodes, two layers): on 10 slots (20 = 10 x 2,
    full) they come near freely at the share 1.0 (``plan.waiting.slots_to_spare``) and through the idle
    gate at 0.8, which brings fewer near; on 16 slots (20 < 0.8 x 32) both shares leave them free."""
    from bench.simulator.families import MECHANISMS, STARTED_AS_BUILT

    options = MECHANISMS[STARTED_AS_BUILT][2]
    plan = ten_chains_of_two()
    full, wide = Caps(dag_cap=10, parallelism=10), Caps(dag_cap=16, parallelism=16)
    free = simulate(plan, POLICY, full, CALIBRATED, **options)
    gated = simulate(plan, POLICY, full, CALIBRATED, spare_share=0.8, **options)
    assert free.moves.get("came_back") == 10
    assert gated.moves.get("came_back", 0) < 10 and gated.moves.get("trigger_checkpoint", 0) > 0
    for share in (1.0, 0.8):
        assert simulate(plan, POLICY, wide, CALIBRATED, spare_share=share, **options).moves["came_back"] == 10


def test_a_run_with_slots_to_spare_gates_its_nodes_coming_near_once_its_tools_ran_long() -> None:
    """``gate_long_tools``: ten chains p (10 s) -> m (10 s) -> c (1 s) on 10 slots have slots to spare
    (30 nodes = 10 x 3 layers). Every m and c comes near its parent freely; with the gate at 5 s, the c
    nodes, whose parents run after the p tools ended (median 10 s), come only while a slot is idle, and
    none is (ten m hold them): they take a slot once their parents saved their results. Tools that ran
    shorter than the gate leave it open."""
    from bench.simulator.families import MECHANISMS, STARTED_AS_BUILT

    options = MECHANISMS[STARTED_AS_BUILT][2]
    parents: dict[str, list[str]] = {}
    for i in range(10):
        parents |= {f"p{i}": [], f"m{i}": [f"p{i}"], f"c{i}": [f"m{i}"]}
    plan = SimPlan(parents, {n: 1.0 if n.startswith("c") else 10.0 for n in parents})
    caps = Caps(dag_cap=10, parallelism=10)
    free = simulate(plan, POLICY, caps, CALIBRATED, **options)
    gated = simulate(plan, POLICY, caps, CALIBRATED, gate_long_tools=5.0, **options)
    short = simulate(plan, POLICY, caps, CALIBRATED, gate_long_tools=20.0, **options)
    assert free.moves.get("came_back") == short.moves.get("came_back") == 20
    assert gated.moves.get("came_back") == 10 and gated.moves.get("trigger_checkpoint") == 10


def test_a_static_dags_tasks_of_equal_weight_go_in_the_dags_task_order_or_the_tie_order_drawn() -> None:
    """A static DAG's tasks of equal weight are queued in the order Airflow created their instances, the
    DAG's task order (the plan's node order); ``tie_order`` draws another. Nine roots on two slots, one
    of 10 s and eight of 1 s: the long root first ends the run near 10 s, last near 14 s; so does the
    plan that names it first, or last; orders drawn from different seeds give both kinds of schedule,
    and one seed always the same."""
    caps = Caps(task_cap=None, dag_cap=2, parallelism=2)
    seconds = {"a": 10.0} | {f"s{i}": 1.0 for i in range(8)}
    plan = SimPlan({node: [] for node in seconds}, seconds)
    last = SimPlan({node: [] for node in reversed(seconds)}, seconds)
    first_makespan = simulate(plan, POLICY, caps, CALIBRATED, static=True).makespan
    last_makespan = simulate(last, POLICY, caps, CALIBRATED, static=True).makespan
    assert first_makespan < 11.5 < 13.0 < last_makespan
    makespans = {
        order: simulate(plan, POLICY, caps, CALIBRATED, static=True, tie_order=order).makespan
        for order in range(12)
    }
    assert min(makespans.values()) < 11.5 < 13.0 < max(makespans.values())
    assert all(m >= list_scheduling_bound(plan, 2) for m in makespans.values())
    again = simulate(plan, POLICY, caps, CALIBRATED, static=True, tie_order=3).makespan
    assert again == makespans[3]
