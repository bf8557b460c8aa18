"""Try the waiting policy's numbers one at a time on the bench plans (and three variants: the unbalanced
plan with parents that fail their first try, the unbalanced plan with its node task capped at 8, the
chain of 30 without checkpoints), each plan with its tools' durations jittered by ±10 % over a few
seeds so that no number wins by the luck of one phase.

A value is a *clear gain* when the mean makespan over the plans improves by at least ``GAIN``, no plan
loses more than ``LOSS``, and no try failed because a rescheduled instance came back before the
executor's report of its previous exit (apache/airflow#71172; the model puts that report
``Costs.report_latency`` after the exit, a figure from the policy's docstring, not a measured one)."""

from __future__ import annotations

import random
from dataclasses import replace
from statistics import mean
from typing import Any

from airflow_plan_provider.plan.waiting import WaitingPolicy
from bench.simulator.engine import simulate
from bench.simulator.model import CALIBRATED, Caps, SimPlan
from bench.simulator.plans import bench_plans

#: the values tried for each number (the default is always among them)
VALUES: dict[str, tuple[float, ...]] = {
    "slot_wait": (5.0, 10.0, 20.0, 30.0, 60.0, 120.0),
    "queued_grace": (2.0, 5.0, 10.0, 20.0),
    "poll_near": (0.1, 0.2, 0.5),
    "checkpoint_poll": (0.05, 0.1, 0.2, 0.5, 1.0),
    "poll_far": (0.5, 1.0, 2.0),
    "poll_farthest": (2.0, 4.0, 8.0),
    "state_rows_per_second": (1000.0, 5000.0, 20000.0),
    "read_all_states_up_to": (50, 100, 600),
    "make_way_first": (1.0, 2.0, 5.0, 10.0),
    "make_way_max": (10.0, 20.0, 40.0),
    "trigger_poll": (0.1, 0.25, 0.5, 1.0, 2.0),
}
SEEDS = (1, 2, 3)
#: a gain counts when the mean makespan over the plans improves by this much and no plan loses more
#: than LOSS: the simulator reproduces the measured makespans within a few percent, not better
GAIN, LOSS = 0.03, 0.01


def jittered(plan: SimPlan, seed: int) -> SimPlan:
    rng = random.Random(seed)
    seconds = {n: s * rng.uniform(0.9, 1.1) for n, s in plan.seconds.items()}
    return SimPlan(plan.parents, seconds, plan.failing_tries, plan.lanes)


def sweep_plans() -> list[tuple[str, SimPlan, Caps, bool]]:
    """(name, plan, caps, whether the DAG keeps checkpoints)."""
    plans = [(b.name, b.plan, b.caps, True) for b in bench_plans()]
    lopsided, caps = plans[0][1], plans[0][2]
    rng = random.Random(7)
    failing = {n: frozenset({1}) for n in lopsided.parents if rng.random() < 0.2}
    retrying = SimPlan(lopsided.parents, lopsided.seconds, failing)
    plans.append(("unbalanced x1, 20 % retry", retrying, replace(caps, retry_delay=5.0), True))
    plans.append(("unbalanced x1, task cap 8", lopsided, replace(caps, task_cap=8), True))
    chain = next(b for b in bench_plans() if b.name.startswith("chain"))
    plans.append(("chain of 30, no checkpoints", chain.plan, chain.caps, False))
    return plans


#: plan → (mean makespan, mean slot-seconds of waiting nodes, node processes, tries failed by the race)
Figures = dict[str, tuple[float, float, float, int]]


def makespans(policy: WaitingPolicy) -> Figures:
    """Each sweep plan's figures, means over the jitter seeds."""
    out = {}
    for name, plan, caps, checkpoints in sweep_plans():
        runs = [
            simulate(jittered(plan, seed), policy, caps, CALIBRATED, checkpoints=checkpoints)
            for seed in SEEDS
        ]
        if any(run.deadlock for run in runs):
            raise AssertionError(f"{name}: {[run.deadlock for run in runs]}")
        out[name] = (
            mean(r.makespan for r in runs),
            mean(r.wasted for r in runs),
            mean(r.processes for r in runs),
            sum(r.failed_by_race for r in runs),
        )
    return out


def sweep() -> dict[str, dict[float, Figures]]:
    default = WaitingPolicy()
    base = makespans(default)
    out: dict[str, dict[float, Figures]] = {}
    for name, values in VALUES.items():
        out[name] = {}
        for value in values:
            if value == getattr(default, name):
                out[name][value] = base
                continue
            changes: dict[str, Any] = {name: value}
            try:
                policy = replace(default, **changes)
            except ValueError:
                continue
            out[name][value] = makespans(policy)
    return out


def print_sweep() -> None:
    results = sweep()
    default = WaitingPolicy()
    names = [name for name, _, _, _ in sweep_plans()]
    print("Makespan relative to the defaults, per plan (mean of 3 jittered runs each); the plans' waiting")
    print("slot-seconds, node processes and tries failed by the reschedule race, summed")
    print("plans:" + "".join(f"  {i}: {n}" for i, n in enumerate(names, start=1)))
    print(
        f"{'number':<24}{'value':>8} |"
        + "".join(f"{i:>7}" for i in range(1, len(names) + 1))
        + f" | {'mean':>6}{'wait':>7}{'procs':>7}{'race':>5}"
    )
    for name, by_value in results.items():
        base = by_value[getattr(default, name)]
        for value, figures in by_value.items():
            ratios = [figures[n][0] / base[n][0] for n in names]
            wait, procs = sum(figures[n][1] for n in names), sum(figures[n][2] for n in names)
            races = sum(figures[n][3] for n in names)
            mark = " *" if value == getattr(default, name) else ""
            clear = mean(ratios) <= 1 - GAIN and max(ratios) <= 1 + LOSS and not races
            print(
                f"{name:<24}{value:>8g} |"
                + "".join(f"{r:>7.3f}" for r in ratios)
                + f" | {mean(ratios):>6.3f}{wait:>7.0f}{procs:>7.0f}{races:>5}{mark}"
                + ("  clear gain" if clear else "")
            )
    print(f"* the default; clear gain: mean ≤ {1 - GAIN:g}, no plan above {1 + LOSS:g}, no race failure")
