"""A 500-node plan with 0.5 s tools: it completes, the node slots held at once stay within the cap, and
its throughput; with ``--wide-static``, next to the same plan as a static DAG, with the scheduler's loop
time for each (StatsD ``scheduler.scheduler_loop_duration`` while the run is on) and the execution-API
requests per second the API server answered while it was on (its access log).

The plan has 20 layers of 25 nodes, each node with one parent in the layer before and up to two in
earlier layers (seed 3), every tool sleeping 0.5 s: 250 s of tool time, critical path 10 s. With a cap
of C node slots the best makespan is max(250 / C, 10) s.

Slots held are counted from the node task instances' own logs (one period per task process: start to
end, or to its pause as DEFERRED), so a deferred instance holds no slot while it waits; the peak must be
≤ the cap (the DAG's ``max_active_tasks``). ``--wide-static`` also runs the same plan as a static DAG.

Run::

    .venv/bin/python bench/wide.py [--db sqlite postgresql] [--wide-repeat 1] [--cap 16] [--wide-static]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _planbench import (
    AsGiven,
    Bench,
    Question,
    breakdown,
    critical_path,
    execution_requests_per_second,
    fmt,
    main,
    median_run,
    plan_dag_source,
    random_layered_plan,
    repeat_runs,
    run_figures,
    static_dag_source,
    work_plan,
)

PLAN_DAG, STATIC_DAG = "bench_wide_plan", "bench_wide_static"
LAYERS, WIDTH, SLEEP, SEED = 20, 25, 0.5, 3


class Wide(Question):
    name = "wide"

    def __init__(self) -> None:
        self.repeat, self.static, self.cap = 1, False, 0
        self.conf_plan = False
        self.node_cap = True
        self.shape(LAYERS)

    def shape(self, layers: int) -> None:
        self.layers = layers
        self.plan, self.seconds = random_layered_plan(
            [WIDTH] * layers, lambda rng: SLEEP, SEED, f"a {layers * WIDTH}-node plan"
        )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--wide-repeat", type=int, default=1, help="runs of the 500-node plan")
        parser.add_argument("--wide-static", action="store_true", help="also run it as a static DAG")
        parser.add_argument(
            "--wide-conf-plan",
            action="store_true",
            help="also run the plan DAG with the plan in the run's conf (decoded once per task instance)",
        )
        parser.add_argument("--wide-layers", type=int, default=LAYERS, help=f"layers of {WIDTH} nodes")
        parser.add_argument(
            "--wide-no-node-cap",
            action="store_true",
            help="build the plan DAG with max_active_nodes=None (no task-level cap on the node task)",
        )

    def configure(self, args: argparse.Namespace) -> None:
        self.repeat, self.static, self.cap = args.wide_repeat, args.wide_static, args.cap
        self.conf_plan = args.wide_conf_plan
        self.node_cap = not args.wide_no_node_cap
        self.shape(args.wide_layers)

    def dags(self, bench: Bench, cap: int) -> dict[str, str]:
        out = {
            PLAN_DAG: plan_dag_source(
                PLAN_DAG, bench.calls_folder, cap, max_nodes=len(self.plan["nodes"]), node_cap=self.node_cap
            )
        }
        if self.static:
            out[STATIC_DAG] = static_dag_source(STATIC_DAG, self.plan, self.seconds, bench.calls, cap)
        return out

    def measure(self, bench: Bench, repeat: int) -> dict[str, Any]:
        conf = {"goal": self.plan["goal"], "plan": work_plan(self.plan, self.seconds)}
        runs: list[tuple[str, str, Mapping[str, Any]]] = [("plan", PLAN_DAG, conf)]
        if self.conf_plan:  # the same plan DAG, the plan in the run's conf instead of from its planner
            runs.append(("conf", PLAN_DAG, AsGiven(conf)))
        if self.static:
            runs.append(("static", STATIC_DAG, {}))
        out: dict[str, Any] = {"cap": self.cap, "repeat": self.repeat, "runs": {}}
        for kind, group in repeat_runs(bench, self.repeat, runs).items():
            run = median_run(group)
            figures = run_figures(group) | breakdown(bench, run, self.plan)
            figures["succeeded"] = sum(1 for ti in run.node_tis().values() if ti["state"] == "success")
            assert bench.cluster is not None
            figures["api requests/s"] = execution_requests_per_second(
                bench.cluster.log_path("api-server"), group
            )
            out["runs"][kind] = figures
        return out

    def report(self, results: Mapping[str, Mapping[str, Any]]) -> None:
        n = len(self.plan["nodes"])
        cp, _ = critical_path(self.plan, self.seconds)
        work = sum(self.seconds.values())
        cap, repeat = next((r["cap"], r["repeat"]) for r in results.values())
        ideal = max(work / cap, cp)
        print(
            f"\nWide plan: {n} nodes in {self.layers} layers of {WIDTH}, tools {SLEEP:g} s"
            f" ({work:g} s of tool time,"
            f" critical path {cp:g} s); cap {cap} node slots: best makespan {ideal:.1f} s"
            f" = {n / ideal * 60:.0f} nodes/min; median of {repeat}"
        )
        print(
            f"  {'db':<11}{'DAG':<7}{'nodes ok':>9}{'makespan s':>11}{'trigger→done s':>15}{'nodes/min':>10}"
            f"{'/best':>7} | {'peak slots (cap)':>16}{'processes':>10}{'peak tools':>11}"
        )
        for database, r in results.items():
            for kind, f in r["runs"].items():
                slots = f"{f['slot peak']} ({cap})" if "slot peak" in f else "-"
                print(
                    f"  {database:<11}{kind:<7}{f['succeeded']:>5}/{n:<3}{f['makespan']:>11.1f}"
                    f"{fmt(f['trigger_to_done']):>15}{n / f['makespan'] * 60:>10.0f}"
                    f"{f['makespan'] / ideal:>7.2f} |"
                    f" {slots:>16}{f.get('processes', '-'):>10}{f['tool peak']:>11}"
                )
        for database, r in results.items():
            runs = r["runs"]
            for kind, f in runs.items():
                if "loop ms" in f:
                    print(
                        f"  {database} {kind}: scheduler loop {f['loop ms']:.0f} ms median,"
                        f" {f['loop p95 ms']:.0f} ms p95, {f['loops/s']:.1f} loops/s"
                    )
                if f.get("api requests/s") is not None:
                    print(
                        f"  {database} {kind}: execution-API requests {f['api requests/s']:.1f}/s,"
                        f" {f['api requests/s'] * f['makespan'] / n:.1f} per node"
                    )
            for kind, other in (("plan", "static"), ("conf", "static"), ("plan", "conf")):
                if "loop ms" in runs.get(kind, {}) and "loop ms" in runs.get(other, {}):
                    a, b = runs[kind], runs[other]
                    loop = a["loop ms"] / b["loop ms"]
                    print(
                        f"  {database} {kind} / {other}: scheduler loop median {loop:.2f} x,"
                        f" p95 {a['loop p95 ms'] / b['loop p95 ms']:.2f} x;"
                        f" throughput {b['makespan'] / a['makespan']:.2f} x the {other} run's"
                    )
        for database, r in results.items():
            for kind, f in r["runs"].items():
                h = f["handoffs"]
                print(
                    f"  {database} {kind}: phases "
                    + ", ".join(f"{k} {v:.1f}" for k, v in f["phases"].items())
                    + f"; hand-off median {h['total']:.2f} s"
                    + f" ({h['in slot n']} in slot, {h['started n']} started)"
                )


if __name__ == "__main__":
    sys.exit(main([Wide()], __doc__.split("\n\n")[0]))
