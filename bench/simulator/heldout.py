"""How well the simulator predicts plans its costs were not fitted to.

The costs are fitted (:func:`~.calibrate.calibrate`, from :data:`~.model.CALIBRATED`) to the newest
SQLite figures of the bench plans (:func:`~.plans.bench_plans`) and of a few generated plans
(:data:`TRAINING`), and every other generated plan measured on a real Airflow (``bench/plan_dags.py
--family ... --json FILE``, or the ``bench/results/`` records it wrote: plan DAG and static DAG side by
side) is predicted with them; so is every generated plan with the shipped :data:`~.model.CALIBRATED`.
Where the run also measured the plan DAG started on the triggerer (``--start-on-triggerer``), that DAG
is predicted with the simulator's model of it (:data:`~.families.STARTED_AS_BUILT`, or for a record
measured by an earlier build that build's, :data:`STARTED_BUILDS`) in a row of its own. Reported per
plan: the makespan error (simulated / measured - 1), plan DAG and static DAG, the error of the
plan/static ratio (simulated ratio - measured ratio), and the range of the static DAG's error over
random orders of its tasks of equal weight (:data:`TIE_ORDERS`; the model's own order is the one
Airflow created their instances in). Targets (issue 42): makespan within 5 %,
ratio within 0.03.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from airflow_plan_provider.plan.waiting import WaitingPolicy
from bench.plan_families import generate
from bench.simulator.calibrate import calibrate, figures
from bench.simulator.engine import simulate
from bench.simulator.families import (
    MECHANISMS,
    STARTED_AS_BUILT,
    STARTED_NEAR_ALWAYS,
    STARTED_READY_WITHOUT_SPARE,
)
from bench.simulator.model import CALIBRATED, Costs
from bench.simulator.plans import BENCH, BENCH_DATABASE, BenchPlan, bench_plans

RESULTS = BENCH / "results"


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


#: the generated plans whose measurements the costs (:data:`~.model.CALIBRATED`) are fitted to on each
#: database (beside the bench plans on SQLite), each with its plan DAG started on the triggerer: one plan
#: of the local family at a cap of 4, two of the fan family at caps of 8 and 16. Every other measured plan
#: is held out
TRAINING = ("local-s1-n120-c4", "fan-s2-n80-c8", "fan-s1-n200-c16")
#: the records the measurements of the generated plans are read from
RECORDS = "*-families-airflow*.json"


def generated_bench_plan(row: Measured) -> BenchPlan:
    """A measured generated plan as the calibration takes it."""
    database, name, plan_real, static_real, started_real, mechanism = row
    family, seed, size, cap = name.split("-")
    generated = generate(family, int(seed[1:]), int(size[1:]), int(cap[1:]))
    started = MECHANISMS[mechanism][2] if started_real is not None else {}
    return BenchPlan(
        name, generated.sim_plan(), generated.caps(), plan_real, static_real, database, started_real, started
    )


def fitting_plans(paths: Iterable[Path] | None = None, database: str = BENCH_DATABASE) -> list[BenchPlan]:
    """The plans the costs of ``database`` are fitted to: the :data:`TRAINING` plans as the newest of
    ``paths`` (by default :data:`RECORDS` in ``bench/results/``) measured them there, after the bench plans
    where ``database`` is the one they are measured on."""
    paths = sorted(RESULTS.glob(RECORDS)) if paths is None else paths
    newest = {row[1]: row for row in measured_families(paths) if row[0] == database and row[1] in TRAINING}
    missing = set(TRAINING) - set(newest)
    if missing:
        raise ValueError(f"no {database} measurement of the training plans {sorted(missing)} in the records")
    bench = bench_plans() if database == BENCH_DATABASE else []
    return bench + [generated_bench_plan(newest[name]) for name in TRAINING]


def family_errors(costs: Costs, measured: Iterable[Measured]) -> list[dict[str, Any]]:
    """Each measured generated plan's errors under ``costs`` (its name gives family, seed, size, cap); a
    plan measured started on the triggerer too gets a second row, ``(<database>, started)``. A row also
    gives ``static_ties``: the least and the most the static DAG takes in the simulator over
    :data:`TIE_ORDERS` (random orders in which the scheduler could take tasks of equal weight)."""
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


def repeatability(measured: Iterable[Measured]) -> list[dict[str, Any]]:
    """How far apart the measurements of one static DAG are, where a database measured a plan's static
    DAG more than once (its code is the same in every record): ``spread``, the largest over the least
    makespan, less 1. A prediction cannot be checked closer than the measurements agree."""
    by_plan: dict[tuple[str, str], set[float]] = {}
    for database, name, _, static_real, _, _ in measured:
        by_plan.setdefault((database, name), set()).add(static_real)
    return [
        {
            "plan": f"{name} ({database}, static)",
            "runs": len(seconds),
            "spread": round(max(seconds) / min(seconds) - 1, 3),
        }
        for (database, name), seconds in by_plan.items()
        if len(seconds) > 1
    ]


def spread_summary(spreads: list[dict[str, Any]]) -> dict[str, Any]:
    """The widest and the median spread of :func:`repeatability`'s rows (empty: none measured twice)."""
    if not spreads:
        return {}
    worst = max(spreads, key=lambda r: r["spread"])
    return {
        "worst_static_spread": worst["spread"],
        "worst_static_spread_plan": worst["plan"],
        "worst_static_spread_runs": worst["runs"],
        "median_static_spread": sorted(r["spread"] for r in spreads)[len(spreads) // 2],
        "static_dags_measured_again": len(spreads),
    }


def report(measured: list[Measured]) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Costs]]:
    """The ``measured`` generated plans (:func:`measured_families`): those not in :data:`TRAINING` under
    the costs fitted to their database's fitting plans (:func:`fitting_plans`), then every one under the
    shipped :data:`~.model.CALIBRATED`; and the figures each fit was made to, under it. Also the fitted
    costs, by database."""
    fits: dict[str, Costs] = {}
    plans: dict[str, list[BenchPlan]] = {}
    for database in sorted({row[0] for row in measured}):
        plans[database] = fitting_plans(database=database)
        fits[database], _ = calibrate(CALIBRATED, plans=plans[database])
    held_out = [
        row
        for database in fits
        for row in family_errors(
            fits[database], [r for r in measured if r[0] == database and r[1] not in TRAINING]
        )
    ]
    out = {"generated plans held out, costs fitted to their database's bench and training plans": held_out}
    out["every generated plan measured, CALIBRATED costs"] = family_errors(CALIBRATED, measured)
    out["bench and training plans, fitted costs"] = [
        error_row(
            f"{bench.name} ({database})",
            (sim[bench.name][0], sim[f"{bench.name} (static)"][0]),
            (bench.plan_s, bench.static_s),
        )
        for database, fitted in fits.items()
        for bench in plans[database]
        for sim in [figures(fitted, [bench])]
    ]
    return out, fits


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
