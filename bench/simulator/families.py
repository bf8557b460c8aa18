"""The simulator run wide on generated plans (``bench/plan_families.py``): each plan as a plan DAG and as a
static DAG under the same caps, with the costs calibrated on ``bench/`` (:data:`~.model.CALIBRATED`),
and the distribution of their makespan ratios per family, per cap and overall.

A plan run that does not finish (:attr:`~.engine.Outcome.deadlock`: no event left, no state change
for longer than any timer, or far past the list-scheduling bound) counts as a deadlock, plan DAG or
static DAG alike. :data:`MECHANISMS` are variants of the plan DAG's hand-off to a node whose parents
run long, tried on the same plans (``python bench/simulate.py --families N --mechanisms``)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from airflow_plan_provider.plan.waiting import Move, Wait, WaitingPolicy, WaitView
from bench.plan_families import Generated, sample
from bench.simulator.engine import simulate
from bench.simulator.model import CALIBRATED, Costs
from bench.simulator.policy import Policy

SIZE_GROUPS = ((20, 59), (60, 119), (120, 239), (240, 500))


@dataclass(frozen=True)
class Row:
    """One generated plan's plan-DAG and static-DAG makespans (inf: did not finish)."""

    name: str
    family: str
    seed: int
    size: int
    cap: int
    plan: float
    static: float
    cp: float
    cp_nodes: int
    deadlock: str | None
    moves: Mapping[str, int]

    @property
    def ratio(self) -> float:
        return self.plan / self.static


@dataclass(frozen=True)
class HoldWhileIdle:
    """``inner``, but a node in its slot whose in-slot bound passed keeps waiting there while no node of
    its task is ready to run without a slot (it would defer only to hold no slot nobody needs)."""

    inner: WaitingPolicy = WaitingPolicy()  # noqa: RUF009  # frozen

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def next_move(self, view: WaitView) -> Move:
        move = self.inner.next_move(view)
        if move.kind is not Wait.DEFER or not view.complete:
            return move
        states = [view.state_of(p) for p in view.parents[view.node]]
        if any(
            state not in ("running", "success", "failed", "skipped", "upstream_failed") for state in states
        ):
            return move  # a queued or deferred parent: defer as before
        finished = ("success", "failed", "skipped", "upstream_failed", "removed")
        needing = any(
            view.state_of(n) in (None, "scheduled")
            and all(view.state_of(p) in finished for p in view.parents[n])
            for n in view.queue
        )
        if needing:
            return move
        return Move(Wait.WAIT, self.inner.poll_far, near=True)


def _engine(**options: Any) -> tuple[Callable[[], Policy], Callable[[Costs], Costs], dict[str, Any]]:
    """A mechanism of the package's policy and costs, run with the engine's ``options``."""
    return WaitingPolicy, lambda c: c, options


#: mechanism → (policy, costs change, engine options); each is the defaults but for one change
MECHANISMS: dict[str, tuple[Callable[[], Policy], Callable[[Costs], Costs], dict[str, Any]]] = {
    "the package's policy and weights": _engine(),
    "trigger reads states only": _engine(trigger_looks=False),
    "slot_wait 120 s": (lambda: WaitingPolicy(slot_wait=120.0), lambda c: c, {}),
    "hold the slot while no ready node needs it": (HoldWhileIdle, lambda c: c, {}),
    "faster trigger: poll 0.1 s, looks 0.1 s": (
        lambda: WaitingPolicy(trigger_poll=0.1, checkpoint_poll=0.1),
        lambda c: c,
        {},
    ),
    "triggerer wakes at once (pick-up 0.1 s)": (WaitingPolicy, lambda c: replace(c, trigger_pickup=0.1), {}),
    "resumed nodes go first (priority weight)": _engine(resumed_first=True),
    "no weight by place (map-index order within each task)": _engine(node_weights=None),
    "weight by descendants (as static)": _engine(node_weights="descendants"),
    "no coming back to wait near running parents": _engine(comes_back=False),
}


