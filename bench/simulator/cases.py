"""Random cases for the property tests: plans (mostly small, a few of up to 2,000 nodes), caps from 1 to
32, pools and pooled lanes, parents that fail and retry, several runs sharing a deployment."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from airflow_plan_provider.plan.waiting import deferral_is_free
from bench.simulator.model import Caps, Costs, SimPlan


@dataclass(frozen=True)
class Case:
    seed: int
    plans: list[SimPlan]
    caps: Caps
    costs: Costs
    checkpoints: bool
    run_gap: float
    notes: dict[str, object] = field(default_factory=dict)

    @property
    def nodes(self) -> int:
        return sum(len(p.parents) for p in self.plans)


def random_plan(rng: random.Random, size: int, retries: int) -> SimPlan:
    """A random DAG of ``size`` nodes (ids in topological order) of one of three shapes: layered (one
    parent in the layer before, up to two earlier), sparse random edges, or a chain with branches."""
    shape = rng.choice(("layered", "random", "chain"))
    ids = [str(i) for i in range(1, size + 1)]
    parents: dict[str, list[str]] = {n: [] for n in ids}
    if shape == "layered":
        width = rng.randint(1, max(1, min(40, size)))
        for i, node in enumerate(ids):
            layer = i // width
            if layer:
                previous = ids[(layer - 1) * width : layer * width]
                chosen = {rng.choice(previous)}
                for _ in range(rng.randint(0, 2)):
                    chosen.add(rng.choice(ids[: layer * width]))
                parents[node] = sorted(chosen, key=int)
    elif shape == "random":
        p = min(1.0, rng.uniform(0.5, 3.0) / max(1, size))
        for i, node in enumerate(ids):
            window = ids[max(0, i - 60) : i]
            parents[node] = [q for q in window if rng.random() < p * 8] if size < 60 else []
            if size >= 60 and i:
                parents[node] = sorted({rng.choice(window) for _ in range(rng.randint(0, 3))}, key=int)
    else:
        for i, node in enumerate(ids[1:], start=1):
            parents[node] = [ids[i - 1]] if rng.random() < 0.8 else [ids[rng.randrange(i)]]
    seconds = {n: round(rng.choice((rng.uniform(0.05, 2.0), rng.uniform(0.5, 12.0))), 2) for n in ids}
    failing: dict[str, frozenset[int]] = {}
    for node in ids:
        roll = rng.random()
        if roll < 0.15:
            failing[node] = frozenset({1})
        elif roll < 0.2:
            failing[node] = frozenset({1, 2})
        elif roll < 0.21:
            failing[node] = frozenset(range(1, retries + 2))  # every try fails: its children skip
    lanes: dict[str, str] = {}
    if rng.random() < 0.15:
        for node in ids:
            if rng.random() < 0.3:
                lanes[node] = rng.choice(("gpu", "db"))
    return SimPlan(parents, seconds, failing, lanes)


def random_case(seed: int, size: int | None = None) -> Case:
    rng = random.Random(seed)
    if size is None:
        roll = rng.random()
        size = (
            rng.randint(1, 12) if roll < 0.7 else rng.randint(13, 60) if roll < 0.97 else rng.randint(61, 160)
        )
    retries = rng.choice((0, 1, 2, 3))
    runs = 1 if rng.random() < 0.9 or size > 200 else rng.randint(2, 4)
    plans = [random_plan(rng, size, retries) for _ in range(runs)]

    def cap(least: int = 1) -> int:
        return max(least, rng.choice((1, 2, 3, 4, rng.randint(1, 32))))

    caps = Caps(
        task_cap=None if rng.random() < 0.2 else cap(),
        dag_cap=cap(),
        parallelism=cap(),
        pool=None if rng.random() < 0.5 else cap(),
        pool_counts_deferred=rng.random() < 0.3,
        lane_pools={"gpu": cap(), "db": cap()},
        max_tis_per_query=rng.choice((16, cap())),
        retries=retries,
        retry_delay=rng.choice((0.0, 1.0, 5.0, 10.0)),
    )
    # a cap shared by pooled lanes is at least 2 unless their deferrals are free (no task cap that can
    # fill, no pool counting deferred instances): at 1, a ready node of one lane can starve behind nodes
    # of another lane that wait for their parents and come back after each make-way
    # (test_waiting_simulation.py::test_lanes_sharing_one_slot_starve_only_when_they_make_way)
    free = deferral_is_free(caps.task_cap, size, caps.pool_counts_deferred)
    if any(p.lanes for p in plans) and not free:
        caps = replace(caps, dag_cap=max(2, caps.dag_cap), parallelism=max(2, caps.parallelism))
    costs = replace(
        Costs(),
        loop_sleep=rng.choice((0.1, 0.5, 1.0)),
        trigger_pickup=rng.choice((0.2, 1.0, 3.0)),
        cores=2.0 if rng.random() < 0.1 and size <= 60 else 0.0,
        triggerer_tick=rng.choice((0.0, 1.0)),
    )
    return Case(seed, plans, caps, costs, rng.random() < 0.8, rng.choice((0.0, 2.0, 10.0)))
