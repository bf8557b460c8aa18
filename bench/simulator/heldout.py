"""How well the simulator predicts plans its costs were not fitted to.

Leave one plan out: for each bench plan (:func:`~.plans.bench_plans`), the costs
(:class:`~.model.Costs`) are fitted (:func:`~.calibrate.calibrate`, the best of three starts,
:data:`STARTS`) to the measured figures of the other plans, and the held-out plan's figures (plan DAG,
and static DAG where measured) are predicted. Generated plans measured on a real Airflow (``bench/plan_dags.py
--family ... --json FILE``: plan DAG and static DAG side by side) are predicted too, with
:data:`~.model.CALIBRATED` (fitted to every bench figure, none of them generated); where the run also
measured the plan DAG started on the triggerer (``--start-on-triggerer``), that DAG is predicted with the
simulator's model of it (:data:`~.families.STARTED_AS_BUILT`, or for a record measured by an earlier
build that build's, :data:`STARTED_BUILDS`) in a row of its own. Reported per plan:
the makespan error (simulated / measured - 1), plan DAG and static DAG, and the error of the
plan/static ratio (simulated ratio - measured ratio). Targets (issue 42): makespan within 5 %, ratio
within 0.03.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from airflow_plan_provider.plan.waiting import WaitingPolicy
from bench.plan_families import generate
from bench.simulator.calibrate import RANGES, calibrate, figures
from bench.simulator.engine import simulate
from bench.simulator.families import (
    MECHANISMS,
    STARTED_AS_BUILT,
    STARTED_NEAR_ALWAYS,
    STARTED_READY_WITHOUT_SPARE,
)
from bench.simulator.model import CALIBRATED, Costs
from bench.simulator.plans import bench_plans

#: where the fits start (none taken from a fit to a held-out figure): the model's neutral costs, and
#: every fitted cost at the low end and at the middle of its range (:data:`~.calibrate.RANGES`)
STARTS = (
    Costs(cores=2.0),
    replace(Costs(cores=2.0), **{name: low for name, (low, _) in RANGES.items()}),
    replace(Costs(cores=2.0), **{name: (low + high) / 2 for name, (low, high) in RANGES.items()}),
)


def held_out_costs(plan: str, rounds: int = 3) -> Costs:
    """The costs fitted to every bench figure but ``plan``'s (plan DAG and static DAG): the best fit to
    those figures from each of :data:`STARTS`."""
    fits = [calibrate(start, rounds=rounds, leave_out=[plan, f"{plan} (static)"]) for start in STARTS]
    return min(fits, key=lambda fit: fit[1])[0]


def error_row(name: str, sim: tuple[float, float], real: tuple[float, float]) -> dict[str, Any]:
    """Errors of one plan: ``sim`` and ``real`` are (plan DAG, static DAG) makespans."""
    return {
        "plan": name,
        "sim": [round(sim[0], 1), round(sim[1], 1)],
        "real": [round(real[0], 1), round(real[1], 1)],
        "plan_error": round(sim[0] / real[0] - 1, 3),
        "static_error": round(sim[1] / real[1] - 1, 3),
        "ratio_error": round(sim[0] / sim[1] - real[0] / real[1], 3),
    }


def bench_errors() -> list[dict[str, Any]]:
    """Each bench plan predicted by the costs fitted to the others."""
    out = []
    for bench in bench_plans():
        simulated = figures(held_out_costs(bench.name), [bench])
        plan = simulated[bench.name]
        static = simulated.get(f"{bench.name} (static)")
        if static is None:
            out.append(
                {
                    "plan": bench.name,
                    "sim": [round(plan[0], 1), None],
                    "real": [round(plan[1], 1), None],
                    "plan_error": round(plan[0] / plan[1] - 1, 3),
                    "static_error": None,
                    "ratio_error": None,
                }
            )
            continue
        out.append(error_row(bench.name, (plan[0], static[0]), (plan[1], static[1])))
    return out


#: a generated plan measured: (database, plan's name, plan DAG makespan, static DAG makespan, makespan of
#: the plan DAG started on the triggerer or None where not measured, and the mechanism of
#: :data:`~.families.MECHANISMS` that models the build it was started with)
Measured = tuple[str, str, float, float, float | None, str]

#: the start on the triggerer's builds, each with the date (ISO, UTC) from which records measured it:
#: every node came near its parents (:data:`~.families.STARTED_NEAR_ALWAYS`); then near only where the run
#: has slots to spare (``plan.waiting.slots_to_spare``), elsewhere ready; then elsewhere near only while
#: the run leaves a slot idle (``plan.waiting.leaves_a_slot_idle``)
STARTED_BUILDS = (
    ("", STARTED_NEAR_ALWAYS),
    ("2026-12-06T23:00", STARTED_READY_WITHOUT_SPARE),
    ("2026-12-07T03:00", STARTED_AS_BUILT),
)


def started_mechanism(date: str | None) -> str:
    """The mechanism that models the start on the triggerer of a measurement made at ``date`` (ISO; None:
    the current build)."""
    if date is None:
        return STARTED_AS_BUILT
    return [mechanism for since, mechanism in STARTED_BUILDS if since <= date][-1]


def measured_families(paths: Iterable[Path]) -> list[Measured]:
    """Each generated plan (:data:`Measured`) in ``plan_dags.py --json`` files, or in the ``bench/results/``
    records ``--record`` wrote from them (figures ``<family>_s<seed>_n<size>_c<cap>_<database>_plan_s``,
    ``..._static_s`` and ``..._started_s``)."""
    out: list[Measured] = []
    for path in paths:
        saved = json.loads(path.read_text())
        mechanism = started_mechanism(saved.get("date"))
        if "figures" in saved:
            out += _recorded_families(saved["figures"], mechanism)
            continue
        for database, by_plan in saved["results"].get("families", {}).items():
            if "error" in by_plan:
                continue
            for name, f in by_plan.items():
                started = f["started"]["makespan"] if "started" in f else None
                plan, static = f["plan"]["makespan"], f["static"]["makespan"]
                out.append((database, name, plan, static, started, mechanism))
    return out


def _recorded_families(figures: dict[str, Any], mechanism: str) -> list[Measured]:
    """The plans of a ``bench/results/`` record of generated plans (see :func:`measured_families`)."""
    out: list[Measured] = []
    for key, plan in figures.items():
        if not key.endswith("_plan_s"):
            continue
        stem = key.removesuffix("_plan_s")
        name, _, database = stem.rpartition("_")
        static = figures.get(f"{stem}_static_s")
        started = figures.get(f"{stem}_started_s")
        if static is not None:
            out.append(
                (
                    database,
                    name.replace("_", "-"),
                    float(plan),
                    float(static),
                    None if started is None else float(started),
                    mechanism,
                )
            )
    return out


#: the random orders of a static DAG's tasks of equal weight (``Simulation(tie_order=...)``) over which
#: :func:`family_errors` gives the range of the static DAG's simulated makespan
TIE_ORDERS = range(8)


def family_errors(costs: Costs, measured: Iterable[Measured]) -> list[dict[str, Any]]:
    """Each measured generated plan's errors under ``costs`` (its name gives family, seed, size, cap); a
    plan measured started on the triggerer too gets a second row, ``(<database>, started)``. A row also
    gives ``static_ties``: the least and the most the static DAG takes in the simulator over
    :data:`TIE_ORDERS` (the order in which the scheduler takes tasks of equal weight, the database's)."""
    out = []
    policy = WaitingPolicy()
    for database, name, plan_real, static_real, started_real, mechanism in dict.fromkeys(measured):
        family, seed, size, cap = name.split("-")
        generated = generate(family, int(seed[1:]), int(size[1:]), int(cap[1:]))
        sim_plan, caps = generated.sim_plan(), generated.caps()
        static_sim = simulate(sim_plan, policy, caps, costs, static=True).makespan
        tied = [
            simulate(sim_plan, policy, caps, costs, static=True, tie_order=order).makespan
            for order in TIE_ORDERS
        ]
        ties = [round(min(tied) / static_real - 1, 3), round(max(tied) / static_real - 1, 3)]
        plan_sim = simulate(sim_plan, policy, caps, costs).makespan
        row = error_row(f"{name} ({database})", (plan_sim, static_sim), (plan_real, static_real))
        out.append(row | {"static_ties": ties})
        if started_real is not None:
            started_sim = simulate(sim_plan, policy, caps, costs, **MECHANISMS[mechanism][2]).makespan
            row = error_row(
                f"{name} ({database}, started)", (started_sim, static_sim), (started_real, static_real)
            )
            out.append(row | {"static_ties": ties})
    return out


def summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    makespans = [abs(r[k]) for r in rows for k in ("plan_error", "static_error") if r[k] is not None]
    ratios = [abs(r["ratio_error"]) for r in rows if r["ratio_error"] is not None]
    out = {}
    if makespans:
        out["worst_makespan_error"] = max(makespans)
        out["median_makespan_error"] = sorted(makespans)[len(makespans) // 2]
    if ratios:
        out["worst_ratio_error"] = max(ratios)
    return out


def report(measured_paths: Iterable[Path] = ()) -> dict[str, list[dict[str, Any]]]:
    """The bench plans left out one at a time, and the measured generated plans under CALIBRATED."""
    out = {"bench plans, each left out of the fit": bench_errors()}
    measured = measured_families(measured_paths)
    if measured:
        out["generated plans measured, CALIBRATED costs"] = family_errors(CALIBRATED, measured)
    return out


def _pct(value: float | None, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>+{width}.1%}"


def print_report(result: dict[str, list[dict[str, Any]]]) -> None:
    for group, rows in result.items():
        print(f"\n{group}")
        print(
            f"  {'plan':<36}{'sim plan / static':>18}{'real plan / static':>19}"
            f"{'err plan':>9}{'err static':>11}{'err ratio':>10}  static, tie orders"
        )
        for r in rows:
            ties = r.get("static_ties")
            tied = "" if ties is None else f"  {ties[0]:+.1%} .. {ties[1]:+.1%}"
            sim_static = "-" if r["sim"][1] is None else f"{r['sim'][1]:.1f}"
            real_static = "-" if r["real"][1] is None else f"{r['real'][1]:.1f}"
            ratio = "-" if r["ratio_error"] is None else f"{r['ratio_error']:+.3f}"
            print(
                f"  {r['plan']:<36}{r['sim'][0]:>9.1f} / {sim_static:<6}{r['real'][0]:>10.1f}"
                f" / {real_static:<6}{_pct(r['plan_error'], 9)}{_pct(r['static_error'], 11)}{ratio:>10}"
                + tied
            )
        s = summary(rows)
        print(
            f"  worst |makespan error| {s.get('worst_makespan_error', 0):.1%}"
            f" (median {s.get('median_makespan_error', 0):.1%}),"
            f" worst |ratio error| {s.get('worst_ratio_error', 0):.3f}"
        )
