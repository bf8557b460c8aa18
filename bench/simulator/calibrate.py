"""Fit the simulator's costs (:class:`~bench.simulator.model.Costs`) to the makespans ``bench/`` measured
on a real Airflow: coordinate descent over the costs, each within a plausible range, minimising the
largest |log(simulated / measured)| over every measured figure (plan DAGs and static DAGs), then the
sum of their squares."""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import replace

from airflow_plan_provider.plan.waiting import WaitingPolicy
from bench.simulator.engine import simulate
from bench.simulator.model import Costs
from bench.simulator.plans import BenchPlan, bench_plans

#: what a cost may be: (lowest, highest); seconds or CPU-seconds
RANGES: dict[str, tuple[float, float]] = {
    "loop_sleep": (0.02, 1.0),
    "loop_cpu": (0.005, 0.3),
    "loop_ti_cpu": (0.0, 0.002),
    "queue_latency": (0.02, 0.6),
    "start_cpu": (0.02, 1.5),
    "start_node_cpu": (0.0, 0.004),
    "read_cpu": (0.002, 0.1),
    "read_row_cpu": (0.0, 0.001),
    "end_cpu": (0.02, 0.6),
    "trigger_pickup": (0.2, 3.0),
    "plan_task": (0.15, 0.35),
    "finalize_task": (0.1, 0.5),
    "static_start_factor": (0.2, 4.0),
    "exit_hold": (0.0, 1.5),
}


def figures(
    costs: Costs, plans: list[BenchPlan] | None = None, policy: WaitingPolicy | None = None
) -> dict[str, tuple[float, float]]:
    """Figure name → (simulated, measured on SQLite) makespan: plan DAGs, static DAGs and plan DAGs
    started on the triggerer where measured; of ``plans``, by default the bench plans."""
    policy = policy or WaitingPolicy()
    out = {}
    for bench in bench_plans() if plans is None else plans:
        out[bench.name] = (simulate(bench.plan, policy, bench.caps, costs).makespan, bench.plan_s)
        static = simulate(bench.plan, policy, bench.caps, costs, static=True).makespan
        out[f"{bench.name} (static)"] = (static, bench.static_s)
        if bench.started_s is not None:
            started = simulate(bench.plan, policy, bench.caps, costs, **bench.started).makespan
            out[f"{bench.name} (started)"] = (started, bench.started_s)
    return out


def misfit(
    costs: Costs, plans: list[BenchPlan], leave_out: str | Collection[str] | None = None
) -> tuple[float, float]:
    left = {leave_out} if isinstance(leave_out, str) else set(leave_out or ())
    logs = [math.log(sim / real) for name, (sim, real) in figures(costs, plans).items() if name not in left]
    return max(map(abs, logs)), sum(x * x for x in logs)


def calibrate(
    start: Costs,
    rounds: int = 3,
    steps: int = 7,
    leave_out: str | Collection[str] | None = None,
    plans: list[BenchPlan] | None = None,
) -> tuple[Costs, tuple[float, float]]:
    """The costs near ``start`` that fit the measured figures of ``plans`` (by default the bench plans)
    best (see the module docstring), all of them or all but the figures ``leave_out`` (one name or
    several: to see how well the model predicts figures it was not fitted on)."""
    plans = bench_plans() if plans is None else plans
    best, score = start, misfit(start, plans, leave_out)
    for round_ in range(rounds):
        for name, (low, high) in RANGES.items():
            here = getattr(best, name)
            spread = (high - low) / (2 ** (round_ + 1))
            for i in range(steps):
                value = min(high, max(low, here - spread + 2 * spread * i / (steps - 1)))
                trial = replace(best, **{name: round(value, 6)})
                trial_score = misfit(trial, plans, leave_out)
                if trial_score < score:
                    best, score = trial, trial_score
    return best, score