def run_plan(
    generated: Generated,
    policy: Policy | None = None,
    costs: Costs = CALIBRATED,
    **options: Any,
) -> Row:
    policy = policy or WaitingPolicy()
    sim_plan, caps = generated.sim_plan(), generated.caps()
    plan = simulate(sim_plan, policy, caps, costs, **options)
    static = simulate(sim_plan, policy, caps, costs, static=True)
    cp, chain = generated.critical_path()
    return Row(
        generated.name,
        generated.family,
        generated.seed,
        generated.size,
        generated.cap,
        plan.makespan if plan.deadlock is None else math.inf,
        static.makespan if static.deadlock is None else math.inf,
        cp,
        len(chain),
        plan.deadlock or static.deadlock,
        dict(plan.moves),
    )


def run_families(
    count: int,
    seed: int = 0,
    policy: Policy | None = None,
    costs: Costs = CALIBRATED,
    plans: Sequence[Generated] | None = None,
    **options: Any,
) -> list[Row]:
    """``count`` generated plans (:func:`~bench.plan_families.sample`), each as plan and static DAG."""
    return [run_plan(g, policy, costs, **options) for g in (plans or sample(count, seed))]


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def distribution(rows: Iterable[Row]) -> dict[str, Any]:
    """Median, p95 and worst plan/static ratio of the finished ``rows``, the worst plan, and how many
    did not finish."""
    rows = list(rows)
    done = [r for r in rows if r.deadlock is None]
    out: dict[str, Any] = {"plans": len(rows), "deadlocks": len(rows) - len(done)}
    if done:
        ratios = [r.ratio for r in done]
        worst = max(done, key=lambda r: r.ratio)
        out |= {
            "median": round(statistics.median(ratios), 3),
            "p95": round(quantile(ratios, 0.95), 3),
            "worst": round(worst.ratio, 3),
            "worst_plan": worst.name,
            "worst_cp": f"{worst.cp:.1f} s over {worst.cp_nodes} nodes",
            "at_most_1.05": round(sum(r <= 1.05 for r in ratios) / len(ratios), 3),
        }
    return out


def by_group(rows: Sequence[Row]) -> dict[str, dict[str, Any]]:
    """The distribution per family, per cap, and over every plan (``all``)."""
    groups: dict[str, list[Row]] = {}
    for row in rows:
        groups.setdefault(row.family, []).append(row)
    for row in sorted(rows, key=lambda r: r.cap):
        groups.setdefault(f"cap {row.cap}", []).append(row)
    for low, high in SIZE_GROUPS:
        groups[f"{low}-{high} nodes"] = [r for r in rows if low <= r.size <= high]
    groups["all"] = list(rows)
    groups["all but lanes"] = [r for r in rows if r.family != "lanes"]
    return {name: distribution(group) for name, group in groups.items()}


def print_distribution(groups: Mapping[str, Mapping[str, Any]]) -> None:
    print(
        f"{'group':<16}{'plans':>6}{'median':>8}{'p95':>7}{'worst':>7}{'<=1.05':>8}{'deadlocks':>10}"
        "  worst plan (critical path)"
    )
    for name, d in groups.items():
        if "median" not in d:
            print(f"{name:<16}{d['plans']:>6}{'-':>8}{'-':>7}{'-':>7}{'-':>8}{d['deadlocks']:>10}")
            continue
        print(
            f"{name:<16}{d['plans']:>6}{d['median']:>8.3f}{d['p95']:>7.3f}{d['worst']:>7.3f}"
            f"{d['at_most_1.05']:>8.0%}{d['deadlocks']:>10}  {d['worst_plan']} ({d['worst_cp']})"
        )


def try_mechanisms(
    count: int, seed: int = 0, only: Sequence[str] = ()
) -> dict[str, dict[str, dict[str, Any]]]:
    """Each of :data:`MECHANISMS` (the package's first, then those whose name contains one of ``only``,
    every one without) on the same ``count`` plans: mechanism → its distribution by group."""
    plans = sample(count, seed)
    out, rows_of = {}, {}
    first = next(iter(MECHANISMS))
    for name, (policy, change, options) in MECHANISMS.items():
        if only and name != first and not any(part in name for part in only):
            continue
        rows_of[name] = run_families(count, policy=policy(), costs=change(CALIBRATED), plans=plans, **options)
        out[name] = by_group(rows_of[name])
    if all(name in rows_of for name in BEST_OF):
        best = [min(pair, key=lambda r: r.ratio) for pair in zip(*(rows_of[n] for n in BEST_OF), strict=True)]
        out["oracle: per plan, the faster of " + " and of ".join(BEST_OF)] = by_group(best)
    return out


