"""Deep plans: a chain of 30 nodes and a plan 12 layers deep, on the plan DAG and as a static DAG.

A chain pays one hand-off per edge and nothing runs beside it, so it shows the cost of an edge alone.
The 12-layer plan has 3 nodes per layer (36 nodes), each with one parent in the layer before and up to
two in earlier layers; every tool sleeps the same time (default 1 s), so its critical path has 12 nodes.

Per-edge overhead = (makespan - sum of the sleeps along the critical path) / edges on the critical path
(for the plan DAG this spreads the plan task and the finalize hop over the edges); the median measured
hand-off (parent tool end → child tool start) is printed beside it.

Per database: ``--repeat`` rounds of (plan DAG, static DAG) per shape, medians printed side by side.

Run::

    .venv/bin/python bench/depth.py [--db sqlite postgresql] [--repeat 3] [--link-sleep 1] [--cap 16]
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
    Plan,
    Question,
    chain_plan,
    compare,
    critical_path,
    fmt,
    main,
    plan_dag_source,
    print_breakdown,
    random_layered_plan,
    static_dag_source,
)

CHAIN, LAYERS, LAYER_WIDTH = 30, 12, 3
SEED = 1


class Depth(Question):
    name = "depth"

    def __init__(self) -> None:
        self.sleep = 1.0

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--link-sleep", type=float, default=self.sleep, help="seconds each deep-plan tool sleeps"
        )

    def configure(self, args: argparse.Namespace) -> None:
        self.sleep = args.link_sleep

    def shapes(self) -> dict[str, tuple[Plan, dict[str, float]]]:
        chain = chain_plan(CHAIN, self.sleep)
        layered = random_layered_plan(
            [LAYER_WIDTH] * LAYERS, lambda rng: self.sleep, SEED, f"a plan {LAYERS} layers deep"
        )
        return {f"chain of {CHAIN}": chain, f"{LAYERS} layers x {LAYER_WIDTH}": layered}

    @staticmethod
    def dag_ids(index: int) -> tuple[str, str]:
        return f"bench_depth{index}_plan", f"bench_depth{index}_static"

    def dags(self, bench: Bench, cap: int) -> dict[str, str]:
        out = {}
        for index, (plan, seconds) in enumerate(self.shapes().values()):
            plan_dag, static_dag = self.dag_ids(index)
            out[plan_dag] = plan_dag_source(plan_dag, bench.calls_folder, cap)
            out[static_dag] = static_dag_source(static_dag, plan, seconds, bench.calls, cap)
        return out

    def measure(self, bench: Bench, repeat: int) -> dict[str, Any]:
        out: dict[str, Any] = {"sleep": self.sleep, "shapes": {}}
        for index, (name, (plan, seconds)) in enumerate(self.shapes().items()):
            figures = compare(bench, repeat, self.dag_ids(index), plan, seconds)
            _, chain = critical_path(plan, seconds)
            figures["edges"] = len(chain) - 1
            out["shapes"][name] = figures
        return out

    def report(self, results: Mapping[str, Mapping[str, Any]]) -> None:
        sleep = next(iter(results.values()))["sleep"]
        print(f"\nDeep plans: every tool sleeps {sleep:g} s")
        print(
            f"  {'db':<11}{'shape':<15}{'CP s':>6}{'edges':>6} |{'plan s':>8}{'static s':>9} |"
            f"{'plan/static':>12}"
            f"{'plan/CP':>9}{'static/CP':>10} | {'overhead/edge plan / static s':>29} |"
            f" {'hand-off plan / static s':>24} | {'trigger→done plan / static s':>28}"
        )
        for database, r in results.items():
            for shape, f in r["shapes"].items():
                p, s, c, e = f["plan"]["makespan"], f["static"]["makespan"], f["cp"], f["edges"]
                print(
                    f"  {database:<11}{shape:<15}{c:>6.0f}{e:>6} |{p:>8.1f}{s:>9.1f} |{p / s:>12.2f}"
                    f"{p / c:>9.2f}"
                    f"{s / c:>10.2f} | {(p - c) / e:>14.2f} / {(s - c) / e:<12.2f} |"
                    f" {f['plan']['handoffs']['total']:>10.2f} / {f['static']['handoffs']['total']:<11.2f} |"
                    f" {fmt(f['plan']['trigger_to_done']):>13} / {fmt(f['static']['trigger_to_done']):<12}"
                )
        for database, r in results.items():
            for shape, f in r["shapes"].items():
                print(
                    f"\n  {database}, {shape}: where the median runs' time went"
                    f" (raw makespans plan {f['plan']['raw']}; static {f['static']['raw']})"
                )
                print_breakdown(f)


if __name__ == "__main__":
    sys.exit(main([Depth()], __doc__.split("\n\n")[0]))
