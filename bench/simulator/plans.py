"""The plans ``bench/`` runs on a real Airflow, as the simulator runs them, with the makespans measured
there (``bench/results/``)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.simulator.model import Caps, SimPlan

BENCH = Path(__file__).resolve().parents[1]
#: the caps of every bench run (``bench/_planbench.py``'s ``plan_dag_source``, ``--cap 16``): the DAG's
#: ``max_active_tasks`` and the executor's parallelism 16, the node task's ``max_active_nodes`` above it
BENCH_CAP = 16
#: where the measured figures come from
SOURCE = "bench/results/2026-11-30-*.json (09:30-10:30), code 681bc3f (500 nodes: a88b08e)"


@dataclass(frozen=True)
class BenchPlan:
    """A plan of ``bench/``, the caps it ran with, and its latest measured makespans (seconds; None: not
    measured), plan DAG and static DAG, on PostgreSQL and SQLite."""

    name: str
    plan: SimPlan
    caps: Caps
    plan_postgres: float
    plan_sqlite: float
    static_postgres: float | None = None
    static_sqlite: float | None = None


def _questions() -> Any:
    """The bench questions' modules (they import their harness as a top-level module)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    import _planbench
    import depth
    import seed
    import unbalanced
    import wide

    return _planbench, unbalanced, seed, depth, wide


def sim_plan(plan: dict[str, Any], seconds: dict[str, float]) -> SimPlan:
    parents: dict[str, list[str]] = {n["id"]: [] for n in plan["nodes"]}
    for edge in plan.get("edges", []):
        parents[edge["to"]].append(edge["from"])
    return SimPlan(parents, dict(seconds))


def bench_plans() -> list[BenchPlan]:
    """The unbalanced plan at scale 1 and 2, the seed plan, the chain of 30, the 12-layer plan and the
    500-node plan, built by the bench scripts' own builders."""
    _, unbalanced, seed, depth, wide = _questions()
    caps = Caps(task_cap=200, dag_cap=BENCH_CAP, parallelism=BENCH_CAP)
    q = unbalanced.Unbalanced()
    lopsided = sim_plan(q.plan, q.seconds)
    s = seed.Seed()
    shapes = depth.Depth().shapes()
    chain = sim_plan(*shapes["chain of 30"])
    layers = sim_plan(*shapes["12 layers x 3"])
    w = wide.Wide()
    big = sim_plan(w.plan, w.seconds)
    return [
        BenchPlan("unbalanced 60, x1", lopsided, caps, 38.6, 39.6, 35.6, 35.2),
        BenchPlan("unbalanced 60, x2", lopsided.scaled(2.0), caps, 71.6, 69.4, 68.0, 67.0),
        BenchPlan("seed 4-1-1 x 5 s", sim_plan(s.plan, s.seconds), caps, 16.9, 16.8, 16.0, 15.9),
        BenchPlan("chain of 30 x 1 s", chain, caps, 36.7, 35.7, 38.8, 36.3),
        BenchPlan("12 layers x 3, 1 s", layers, caps, 16.7, 16.7, 16.6, 17.1),
        BenchPlan("500 nodes x 0.5 s", big, Caps(task_cap=500, dag_cap=16, parallelism=16), 354.3, 423.2),
    ]