@dataclass(frozen=True)
class FarDefers:
    """``inner``, but a node in its slot whose parents still wait on their own parents (not ``near``: it
    cannot run before a tool of each generation in between) waits on the triggerer at once, holding a
    slot only while its parents run their tools."""

    inner: WaitingPolicy = WaitingPolicy()  # noqa: RUF009  # frozen

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def next_move(self, view: WaitView) -> Move:
        move = self.inner.next_move(view)
        if move.kind is Wait.WAIT and not move.near:
            return Move(Wait.DEFER)
        return move


@dataclass(frozen=True)
class AlwaysMakeWay:
    """``inner`` as if no deferral were free: a node whose parent needs a slot makes way, and a trigger
    releases its node when a parent needs one, whatever the caps."""

    inner: WaitingPolicy = WaitingPolicy()  # noqa: RUF009  # frozen

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def next_move(self, view: WaitView) -> Move:
        return self.inner.next_move(replace(view, free_deferral=False))

    def trigger_move(
        self,
        states: Iterable[str | None],
        free_deferral: bool = False,
        grandparents: Iterable[Iterable[str | None]] | None = None,
    ) -> Wait | None:
        return self.inner.trigger_move(states, grandparents=grandparents)


@dataclass(frozen=True)
class NeverWaitInSlot:
    """``inner``, but a node whose parents have not all finished never waits in its slot: it waits on the
    triggerer (holding no slot a ready node could have, as in a static DAG, where only ready tasks hold
    slots), and its trigger wakes it when they finished or saved their checkpoints."""

    inner: WaitingPolicy = WaitingPolicy()  # noqa: RUF009  # frozen

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def next_move(self, view: WaitView) -> Move:
        move = self.inner.next_move(view)
        return Move(Wait.DEFER) if move.kind is Wait.WAIT else move


@dataclass(frozen=True)
class ParentsOnly:
    """``inner``, but a node of a large plan (reading one by one) reads its parents' states only, never
    their parents': it cannot tell when they run their tools, so it never looks for their checkpoints
    in its slot."""

    inner: WaitingPolicy = WaitingPolicy()  # noqa: RUF009  # frozen

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def reads_grandparents(self, states: Iterable[str | None]) -> bool:
        return False


MECHANISMS["make way, no free deferral"] = (AlwaysMakeWay, lambda c: c, {})
MECHANISMS["far nodes defer at once"] = (FarDefers, lambda c: c, {})
MECHANISMS["large plans read parents only (not their parents)"] = (ParentsOnly, lambda c: c, {})
MECHANISMS["far nodes defer at once, weight by descendants"] = (
    FarDefers,
    lambda c: c,
    {"node_weights": "descendants"},
)
MECHANISMS["no waiting in a slot (defer until ready)"] = (NeverWaitInSlot, lambda c: c, {"comes_back": False})
MECHANISMS["oracle: waiters yield to a ready node without a slot, weight by descendants"] = _engine(
    yields_to_ready="all", node_weights="descendants"
)
MECHANISMS["oracle: far waiters yield to a ready node without a slot, weight by descendants"] = _engine(
    yields_to_ready="far", node_weights="descendants"
)
# Airflow's start_from_trigger for the node tasks (NodeExecution(start_on_triggerer=True); Airflow 3.1 and
# 3.2 never start a task on the triggerer, 3.3 and 3.4 start mapped instances there,
# bench/start_from_trigger.py)
MECHANISMS["nodes with parents start on the triggerer, take a slot near (start_from_trigger)"] = _engine(
    starts_deferred="near"
)
MECHANISMS["nodes with parents start on the triggerer, take a slot ready (start_from_trigger)"] = _engine(
    starts_deferred="ready"
)
MECHANISMS["nodes with parents start on the triggerer, take a slot near, weight by descendants"] = _engine(
    starts_deferred="near", node_weights="descendants"
)
MECHANISMS["nodes with parents start on the triggerer, take a slot near, by descendants from cap 4"] = (
    _engine(starts_deferred="near", node_weights="descendants from cap 4")
)
#: NodeExecution(start_on_triggerer=True) before the runs without slots to spare (plan.waiting
#: .slots_to_spare) had their nodes come to a slot only when ready: every node came near its parents
STARTED_NEAR_ALWAYS = "start_on_triggerer: near, descendant places from cap 4"
MECHANISMS[STARTED_NEAR_ALWAYS] = _engine(starts_deferred="near", node_weights="descendant places from cap 4")
MECHANISMS["start_on_triggerer near, oracle: waiters yield to a ready node without a slot"] = _engine(
    starts_deferred="near", node_weights="descendant places from cap 4", yields_to_ready="all"
)
for _after in (0, 1, 2, 5, 10):
    MECHANISMS[
        "start_on_triggerer near, waiters yield to any instance of their run without a slot"
        + (f" once they waited {_after} s" if _after else "")
    ] = _engine(
        starts_deferred="near",
        node_weights="descendant places from cap 4",
        yields_to_ready="scheduled",
        yields_after=float(_after),
    )
