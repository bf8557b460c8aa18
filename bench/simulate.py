"""The simulator of Airflow's slot hand-out (``bench/simulator/``) on the plans ``bench/`` runs on a real
Airflow: simulated makespans next to the measured ones and the list-scheduling bound; with ``--sweep``,
the waiting policy's numbers tried one at a time; with ``--calibrate``, the costs fitted again.

Run (from the repository root; no Airflow is started)::

    python bench/simulate.py                 # the table (about a second)
    python bench/simulate.py --sweep         # the policy's numbers, one at a time (about a minute)
    python bench/simulate.py --calibrate     # fit the costs to the measured figures (a few minutes)
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from airflow_plan_provider.plan.waiting import WaitingPolicy
from bench.simulator.calibrate import calibrate, figures
from bench.simulator.engine import simulate
from bench.simulator.model import CALIBRATED, list_scheduling_bound
from bench.simulator.plans import BENCH_CAP, SOURCE, bench_plans
from bench.simulator.sweep import print_sweep


def table(policy: WaitingPolicy | None = None) -> list[dict[str, object]]:
    """One row per bench plan: simulated and measured makespans (plan DAG, static DAG), the bound and
    the slot-seconds that nodes waiting for their parents held."""
    policy = policy or WaitingPolicy()
    rows = []
    for bench in bench_plans():
        plan = simulate(bench.plan, policy, bench.caps, CALIBRATED)
        static = simulate(bench.plan, policy, bench.caps, CALIBRATED, static=True)
        rows.append(
            {
                "plan": bench.name,
                "nodes": len(bench.plan.parents),
                "cp": bench.plan.critical_path(),
                "bound": list_scheduling_bound(bench.plan, BENCH_CAP),
                "sim": plan.makespan,
                "real": bench.plan_postgres,
                "real_sqlite": bench.plan_sqlite,
                "static_sim": static.makespan,
                "static_real": bench.static_postgres,
                "wasted": plan.wasted,
                "overhead": plan.slot_seconds - plan.tool_seconds,
                "static_overhead": static.slot_seconds - static.tool_seconds,
                "processes": plan.processes,
                "handoff": plan.handoff,
                "static_handoff": static.handoff,
                "deadlock": plan.deadlock or static.deadlock,
            }
        )
    return rows


def print_table(rows: list[dict[str, object]]) -> None:
    print(f"Simulated vs measured makespans (s); measured: {SOURCE}, PostgreSQL (SQLite beside it)")
    print(f"cap {BENCH_CAP} (DAG max_active_tasks = parallelism); bound = max(critical path, work / cap)")
    print(
        f"{'plan':<22}{'nodes':>6}{'CP':>6}{'bound':>7} | {'sim':>6}{'real':>7}{'ratio':>6}{'SQLite':>7} |"
        f" {'static sim':>10}{'real':>6}{'ratio':>6} | {'waiting':>8}{'over plan':>10}{'over static':>12}"
        f"{'procs':>6}{'hand-off':>15}"
    )
    for r in rows:
        sim, real = float(r["sim"]), float(r["real"])  # type: ignore[arg-type]
        static, static_real = float(r["static_sim"]), r["static_real"]  # type: ignore[arg-type]
        static_cols = (
            f"{static:>10.1f}{static_real:>6.1f}{static / float(static_real):>6.2f}"  # type: ignore[arg-type]
            if static_real is not None
            else f"{static:>10.1f}{'-':>6}{'-':>6}"
        )
        print(
            f"{r['plan']:<22}{r['nodes']:>6}{r['cp']:>6.0f}{r['bound']:>7.1f} | {sim:>6.1f}{real:>7.1f}"
            f"{sim / real:>6.2f}{r['real_sqlite']:>7.1f} | {static_cols} | {r['wasted']:>8.0f}"
            f"{r['overhead']:>10.0f}{r['static_overhead']:>12.0f}{r['processes']:>6}"
            f"{r['handoff']:>8.2f} /{r['static_handoff']:>5.2f}"
            + (f"  DEADLOCK: {r['deadlock']}" if r["deadlock"] else "")
        )
    print(
        "waiting: slot-seconds plan-DAG nodes held while their parents had not finished (in-slot waits,"
        " and the start-up of processes that then gave their slot back); over: slot-seconds held beyond"
        " the tools' own time (start-up, waiting, record push), plan DAG and static DAG; procs: node task"
        " processes of the plan DAG; hand-off: median last parent's tool end → tool start, plan / static"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", action="store_true", help="try the waiting policy's numbers")
    parser.add_argument("--calibrate", action="store_true", help="fit the costs to the measured figures")
    args = parser.parse_args(argv)
    if args.calibrate:
        best, (worst, squares) = calibrate(CALIBRATED)
        print("Costs(" + ", ".join(f"{f.name}={getattr(best, f.name)!r}" for f in fields(best)) + ")")
        print(f"largest |log(sim / real)| {worst:.3f}, sum of squares {squares:.4f}")
        for name, (sim, real) in figures(best).items():
            print(f"  {name:<32}{sim:>8.1f}{real:>8.1f}{sim / real:>7.2f}")
        return 0
    if args.sweep:
        print_sweep()
        return 0
    print_table(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
