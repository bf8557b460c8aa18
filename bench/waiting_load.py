"""The API server's load from a plan run's waiting nodes: execution-API requests per second at several
plan widths.

For each ``--nodes`` N, a plan of N nodes in layers of ``--width`` (each node one parent in the layer
before and up to two in earlier layers, seed 3; every tool sleeps ``--sleep`` seconds) runs once as a
plan DAG with the cap of the other benchmarks (LocalExecutor ``parallelism`` and ``max_active_tasks``
``--cap``). Most nodes spend the run waiting for their parents: in their slots (reading the states of
their parents' instances) or deferred (their triggers read them, one shared read per poll interval).

Every execution-API request the run sends to the API server is counted by the probe of ``node_tax.py``
(``bench/_taxprobe``): those of the node tasks' supervisors (their task process's requests). A
triggerer serves the execution API in its own process in Airflow 3.3, so the triggers' reads reach the
metadata database, not the API server (the ``by triggerer`` column counts any that would). Printed per
width: requests per second over the run (first task start → last task end), the state reads among
them (``GET task-instances/states``: the waiting) with the bytes they returned, the busiest 10 s,
requests per node, XCom bytes read per node, and the API server's CPU seconds per second of run.

Run::

    .venv/bin/python bench/waiting_load.py [--db postgresql] [--nodes 60 500]
        [--width 25] [--sleep 0.5] [--cap 16] [--json load.json]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _planbench import (
    DATABASES,
    Bench,
    Run,
    log,
    plan_dag_source,
    random_layered_plan,
    run_each_database,
    save_figures,
    work_plan,
)
from node_tax import PROBE, component_cpu, probe_records, request_kind

SEED = 3
STATE_READS = "GET task-instances/states"


def layered(nodes: int, width: int, sleep: float) -> tuple[dict[str, Any], dict[str, float]]:
    widths = [width] * (nodes // width) + ([nodes % width] if nodes % width else [])
    return random_layered_plan(widths, lambda rng: sleep, SEED, f"a {nodes}-node plan")


def run_requests(records: Sequence[Mapping[str, Any]], run_id: str) -> list[Mapping[str, Any]]:
    """The run's execution-API requests: made for one of its task instances, or by a triggerer for it."""
    return [
        r
        for r in records
        if r["kind"] == "request"
        and ((r.get("ti") or {}).get("run_id") == run_id or (not r.get("ti") and run_id in r["query"]))
    ]


def load_figures(
    run: Run, requests: Sequence[Mapping[str, Any]], api_cpu: float, nodes: int
) -> dict[str, Any]:
    window = run.makespan
    kinds = Counter(request_kind(r) for r in requests)
    reads = [r for r in requests if request_kind(r) == STATE_READS]
    by_triggerer = sum(1 for r in requests if not r.get("ti"))
    busiest = Counter(int((r["t"] - run.first_start) // 10) for r in requests)
    busiest_reads = Counter(int((r["t"] - run.first_start) // 10) for r in reads)
    return {
        "nodes": nodes,
        "makespan": window,
        "succeeded": sum(1 for ti in run.node_tis().values() if ti["state"] == "success"),
        "requests": len(requests),
        "per second": len(requests) / window,
        "state reads per second": len(reads) / window,
        "state read bytes per second": sum(r["received"] for r in reads) / window,
        "by triggerer": by_triggerer,
        "busiest 10 s": max(busiest.values(), default=0) / 10,
        "busiest 10 s state reads": max(busiest_reads.values(), default=0) / 10,
        "per node": len(requests) / nodes,
        "xcom bytes read per node": sum(r["received"] for r in requests if "/xcoms/" in r["path"]) / nodes,
        "api-server cpu per second": api_cpu / window,
        "kinds": dict(sorted(kinds.items())),
    }


def measure(database: str, args: argparse.Namespace) -> dict[str, Any]:
    bench = Bench("waiting-load", database)
    probe_log = bench.root / "probe.jsonl"
    plans = {n: layered(n, args.width, args.sleep) for n in args.nodes}
    dags = {
        f"bench_load_{n}": plan_dag_source(f"bench_load_{n}", bench.calls_folder, args.cap, max_nodes=n)
        for n in args.nodes
    }
    for dag_id, source in dags.items():
        bench.write_dag(dag_id, source)
    env = {"PYTHONPATH": str(PROBE), "PLAN_BENCH_TAX_LOG": str(probe_log), "PYTHONDONTWRITEBYTECODE": ""}
    out: dict[str, Any] = {}
    try:
        cluster = bench.start(parallelism=args.cap, dag_ids=list(dags), env=env)
        for n, (plan, seconds) in plans.items():
            before = component_cpu(cluster)
            run = bench.run(f"bench_load_{n}", {"goal": plan["goal"], "plan": work_plan(plan, seconds)}, 1800)
            time.sleep(1.0)
            api_cpu = component_cpu(cluster).get("api-server", 0.0) - before.get("api-server", 0.0)
            figures = load_figures(run, run_requests(probe_records(probe_log), run.run_id), api_cpu, n)
            out[str(n)] = figures
            log(
                f"{database} {n} nodes: {run.state}, makespan {run.makespan:.0f}s,"
                f" {figures['per second']:.1f} requests/s"
                f" ({figures['state reads per second']:.1f} state reads/s)"
            )
            save_figures(args.json, {database: out}, [f"{database}: partial, saved after each size"])
    finally:
        bench.stop()
    return out


def report(results: Mapping[str, Any]) -> None:
    for database, sizes in results.items():
        print(f"\nAPI requests of a plan run's node tasks and triggers, {database}")
        print(
            f"  {'nodes':>6}{'ok':>5}{'makespan s':>11}{'req/s':>8}{'state reads/s':>14}{'read kB/s':>10}"
            f"{'busiest 10 s req/s':>19}{'(reads/s)':>10}{'req/node':>9}{'by triggerer':>13}"
            f"{'API CPU s/s':>12}"
        )
        for n, f in sizes.items():
            print(
                f"  {n:>6}{f['succeeded']:>5}{f['makespan']:>11.0f}{f['per second']:>8.1f}"
                f"{f['state reads per second']:>14.1f}{f['state read bytes per second'] / 1000:>10.1f}"
                f"{f['busiest 10 s']:>19.1f}{f['busiest 10 s state reads']:>10.1f}{f['per node']:>9.1f}"
                f"{f['by triggerer']:>13}{f['api-server cpu per second']:>12.2f}"
            )
        for n, f in sizes.items():
            print(
                f"  {n} nodes: XCom bytes read per node {f['xcom bytes read per node']:.0f};"
                f" requests by kind: {f['kinds']}"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", nargs="+", choices=DATABASES, default=["postgresql"])
    parser.add_argument("--nodes", nargs="+", type=int, default=[60, 500], help="plan sizes")
    parser.add_argument("--width", type=int, default=25, help="nodes per layer")
    parser.add_argument("--sleep", type=float, default=0.5, help="seconds each tool sleeps")
    parser.add_argument("--cap", type=int, default=16, help="LocalExecutor parallelism, DAG max_active_tasks")
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument("--report", type=Path, help="print the tables of a --json file; run nothing")
    args = parser.parse_args()
    header = [
        f"{time.strftime('%Y-%m-%d %H:%M %Z')}; LocalExecutor, parallelism {args.cap};"
        f" layers of {args.width}, tools {args.sleep:g} s; one run per size"
    ]
    return run_each_database(args, header, measure, report)


if __name__ == "__main__":
    sys.exit(main())