for _within in (1, 2, 4):
    MECHANISMS[
        f"start_on_triggerer near, oracle: its trigger brings it to a slot {_within} s before its parents end"
    ] = _engine(
        starts_deferred="near", node_weights="descendant places from cap 4", near_within=float(_within)
    )
for _weights in ("descendants", "descendant places", "position"):
    MECHANISMS[f"start on the triggerer, take a slot ready, weight {_weights}"] = _engine(
        starts_deferred="ready", node_weights=_weights
    )
MECHANISMS["chains as mapped task groups (a chain child scheduled by Airflow), heads started near"] = _engine(
    starts_deferred="near", node_weights="descendant places from cap 4", chain_lanes=True
)
MECHANISMS["chains as mapped task groups, heads in slots, the package's weights"] = _engine(chain_lanes=True)
MECHANISMS["chains as mapped task groups, heads in slots, weight by descendants"] = _engine(
    chain_lanes=True, node_weights="descendants"
)
for _up_to in (4, 8):
    MECHANISMS[
        f"chains as mapped task groups weighed by descendants up to cap {_up_to}, start_on_triggerer near"
        " above"
    ] = _engine(starts_deferred="near", node_weights="descendant places from cap 4", chain_lanes_up_to=_up_to)
#: NodeExecution(start_on_triggerer=True) before the runs without slots to spare had their nodes come
#: near while a slot is idle: there they came to a slot only when ready, weighed by descendants
STARTED_READY_WITHOUT_SPARE = (
    "start_on_triggerer: near where slots are to spare (nodes <= slots x layers), else ready"
)
MECHANISMS[STARTED_READY_WITHOUT_SPARE] = _engine(
    starts_deferred="near where slots are many", node_weights="descendant places from cap 4"
)
for _gate, _counted in (("all", "in a slot"), ("all+scheduled", "in or waiting for a slot")):
    MECHANISMS[
        f"start_on_triggerer: near only while fewer of the run's nodes than its slots are {_counted}"
    ] = _engine(starts_deferred="near", node_weights="descendant places from cap 4", near_if_idle=_gate)
    MECHANISMS[
        "start_on_triggerer: near where slots are to spare, else near only while fewer of the run's nodes"
        f" than its slots are {_counted}"
    ] = _engine(
        starts_deferred="near where slots are many",
        node_weights="descendant places from cap 4",
        near_if_idle=_gate.replace("all", "spare-less"),
    )
#: the package's NodeExecution(start_on_triggerer=True) as built: nodes come near their parents where
#: the run has slots to spare, else only while fewer of the run's node instances than its slots hold or
#: wait for one (plan.waiting.leaves_a_slot_idle), weighed by descendants there; the mechanism the
#: held-out check predicts the plan DAG started on the triggerer with (plan_dags.py --start-on-triggerer)
STARTED_AS_BUILT = (
    "start_on_triggerer: near where slots are to spare, else near only while fewer of the run's nodes"
    " than its slots are in or waiting for a slot"
)
#: an oracle row of :func:`try_mechanisms`: each plan run by whichever of these two ran it faster
BEST_OF = (STARTED_NEAR_ALWAYS, "start on the triggerer, take a slot ready, weight descendants")
# the start on the triggerer as built, with one change each
for _share in (0.9, 0.8, 0.7):
    MECHANISMS[
        f"{STARTED_AS_BUILT}, slots to spare only where the nodes fill {_share:.0%} of slots x layers or less"
    ] = _engine(**MECHANISMS[STARTED_AS_BUILT][2], spare_share=_share)
