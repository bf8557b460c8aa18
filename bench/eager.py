"""Layer barrier versus eager mode on the unbalanced 60-node plan of ``barrier.py``, side by side.

Runs the same plan (seed 5: layers 14-3-13-2-16-12, tools sleeping 1-10 s) three ways in one Airflow:
the layered plan DAG, the plan DAG in mode ``nodes`` (one mapped task; a node starts when its own
parents finish, waiting deferred on the triggerer), and the same plan as a static DAG. Prints makespans
and their ratios to the critical path, the layered bound and the static DAG. Asserts nothing about time.

    .venv/bin/python bench/eager.py [--scale 1] [--db postgresql+psycopg://postgres@127.0.0.1/bench_eager]

On SQLite, 60 nodes deferring and resuming at once can exhaust SQLite's single writer ("database is
locked" in the dag-processor and triggerer); use PostgreSQL (``--db``, an empty database) as Airflow
recommends for anything beyond a laptop.
"""

from __future__ import annotations

import argparse
import sys

from _planbench import (
    Bench,
    critical_path,
    layered_bound,
    load_note,
    log,
    noop_dag_source,
    static_dag_source,
    work_plan,
    work_plan_dag_source,
)
from barrier import PARALLELISM, WIDTHS, make_plan

from airflow_plan_provider import Budgets, Limits, NodeExecution

LAYERED, EAGER, STATIC, NOOP = (
    "bench_eager_layered",
    "bench_eager_eager",
    "bench_eager_static",
    "bench_eager_noop",
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument(
        "--db",
        default=None,
        help="metadata DB URL (default: SQLite), e.g. postgresql+psycopg://postgres@127.0.0.1/x",
    )
    args = parser.parse_args()
    plan, seconds = make_plan(args.seed)
    cp, _ = critical_path(plan, seconds)
    lb = layered_bound(plan, seconds)
    cp, lb = cp * args.scale, lb * args.scale
    build = {"budgets": Budgets(max_steps=200), "max_active_tasks": PARALLELISM}
    bench = Bench("bench-eager")
    before = load_note()
    bench.write_dag(
        LAYERED,
        work_plan_dag_source(
            LAYERED,
            bench.calls_folder,
            limits=Limits(),
            execution=NodeExecution(max_active_nodes=60),
            **build,
        ),
    )
    bench.write_dag(
        EAGER,
        work_plan_dag_source(
            EAGER, bench.calls_folder, execution=NodeExecution(max_active_nodes=60), **build
        ),
    )
    bench.write_dag(
        STATIC, static_dag_source(STATIC, plan, seconds, bench.calls, max_active_tasks=PARALLELISM)
    )
    bench.write_dag(NOOP, noop_dag_source(NOOP))
    makespans: dict[str, float] = {}
    try:
        cluster = bench.start(
            parallelism=PARALLELISM,
            env={
                "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": str(PARALLELISM),
                **({"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": args.db} if args.db else {}),
            },
            dag_ids=[LAYERED, EAGER, STATIC, NOOP],
        )
        bench.run(NOOP)
        conf = {"goal": plan["goal"], "plan": work_plan(plan, seconds, args.scale)}
        for name, dag_id, run_conf in (
            ("layered", LAYERED, conf),
            ("eager", EAGER, conf),
            ("static", STATIC, {"scale": args.scale}),
        ):
            info = bench.run(dag_id, run_conf, timeout=900)
            log(f"{name}: {info['state']} makespan {info['makespan']:.1f}s")
            if info["state"] != "success":
                print(cluster.diagnostics(), file=sys.stderr)
                return 1
            makespans[name] = info["makespan"]
    finally:
        bench.stop()
    print(
        f"\nEager vs layered: 60 nodes, layers {'-'.join(map(str, WIDTHS))}, scale {args.scale:g}; "
        f"critical path {cp:g} s, layered bound {lb:g} s; 2-core machine"
    )
    print(f"before: {before}; after: {load_note()}\n")
    print(f"  {'mode':<8} {'makespan s':>10} {'/CP':>6} {'/LB':>6} {'/static':>8}")
    static = makespans["static"]
    for name, value in makespans.items():
        print(f"  {name:<8} {value:>10.1f} {value / cp:>6.2f} {value / lb:>6.2f} {value / static:>8.2f}")
    print(f"\n  eager / layered = {makespans['eager'] / makespans['layered']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
