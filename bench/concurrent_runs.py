"""Twenty concurrent plan runs sharing one Airflow pool: throughput, and the pool limit held.

Each run executes the same 20-node plan (4 layers of 5; node i of layer k needs nodes i and i+1 of
layer k-1; every tool call sleeps 1 s). The plan DAG is built with ``pool="bench_pool"`` (created through
``POST /api/v2/pools`` with 8 slots) so the node tasks of every run share 8 slots; planning, select and
finalize tasks use the default pool. LocalExecutor ``parallelism`` is 16 so that the pool, not the
executor, is the binding limit on node tasks. The 20 runs are triggered back to back and the script waits
for all of them.

Printed: throughput in nodes per minute over the window from the first run's start to the last run's
end, the ideal for 8 slots (400 node-seconds / 8 = 50 s), pool utilisation (tool-seconds / (8 x window)),
per-run makespans, and the peak number of tool calls running at once (``CallLog.max_concurrency()``,
must be ≤ 8).

Run::

    .venv/bin/python bench/concurrent_runs.py [--runs 20] [--slots 8] [--sleep 1]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from airflow_plan_provider import Limits, NodeExecution

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _planbench import Bench, load_note, log, median, ts, work_plan, work_plan_dag_source

from airflow_plan_provider.testing.scripted import CallLog

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
    args = parser.parse_args()

    plan = make_plan()
    n_nodes = len(plan["nodes"])
    seconds = {n["id"]: args.sleep for n in plan["nodes"]}
    bench = Bench("bench-concurrent")
    load_before = load_note()
    bench.write_dag(
        DAG_ID,
        work_plan_dag_source(
            DAG_ID,
            bench.calls_folder,
            limits=Limits(),
            execution=NodeExecution(pool=POOL),
            max_active_runs=args.runs,
        ),
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
        infos = []
        for run_id, t_trigger in triggered:
            state = cluster.wait_for_run(DAG_ID, run_id, timeout=900, poll=1.0)
            infos.append(bench.run_info(DAG_ID, run_id, t_trigger, state))
        log(f"all runs ended {time.time() - t_first:.0f}s after the first trigger")
        states = [i["state"] for i in infos]
        tis = [ti for i in infos for ti in cluster.task_instances(DAG_ID, i["run_id"])]
        pool = cluster.api("GET", f"/pools/{POOL}")
    finally:
        bench.stop()

    calls = CallLog(bench.calls_folder)
    entries = bench.calls_of()
    starts = [e["t"] for e in entries if e["event"] == "start"]
    ends = [e["t"] for e in entries if e["event"] == "end"]
    tool_seconds = sum(ends) - sum(starts)
    peak = calls.max_concurrency()
    first_start = min(i["start"] for i in infos)
    last_end = max(i["end"] for i in infos)
    window = last_end - first_start
    total_nodes = n_nodes * args.runs
    ideal = total_nodes * args.sleep / args.slots
    makespans = sorted(i["makespan"] for i in infos)
    # Pool slots are taken from queued to end; how much of that the tool call used.
    node_tis = [
        t for t in tis if t["task_id"].startswith("layer_") and t.get("queued_when") and t.get("end_date")
    ]
    held = sum(ts(t["end_date"]) - ts(t["queued_when"]) for t in node_tis)  # type: ignore[operator]
    in_process = sum(ts(t["end_date"]) - ts(t["start_date"]) for t in node_tis)  # type: ignore[operator]
    executed = [t for t in tis if t["state"] == "success"]
    other = [t for t in executed if not t["task_id"].startswith("layer_")]

    print(
        f"\nConcurrent runs: {args.runs} plan runs x {n_nodes} nodes ({LAYERS} layers of {WIDTH},"
        " tools sleep "
        f"{args.sleep:g} s), pool {POOL} with {args.slots} slots, parallelism {PARALLELISM}; "
        f"{time.strftime('%Y-%m-%d')}, 2-core machine"
    )
    print(f"before: {load_before}; after: {load_note()}")
    print(
        f"run states: {', '.join(f'{s} x {states.count(s)}' for s in sorted(set(states)))}; "
        f"task instances: {len(tis)} ({len(executed)} executed: {len(node_tis)} node tasks, "
        f"{len(other)} plan/select/finalize); pool as read back: {pool['slots']} slots\n"
    )
    print(f"  {'nodes executed (tool calls)':<46}{len(starts):>8}   (expected {total_nodes})")
    print(f"  {'window: first run start → last run end':<46}{window:>8.1f} s")
    print(f"  {'first trigger → last run end':<46}{last_end - t_first:>8.1f} s")
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
        f"  {'pool slot-s held by node tasks (queued → end)':<46}{held:>8.1f} s"
        "   of which task process running "
        f"{in_process:.1f} s, tool calls {tool_seconds:.1f} s ({tool_seconds / held:.0%})"
    )
    print(
        f"  {'per node task: slot held / process / tool':<46}{held / len(node_tis):>8.2f}"
        f" / {in_process / len(node_tis):.2f} / {tool_seconds / len(node_tis):.2f} s"
    )
    print(
        f"  {'peak concurrent tool calls (max_concurrency)':<46}{peak:>8}   limit {args.slots}: "
        f"{'held' if peak <= args.slots else 'EXCEEDED'}"
    )
    return 0 if all(s == "success" for s in states) and peak <= args.slots else 1


if __name__ == "__main__":
    sys.exit(main())
