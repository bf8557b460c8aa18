"""Twenty concurrent plan runs sharing one Airflow pool: throughput, and the pool limit held.

Each run executes the same 20-node plan (4 layers of 5; node i of layer k needs nodes i and i+1 of
layer k-1; every tool call sleeps 1 s). The plan DAG is built with ``pool="bench_pool"`` (created through
``POST /api/v2/pools`` with 8 slots, deferred instances not counted) so the node instances of every run
share 8 slots; the plan and finalize tasks use the default pool. LocalExecutor ``parallelism`` is 16 (and
``max_active_nodes`` above it) so that the pool, not the executor, is the binding limit on node tasks. The 20
runs are triggered back to back and the script waits for all of them.

Printed: throughput in nodes per minute over the window from the first task start to the last task end,
the ideal for 8 slots (400 node-seconds / 8 = 50 s), pool utilisation (tool-seconds / (8 x window)),
per-run makespans, and the peak number of node task processes (from their logs: a deferred instance
holds no slot) and of tool calls running at once (must be ≤ 8).

Run::

    .venv/bin/python bench/concurrent_runs.py [--runs 20] [--slots 8] [--sleep 1] [--db sqlite]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _planbench import (
    DATABASES,
    Bench,
    load_note,
    log,
    median,
    peak_overlap,
    plan_dag_source,
    work_plan,
)

DAG_ID = "bench_concurrent_plan"
POOL = "bench_pool"
LAYERS, WIDTH = 4, 5
PARALLELISM = 16


def make_plan() -> dict:
    nodes, edges = [], []
    for layer in range(LAYERS):
        for i in range(WIDTH):
            node = f"L{layer}N{i}"
            nodes.append({"id": node, "action": f"step {node}", "tool": "work", "params": {}})
            if layer:
                for j in sorted({i, (i + 1) % WIDTH}):
                    edges.append({"from": f"L{layer - 1}N{j}", "to": node})
    return {"goal": "concurrent runs bench", "nodes": nodes, "edges": edges}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--sleep", type=float, default=1.0)
    parser.add_argument("--db", choices=DATABASES, default="sqlite", help="metadata database")
    args = parser.parse_args()

    plan = make_plan()
    n_nodes = len(plan["nodes"])
    seconds = {n["id"]: args.sleep for n in plan["nodes"]}
    bench = Bench("bench-concurrent", args.db)
    load_before = load_note()
    bench.write_dag(
        DAG_ID, plan_dag_source(DAG_ID, bench.calls_folder, PARALLELISM, pool=POOL, max_active_runs=args.runs)
    )
    try:
        cluster = bench.start(parallelism=PARALLELISM, dag_ids=[DAG_ID])
        cluster.api(
            "POST",
            "/pools",
            {"name": POOL, "slots": args.slots, "description": "bench", "include_deferred": False},
        )
        conf = {"goal": plan["goal"], "plan": work_plan(plan, seconds)}
        triggered = []
        t_first = time.time()
        for _ in range(args.runs):
            triggered.append((cluster.trigger(DAG_ID, conf), time.time()))
        log(f"triggered {args.runs} runs in {time.time() - t_first:.1f}s")
        runs = []
        for run_id, t_trigger in triggered:
            state = cluster.wait_for_run(DAG_ID, run_id, timeout=900, poll=1.0)
            runs.append(bench.collect(DAG_ID, run_id, t_trigger, state))
        log(f"all runs ended {time.time() - t_first:.0f}s after the first trigger")
        # slots a node task holds: one period per task process (a deferral gives the slot back)
        segments = [
            s for run in runs for ti in run.node_tis().values() for s in bench.process_segments(run, ti)
        ]
        pool = cluster.api("GET", f"/pools/{POOL}")
    finally:
        bench.stop()

    tools = [span for run in runs for span in run.tools.values()]
    tool_seconds = sum(end - start for start, end in tools)
    states = [run.state for run in runs]
    first_start = min(run.first_start for run in runs)
    last_end = max(run.last_end for run in runs)
    window = last_end - first_start
    total_nodes = n_nodes * args.runs
    ideal = total_nodes * args.sleep / args.slots
    makespans = sorted(run.makespan for run in runs)
    held = sum(end - start for start, end in segments)
    node_tis = [ti for run in runs for ti in run.node_tis().values()]

    print(
        f"\nConcurrent runs: {args.runs} plan runs x {n_nodes} nodes ({LAYERS} layers of {WIDTH},"
        f" tools sleep {args.sleep:g} s), pool {POOL} with {args.slots} slots, parallelism {PARALLELISM},"
        f" {args.db}; {time.strftime('%Y-%m-%d %H:%M %Z')}"
    )
    print(f"before: {load_before}; after: {load_note()}")
    print(
        f"run states: {', '.join(f'{s} x {states.count(s)}' for s in sorted(set(states)))}; "
        f"node task instances: {len(node_tis)}, task processes (starts + resumes) {len(segments)};"
        f" pool as read back: {pool['slots']} slots\n"
    )
    print(f"  {'nodes executed (tool calls)':<46}{len(tools):>8}   (expected {total_nodes})")
    print(f"  {'window: first task start → last task end':<46}{window:>8.1f} s")
    print(f"  {'first trigger → last task end':<46}{last_end - t_first:>8.1f} s")
    print(f"  {'throughput':<46}{total_nodes / window * 60:>8.1f} nodes/min")
    print(
        f"  {'ideal with ' + str(args.slots) + ' slots (node-s / slots)':<46}{ideal:>8.1f} s  = "
        f"{total_nodes / ideal * 60:.0f} nodes/min   (window / ideal = {window / ideal:.2f})"
    )
    print(
        f"  {'pool utilisation (tool-s / (slots x window))':<46}{tool_seconds / (args.slots * window):>8.2f}"
    )
    print(
        f"  {'per-run makespan min / median / max':<46}{makespans[0]:>8.1f} / {median(makespans):.1f}"
        f" / {makespans[-1]:.1f} s"
    )
    print(
        f"  {'slot-s held by node task processes':<46}{held:>8.1f} s   of which tool calls"
        f" {tool_seconds:.1f} s ({tool_seconds / held:.0%}); per node {held / len(node_tis):.2f} s"
    )
    peak_slots, peak_tools = peak_overlap(segments), peak_overlap(tools)
    print(
        f"  {'peak node task processes / tool calls at once':<46}{peak_slots:>8} / {peak_tools}"
        f"   pool limit {args.slots}: {'held' if peak_slots <= args.slots else 'EXCEEDED'}"
    )
    return 0 if all(s == "success" for s in states) and peak_slots <= args.slots else 1


if __name__ == "__main__":
    sys.exit(main())
