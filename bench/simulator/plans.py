"""The plans ``bench/`` runs on a real Airflow, as the simulator runs them, with the makespans last
measured there (the newest record of each in ``bench/results/``)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.simulator.model import Caps, SimPlan

BENCH = Path(__file__).resolve().parents[1]
#: the caps of every bench run (``bench/_planbench.py``'s ``plan_dag_source``, ``--cap 16``): the DAG's
#: ``max_active_tasks`` and the executor's parallelism 16, the node task's ``max_active_nodes`` above it
BENCH_CAP = 16
#: the database the bench plans' figures (:data:`FIGURES`) are measured on
BENCH_DATABASE = "sqlite"

#: each bench plan's figures: (its question in ``bench/results/``, the figure of the plan DAG's makespan,
#: the static DAG's), both on SQLite; the newest record of the question gives them
FIGURES: dict[str, tuple[str, str, str]] = {
    "unbalanced 60, x1": ("unbalanced-60", "plan_s", "static_s"),
    "unbalanced 60, x2": ("unbalanced-60", "plan_s_scale_2", "static_s_scale_2"),
    "seed 4-1-1 x 5 s": ("seed", "plan_s", "static_s"),
    "chain of 30 x 1 s": ("depth", "plan_s_chain", "static_s_chain"),
    "12 layers x 3, 1 s": ("depth", "plan_s_layers", "static_s_layers"),
    "500 nodes x 0.5 s": ("wide-500", "plan_s", "static_s"),
}


@dataclass(frozen=True)
class BenchPlan:
    """A plan ``bench/`` ran, the caps it ran with, and its makespans measured on SQLite (seconds), plan
    DAG and static DAG, with the record they come from; where the plan DAG started on the triggerer was
    measured too, ``started_s`` and the simulator's options that model that build (``started``)."""

    name: str
    plan: SimPlan
    caps: Caps
    plan_s: float
    static_s: float
    source: str
    started_s: float | None = None
    started: Mapping[str, Any] = field(default_factory=dict)


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


def measured(name: str) -> tuple[float, float, str]:
    """A bench plan's makespans (plan DAG, static DAG) from the newest record of its question
    (:data:`FIGURES`), and that record's date and commit."""
    from bench.results import load, newest

    question, plan_key, static_key = FIGURES[name]
    record = next(r for r in newest(load()) if r["question"] == question)
    figures = record["figures"]
    return figures[plan_key], figures[static_key], f"{question} {record['date']} {record['commit'] or '-'}"


def bench_plans() -> list[BenchPlan]:
    """The unbalanced plan at scale 1 and 2, the seed plan, the chain of 30, the 12-layer plan and the
    500-node plan, built by the bench scripts' own builders, with their newest measured makespans."""
    _, unbalanced, seed, depth, wide = _questions()
    caps = Caps(task_cap=200, dag_cap=BENCH_CAP, parallelism=BENCH_CAP)
    q = unbalanced.Unbalanced()
    lopsided = sim_plan(q.plan, q.seconds)
    s = seed.Seed()
    shapes = depth.Depth().shapes()
    w = wide.Wide()
    plans = {
        "unbalanced 60, x1": (lopsided, caps),
        "unbalanced 60, x2": (lopsided.scaled(2.0), caps),
        "seed 4-1-1 x 5 s": (sim_plan(s.plan, s.seconds), caps),
        "chain of 30 x 1 s": (sim_plan(*shapes["chain of 30"]), caps),
        "12 layers x 3, 1 s": (sim_plan(*shapes["12 layers x 3"]), caps),
        "500 nodes x 0.5 s": (sim_plan(w.plan, w.seconds), Caps(task_cap=500, dag_cap=16, parallelism=16)),
    }
    return [BenchPlan(name, plan, caps, *measured(name)) for name, (plan, caps) in plans.items()]