for _seconds in (8, 12):
    MECHANISMS[
        f"{STARTED_AS_BUILT}, and where slots are to spare near only while a slot is idle once the run's"
        f" finished tools ran over {_seconds} s (median)"
    ] = _engine(**MECHANISMS[STARTED_AS_BUILT][2], gate_long_tools=float(_seconds))
for _most in (200, 300, 600):
    MECHANISMS[f"whole-task reads up to {_most} nodes"] = (
        lambda most=_most: WaitingPolicy(read_all_states_up_to=most),  # type: ignore[misc]
        lambda c: c,
        {},
    )


def sessions(
    runs: int = 20,
    slots: int = 8,
    policy: Policy | None = None,
    costs: Costs = CALIBRATED,
    undated: bool = False,
    in_turn: bool = True,
) -> dict[str, dict[str, Any]]:
    """``concurrent_runs.py``'s batch in the simulator: ``runs`` sessions of the 20-node plan (4 layers
    of 5, node i of layer k needs nodes i and i+1 of layer k-1, tools 1 s) triggered at once, node
    instances sharing a pool of ``slots`` (deferred instances not counted), parallelism 16, node task
    cap above it; then the same as static DAG runs. Per DAG: each session's latency (trigger → end)
    p50 and p95, and the batch's throughput (nodes per minute, first start → last end). ``undated``: the
    runs have no logical date (as the bench triggers them), so the scheduler's order falls to the map
    index and the runs' instances interleave; ``in_turn``: the plan DAG's node instances weighed as
    the package's ``SessionsInTurn`` does, less their session's rank (the static DAG keeps Airflow's
    downstream weights)."""
    from bench.simulator.engine import Simulation
    from bench.simulator.model import Caps, SimPlan

    parents: dict[str, list[str]] = {}
    for layer in range(4):
        for i in range(5):
            node = f"{layer}-{i}"
            parents[node] = [f"{layer - 1}-{j}" for j in (i, i + 1) if layer and j < 5]
    plan = SimPlan(parents, dict.fromkeys(parents, 1.0))
    caps = Caps(task_cap=20, dag_cap=16, parallelism=16, pool=slots)
    out = {}
    for kind in ("plan", "static"):
        sim = Simulation(
            [plan] * runs,
            policy or WaitingPolicy(),
            caps,
            costs,
            static=kind == "static",
            runs_undated=undated,
            sessions_in_turn=in_turn,
        )
        result = sim.run()
        latencies = sorted(r.end - r.trigger_at for r in sim.runs if r.end is not None)
        first = min(r.start for r in sim.runs if r.start is not None)
        last = max(r.end for r in sim.runs if r.end is not None)
        out[kind] = {
            "p50": round(statistics.median(latencies), 1),
            "p95": round(quantile(latencies, 0.95), 1),
            "nodes_per_min": round(60 * len(parents) * runs / (last - first), 1),
            "deadlock": result.deadlock,
        }
    return out


@dataclass(frozen=True)
class DeferWhenContended:
    """``inner``, but a node that would wait in its slot defers at once while an instance of its task
    waits for a slot (the slot is contended: a static DAG would give it to a ready task), once its
    deferral is free; it waits in the slot only while no instance of its task lacks one."""

    inner: WaitingPolicy = WaitingPolicy()  # noqa: RUF009  # frozen

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def next_move(self, view: WaitView) -> Move:
        move = self.inner.next_move(view)
        if move.kind is not Wait.WAIT or not view.complete or not view.free_deferral:
            return move
        if any(view.state_of(n) in (None, "scheduled") for n in view.queue if n != view.node):
            return Move(Wait.DEFER)
        return move


MECHANISMS["defer at once while a slot is contended"] = (DeferWhenContended, lambda c: c, {})
