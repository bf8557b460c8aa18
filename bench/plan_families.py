"""Seeded families of plans that no bench script was tuned for, for the simulator and for real Airflow.

``generate(family, seed, size, cap)`` returns a :class:`Generated` plan: the bench's plan format (the
``{"goal", "nodes", "edges"}`` dict ``_planbench.py`` runs as a plan DAG and writes as a static DAG,
with each node's tool seconds beside it), its DAG cap and, for the ``lanes`` family, its pooled lanes;
:meth:`Generated.sim_plan` and :meth:`Generated.caps` are the same plan and caps as the simulator
(``bench/simulator``) runs them. Node ids are ``1..size`` in a topological order. The same
``(family, seed, size, cap)`` always gives the same plan.

Families (:data:`FAMILIES`):

- ``local``: random local dependencies, each node 0-3 parents among the 2-8 nodes just before it,
  tools 0.5-8 s (the plan of issue 42);
- ``fan``: fan-out / fan-in stages: a node fans out to 2-24 branches of 1-3 nodes each, which join in
  the next stage's node; tools 0.2-6 s;
- ``chains``: 2-6 long chains of long tools (5-30 s), each node's parent the node before it in its
  chain, a tenth of them with a second parent, the latest node of another chain;
- ``mixed``: random local dependencies over the 2-12 nodes before, tools log-uniform 0.1-30 s;
- ``lanes``: a ``local`` plan with about a third of its nodes in two pooled lanes (``gpu``, ``db``) of
  1-4 slots each (simulator only: the bench's plan DAG has one unpooled tool).

Sizes (when not given): log-uniform over 20-500 nodes; caps (when not given): one of 1, 2, 4, 8, 16,
32. :func:`sample` draws ``count`` plans across the families, sizes and caps from one seed.

Real Airflow, a family's plans side by side with their static DAGs::

    .venv/bin/python bench/plan_dags.py --family local chains --seed 1 2 --size 120 --cap 16 --db sqlite
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.simulator.model import Caps, SimPlan

FAMILIES = ("local", "fan", "chains", "mixed", "lanes")
CAPS = (1, 2, 4, 8, 16, 32)
SIZES = (20, 500)
LANES = ("gpu", "db")


@dataclass(frozen=True)
class Generated:
    """One generated plan: ``plan`` (bench format, every node calling ``work``), ``seconds`` (node →
    its tool's seconds), the DAG's ``cap`` (its ``max_active_tasks`` and the executor's parallelism),
    and for pooled nodes their ``lanes`` with each lane's pool ``lane_pools``."""

    family: str
    seed: int
    plan: dict[str, Any]
    seconds: dict[str, float]
    cap: int
    lanes: dict[str, str] = field(default_factory=dict)
    lane_pools: dict[str, int] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return len(self.plan["nodes"])

    @property
    def name(self) -> str:
        return f"{self.family}-s{self.seed}-n{self.size}-c{self.cap}"

    def parents(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {n["id"]: [] for n in self.plan["nodes"]}
        for edge in self.plan["edges"]:
            out[edge["to"]].append(edge["from"])
        return out

    def sim_plan(self) -> SimPlan:
        return SimPlan(self.parents(), dict(self.seconds), lanes=dict(self.lanes))

    def caps(self) -> Caps:
        """The bench's layout (``_planbench.plan_dag_source``): the DAG's ``max_active_tasks`` and the
        executor's parallelism ``cap``, the node task's own cap above both (it counts no deferred node
        the DAG's cap would not)."""
        return Caps(
            task_cap=max(self.cap, self.size),
            dag_cap=self.cap,
            parallelism=self.cap,
            lane_pools=dict(self.lane_pools),
        )

    def critical_path(self) -> tuple[float, list[str]]:
        """The longest sum of tool seconds along a chain of the plan, and the chain."""
        parents = self.parents()
        finish: dict[str, float] = {}
        via: dict[str, str | None] = {}
        for node in parents:  # ids are in topological order
            best = max(parents[node], key=lambda p: finish[p], default=None)
            finish[node] = (finish[best] if best else 0.0) + self.seconds[node]
            via[node] = best
        end = max(finish, key=lambda n: finish[n])
        chain = [end]
        while via[chain[-1]] is not None:
            chain.append(via[chain[-1]])  # type: ignore[arg-type]
        return finish[end], chain[::-1]


# ---------------------------------------------------------------------------------------------- families

Parents = dict[str, list[str]]


def _ids(size: int) -> list[str]:
    return [str(i) for i in range(1, size + 1)]


def _local(rng: random.Random, size: int, widest: int) -> Parents:
    ids = _ids(size)
    parents: Parents = {}
    for i, node in enumerate(ids):
        window = ids[max(0, i - rng.randint(2, widest)) : i]
        count = min(len(window), rng.randint(0, 3))
        parents[node] = sorted(rng.sample(window, count), key=int)
    return parents


def local(rng: random.Random, size: int) -> tuple[Parents, dict[str, float]]:
    parents = _local(rng, size, 8)
    return parents, {n: round(rng.uniform(0.5, 8.0), 2) for n in parents}


def fan(rng: random.Random, size: int) -> tuple[Parents, dict[str, float]]:
    ids = _ids(size)
    parents: Parents = {ids[0]: []}
    i, source = 1, ids[0]
    while i < size:
        width = rng.randint(2, 24)
        tails = []
        for _ in range(width):
            previous = source
            for _ in range(rng.randint(1, 3)):
                if i >= size:
                    break
                parents[ids[i]] = [previous]
                previous, i = ids[i], i + 1
            if previous != source:
                tails.append(previous)
        if i >= size:
            break
        parents[ids[i]] = sorted(tails, key=int)
        source, i = ids[i], i + 1
    return parents, {n: round(rng.uniform(0.2, 6.0), 2) for n in parents}


def chains(rng: random.Random, size: int) -> tuple[Parents, dict[str, float]]:
    count = rng.randint(2, 6)
    ids = _ids(size)
    latest: list[str | None] = [None] * count
    parents: Parents = {}
    for node in ids:
        chain = rng.randrange(count)
        own = latest[chain]
        chosen = [own] if own is not None else []
        others = [n for c, n in enumerate(latest) if c != chain and n is not None]
        if others and rng.random() < 0.1:
            chosen.append(rng.choice(others))
        parents[node] = sorted(chosen, key=int)  # type: ignore[arg-type]
        latest[chain] = node
    return parents, {n: round(rng.uniform(5.0, 30.0), 2) for n in parents}


def mixed(rng: random.Random, size: int) -> tuple[Parents, dict[str, float]]:
    parents = _local(rng, size, 12)
    low, high = math.log(0.1), math.log(30.0)
    return parents, {n: round(math.exp(rng.uniform(low, high)), 2) for n in parents}


def lanes(rng: random.Random, size: int) -> tuple[Parents, dict[str, float]]:
    return local(rng, size)


BUILDERS: dict[str, Callable[[random.Random, int], tuple[Parents, dict[str, float]]]] = {
    "local": local,
    "fan": fan,
    "chains": chains,
    "mixed": mixed,
    "lanes": lanes,
}


def generate(family: str, seed: int, size: int | None = None, cap: int | None = None) -> Generated:
    """Plan ``seed`` of ``family`` (see the module docstring); ``size`` nodes and DAG cap ``cap``, or
    drawn from the seed when not given. The size and cap are drawn apart from the plan's shape, so a plan
    is the same whether they were drawn or given: its name (``mixed-s2-n80-c4``) reproduces it."""
    if family not in BUILDERS:
        raise ValueError(f"family must be one of {FAMILIES}, not {family!r}")
    rng = random.Random(f"{family}:{seed}")
    if size is None:
        drawn = random.Random(f"{family}:{seed}").uniform(math.log(SIZES[0]), math.log(SIZES[1]))
        size = round(math.exp(drawn))
    if cap is None:
        cap = random.Random(f"{family}:{seed}:cap").choice(CAPS)
    if size < 1 or cap < 1:
        raise ValueError(f"size and cap must be >= 1, got {size}, {cap}")
    parents, seconds = BUILDERS[family](rng, size)
    lanes_of: dict[str, str] = {}
    pools: dict[str, int] = {}
    if family == "lanes":
        lanes_of = {n: rng.choice(LANES) for n in parents if rng.random() < 0.35}
        pools = {lane: rng.randint(1, 4) for lane in LANES}
    nodes = [
        {"id": n, "action": f"{family} {n} ({seconds[n]:g} s)", "tool": "work", "params": {}} for n in parents
    ]
    edges = [{"from": p, "to": n} for n, ps in parents.items() for p in ps]
    plan = {"goal": f"{family} plan, seed {seed}, {size} nodes", "nodes": nodes, "edges": edges}
    return Generated(family, seed, plan, seconds, cap, lanes_of, pools)


def sample(count: int, seed: int = 0, families: tuple[str, ...] = FAMILIES) -> list[Generated]:
    """``count`` plans, the families in turn, each with its own seed, size and cap drawn from ``seed``;
    every cap of :data:`CAPS` is drawn for every family when ``count`` allows."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        family = families[i % len(families)]
        cap = CAPS[(i // len(families)) % len(CAPS)]
        out.append(generate(family, rng.randrange(10**6), cap=cap))
    return out
