"""The seed plan (6 nodes in layers 4-1-1, every tool sleeping 5 s): the plan DAG vs. the same plan as a
static DAG vs. the critical path (3 x 5 s).

The plan DAG runs ``plan``, the six node instances and ``finalize``; the static DAG six tasks. The plan
and finalize hops must be paid for by faster hand-offs between nodes.

Per database: ``--repeat`` rounds of (plan DAG, static DAG), medians printed side by side.
Target: plan/static ≤ 1.05 (aim: ≤ 1.00).

Run::

    .venv/bin/python bench/seed.py [--db sqlite postgresql] [--repeat 3] [--sleep 5] [--cap 16]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: its harness package

from _planbench import (
    Bench,
    Question,
    compare,
    fmt,
    main,
    plan_dag_source,
    print_breakdown,
    static_dag_source,
)

from harness.seed import seed_plan

PLAN_DAG, STATIC_DAG = "bench_seed_plan", "bench_seed_static"


class Seed(Question):
    name = "seed"

    def __init__(self) -> None:
        self.plan = seed_plan()
        self.sleep = 5.0

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--sleep", type=float, default=self.sleep, help="seconds each seed tool sleeps")

    def configure(self, args: argparse.Namespace) -> None:
        self.sleep = args.sleep

    @property
    def seconds(self) -> dict[str, float]:
        return {n["id"]: self.sleep for n in self.plan["nodes"]}

    def dags(self, bench: Bench, cap: int) -> dict[str, str]:
        return {
            PLAN_DAG: plan_dag_source(PLAN_DAG, bench.calls_folder, cap),
            STATIC_DAG: static_dag_source(STATIC_DAG, self.plan, self.seconds, bench.calls, cap),
        }

    def measure(self, bench: Bench, repeat: int) -> dict[str, Any]:
        return compare(bench, repeat, (PLAN_DAG, STATIC_DAG), self.plan, self.seconds) | {"sleep": self.sleep}

    def report(self, results: Mapping[str, Mapping[str, Any]]) -> None:
        sleep = next(iter(results.values()))["sleep"]
        print(f"\nSeed plan: 6 nodes in layers 4-1-1, every tool sleeps {sleep:g} s")
        print("  target: plan/static ≤ 1.05 (aim ≤ 1.00)")
        print(
            f"  {'db':<11}{'CP s':>6} |{'plan s':>8}{'static s':>9} |{'plan/static':>12}{'plan/CP':>9}"
            f"{'static/CP':>10} | {'trigger→done plan / static s':>28} | raw makespans plan; static"
        )
        for database, f in results.items():
            p, s, c = f["plan"]["makespan"], f["static"]["makespan"], f["cp"]
            print(
                f"  {database:<11}{c:>6.0f} |{p:>8.1f}{s:>9.1f} |{p / s:>12.2f}{p / c:>9.2f}{s / c:>10.2f} |"
                f" {fmt(f['plan']['trigger_to_done']):>13} / {fmt(f['static']['trigger_to_done']):<12} |"
                f" {f['plan']['raw']}; {f['static']['raw']}"
            )
        for database, f in results.items():
            print(f"\n  {database}: where the median runs' time went")
            print_breakdown(f)


if __name__ == "__main__":
    sys.exit(main([Seed()], __doc__.split("\n\n")[0]))
