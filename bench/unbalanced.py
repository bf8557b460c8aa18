"""An unbalanced 60-node plan: the plan DAG vs. the same plan written as a static DAG vs. the critical path.

The plan (fixed seed) has 60 nodes in 6 layers of widths 14-3-13-2-16-12, tools sleeping 1-10 s. Every
node outside layer 0 has one parent in the layer just before and up to two more in any earlier layer, so
chains cross layers and the slowest nodes of consecutive layers are mostly not on one chain: a layer
barrier would cost 52 s where the critical path is 32 s (seed 5, picked among seeds 0-29 for that gap).

Per database: ``--repeat`` rounds of (plan DAG, static DAG) at each sleep scale (default 1 and 2; the
tools sleep scale x their seconds), medians printed side by side with the critical path (CP).
Targets: plan/static ≤ 1.05; plan/CP ≤ 1.15 at scale 2.

Run::

    .venv/bin/python bench/unbalanced.py [--db sqlite postgresql] [--repeat 3] [--scales 1 2] [--cap 16]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _planbench import (
    Bench,
    Question,
    compare,
    critical_path,
    fmt,
    main,
    plan_dag_source,
    print_breakdown,
    random_layered_plan,
    static_dag_source,
)

PLAN_DAG, STATIC_DAG = "bench_unbalanced_plan", "bench_unbalanced_static"
WIDTHS = (14, 3, 13, 2, 16, 12)
SEED = 5


class Unbalanced(Question):
    name = "unbalanced"

    def __init__(self) -> None:
        self.plan, self.seconds = random_layered_plan(
            WIDTHS, lambda rng: float(rng.randint(1, 10)), SEED, "unbalanced 60-node plan"
        )
        self.scales: list[float] = [1.0, 2.0]

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--scales", type=float, nargs="+", default=self.scales, help="sleep scales")

    def configure(self, args: argparse.Namespace) -> None:
        self.scales = args.scales

    def dags(self, bench: Bench, cap: int) -> dict[str, str]:
        return {
            PLAN_DAG: plan_dag_source(PLAN_DAG, bench.calls_folder, cap),
            STATIC_DAG: static_dag_source(STATIC_DAG, self.plan, self.seconds, bench.calls, cap),
        }

    def measure(self, bench: Bench, repeat: int) -> dict[str, Any]:
        return {
            str(scale): compare(bench, repeat, (PLAN_DAG, STATIC_DAG), self.plan, self.seconds, scale)
            for scale in self.scales
        }

    def report(self, results: Mapping[str, Mapping[str, Any]]) -> None:
        cp, chain = critical_path(self.plan, self.seconds)
        print(
            f"\nUnbalanced plan: 60 nodes, layers {'-'.join(map(str, WIDTHS))}, tools 1-10 s x scale"
            f" (seed {SEED}); sum of sleeps {sum(self.seconds.values()):g} s, critical path {cp:g} s"
            f" x scale ({' → '.join(chain)})"
        )
        print("  targets: plan/static ≤ 1.05; plan/CP ≤ 1.15 at scale 2")
        print(
            f"  {'db':<11}{'scale':>5}{'CP s':>6} |{'plan s':>8}{'static s':>9} |{'plan/static':>12}"
            f"{'plan/CP':>9}{'static/CP':>10} | {'trigger→done plan / static s':>28} |"
            " raw makespans plan; static"
        )
        for database, by_scale in results.items():
            for scale, f in by_scale.items():
                p, s, c = f["plan"]["makespan"], f["static"]["makespan"], f["cp"]
                print(
                    f"  {database:<11}{float(scale):>5g}{c:>6.0f} |{p:>8.1f}{s:>9.1f} |{p / s:>12.2f}"
                    f"{p / c:>9.2f}{s / c:>10.2f} | {fmt(f['plan']['trigger_to_done']):>13} /"
                    f" {fmt(f['static']['trigger_to_done']):<12} | {f['plan']['raw']}; {f['static']['raw']}"
                )
        for database, by_scale in results.items():
            for scale, f in by_scale.items():
                print(f"\n  {database}, scale {float(scale):g}: where the median runs' time went")
                print_breakdown(f)


if __name__ == "__main__":
    sys.exit(main([Unbalanced()], __doc__.split("\n\n")[0]))
