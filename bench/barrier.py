"""Layer barrier: an unbalanced 60-node plan on the plan DAG vs. the same plan as a static DAG.

The plan (fixed seed) has 60 nodes in 6 layers of widths 14-3-13-2-16-12 (wide and narrow); node
durations are 1-10 s. Every node outside layer 0 has one parent in the layer just before (that fixes its
layer) and up to two more in any earlier layer, so chains cross layers and the slowest nodes of
consecutive layers are mostly not on one chain. Two lower bounds follow from the plan alone:

- the critical path (longest chain of durations): what a DAG without barriers can reach;
- the layered bound, the sum over layers of the slowest node of each layer: what the plan DAG's
  ``layer_k`` barrier (every node of layer k waits for all of layer k-1) can reach with zero overhead.

Both DAGs run in one Airflow (LocalExecutor, ``parallelism`` 64, ``max_active_nodes`` 60, DAG
``max_active_tasks`` 64), one run at a time (after a one-task warm-up run), plan then static, at each
duration scale (default 1x and 2x). Since the barrier cost grows with the durations while process
start-up does not, the slope between the two scales (seconds of makespan per unit of scale) is compared
with the layered bound and the critical path, and the intercept is the fixed overhead.

Run::

    .venv/bin/python bench/barrier.py [--scales 1 2] [--seed 5]

The default seed 5 was picked among seeds 0-29 for a wide gap between the layered bound and the critical
path (52 s vs 32 s), so that the barrier is visible; seed 7, for one, gives 51 s vs 46 s.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _planbench import (
    Bench,
    critical_path,
    fmt,
    layered_bound,
    layers_of,
    load_note,
    log,
    noop_dag_source,
    parents_of,
    piece_medians,
    stage_table,
    static_dag_source,
    work_plan,
    work_plan_dag_source,
)

from airflow_plan_provider import Budgets, Limits, NodeExecution

PLAN_DAG = "bench_barrier_plan"
NOOP_DAG = "bench_noop"
STATIC_DAG = "bench_barrier_static"
WIDTHS = (14, 3, 13, 2, 16, 12)
PARALLELISM = 64


def make_plan(seed: int) -> tuple[dict[str, Any], dict[str, float]]:
    rng = random.Random(seed)
    layers: list[list[str]] = []
    next_id = 1
    for width in WIDTHS:
        layers.append([str(next_id + i) for i in range(width)])
        next_id += width
    seconds = {n: float(rng.randint(1, 10)) for layer in layers for n in layer}
    edges: list[dict[str, Any]] = []
    for index, layer in enumerate(layers[1:], start=1):
        earlier = [n for previous in layers[: index - 1] for n in previous]
        for node in layer:
            parents = {rng.choice(layers[index - 1])}
            for _ in range(rng.randint(0, 2)):
                if earlier:
                    parents.add(rng.choice(earlier))
            edges += [{"from": p, "to": node} for p in sorted(parents, key=int)]
    nodes = [
        {"id": n, "action": f"step {n} ({seconds[n]:g} s)", "tool": "work", "params": {}} for n in seconds
    ]
    plan = {"goal": "unbalanced 60-node plan", "nodes": nodes, "edges": edges}
    assert layers_of(plan) == layers, "the generated edges must keep the intended layers"
    return plan, seconds


def dependency_delays(
    bench: Bench, info: dict, plan: dict, layer_of: dict[str, int] | None
) -> dict[str, float]:
    """Per node: tool start - last parent's tool end (root nodes: - run start). For the plan DAG also the
    part of it spent waiting for the rest of the previous layer (the barrier)."""
    spans = bench.tool_spans(info["run_id"])
    parents = parents_of(plan)
    delays, barrier = [], []
    layer_end: dict[int, float] = {}
    if layer_of is not None:
        for node, (_s, e) in spans.items():
            layer_end[layer_of[node]] = max(layer_end.get(layer_of[node], 0.0), e)
    for node, (start, _e) in spans.items():
        ready = max((spans[p][1] for p in parents[node]), default=info["start"])
        delays.append(start - ready)
        if layer_of is not None and layer_of[node] > 0:
            barrier.append(layer_end[layer_of[node] - 1] - ready)
    out = {"mean": sum(delays) / len(delays), "max": max(delays), "sum": sum(delays)}
    if barrier:
        out |= {"barrier_mean": sum(barrier) / len(barrier), "barrier_sum": sum(barrier)}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", type=float, nargs="+", default=[1.0, 2.0])
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args()

    plan, seconds = make_plan(args.seed)
    layers = layers_of(plan)
    layer_of = {n: i for i, layer in enumerate(layers) for n in layer}
    cp, chain = critical_path(plan, seconds)
    lb = layered_bound(plan, seconds)
    work = sum(seconds.values())

    bench = Bench("bench-barrier")
    load_before = load_note()
    build = {
        "limits": Limits(),
        "execution": NodeExecution(max_active_nodes=60),
        "budgets": Budgets(max_steps=200),
        "max_active_tasks": PARALLELISM,
    }
    bench.write_dag(PLAN_DAG, work_plan_dag_source(PLAN_DAG, bench.calls_folder, **build))
    bench.write_dag(NOOP_DAG, noop_dag_source(NOOP_DAG))
    bench.write_dag(
        STATIC_DAG, static_dag_source(STATIC_DAG, plan, seconds, bench.calls, max_active_tasks=PARALLELISM)
    )
    results: dict[float, dict[str, dict]] = {}
    try:
        cluster = bench.start(
            parallelism=PARALLELISM,
            env={"AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": str(PARALLELISM)},
            dag_ids=[PLAN_DAG, STATIC_DAG, NOOP_DAG],
        )
        warm = bench.run(NOOP_DAG)
        log(f"warm-up noop run {warm['makespan']:.1f}s")
        for scale in args.scales:
            results[scale] = {}
            for kind in ("plan", "static"):
                if kind == "plan":
                    info = bench.run(
                        PLAN_DAG, {"goal": plan["goal"], "plan": work_plan(plan, seconds, scale)}, timeout=900
                    )
                else:
                    info = bench.run(STATIC_DAG, {"scale": scale}, timeout=900)
                log(f"scale {scale:g} {kind}: {info['state']} makespan {info['makespan']:.1f}s")
                if info["state"] != "success":
                    print(cluster.diagnostics(), file=sys.stderr)
                    return 1
                info["rows"] = bench.task_times(info)
                info["delays"] = dependency_delays(bench, info, plan, layer_of if kind == "plan" else None)
                results[scale][kind] = info
        peak = _peak_concurrency(bench)
    finally:
        bench.stop()

    print(
        f"\nBarrier: 60 nodes, layers {'-'.join(map(str, WIDTHS))}, durations 1-10 s (seed {args.seed}); "
        f"{time.strftime('%Y-%m-%d')}, 2-core machine"
    )
    print(f"before: {load_before}; after: {load_note()}")
    print(
        f"sum of durations {work:g} s; critical path {cp:g} s ({' → '.join(chain)}); layered bound {lb:g} s "
        f"(slowest per layer: {', '.join(fmt(max(seconds[n] for n in layer), 0) for layer in layers)})"
    )
    print(f"peak concurrent tool calls (whole run of the script): {peak}\n")
    print(
        f"  {'scale':>5} {'CP s':>6} {'LB s':>6} | {'plan s':>7} {'static s':>8} | {'plan/CP':>7}"
        f" {'static/CP':>9} {'plan/LB':>7} {'plan/static':>11} |"
        f" {'dep. delay mean/max s (plan | static)':>38} {'barrier part':>12}"
    )
    for scale, pair in results.items():
        p, s = pair["plan"], pair["static"]
        c, b = cp * scale, lb * scale
        dp, ds = p["delays"], s["delays"]
        print(
            f"  {scale:>5g} {c:>6.0f} {b:>6.0f} | {p['makespan']:>7.1f} {s['makespan']:>8.1f} | "
            f"{p['makespan'] / c:>7.2f} {s['makespan'] / c:>9.2f} {p['makespan'] / b:>7.2f}"
            f" {p['makespan'] / s['makespan']:>11.2f} | {dp['mean']:>14.1f} / {dp['max']:<5.1f}"
            f" | {ds['mean']:>5.1f} / {ds['max']:<5.1f}     {dp.get('barrier_mean', 0):>8.1f}"
        )
    if len(results) >= 2:
        (s1, r1), (s2, r2) = next(iter(results.items())), list(results.items())[-1]
        print("\n  Two scales, makespan = slope x scale + intercept:")
        for kind, bound_name, bound in (("plan", "LB", lb), ("static", "CP", cp)):
            slope = (r2[kind]["makespan"] - r1[kind]["makespan"]) / (s2 - s1)
            intercept = r1[kind]["makespan"] - slope * s1
            print(
                f"    {kind:<7} slope {slope:6.1f} s per unit of scale ({bound_name} = {bound:g} s,"
                f" CP = {cp:g} s, "
                f"slope/CP = {slope / cp:.2f}); intercept (fixed overhead) {intercept:5.1f} s"
            )
    for scale, pair in results.items():
        p, s = pair["plan"], pair["static"]
        stage_table(
            p["rows"],
            p["makespan"],
            [("plan", ["plan"])]
            + [(f"layer_{i}", [f"layer_{i}"]) for i in range(len(layers))]
            + [("finalize", ["finalize"])],
            f"Plan run at scale {scale:g}, stage by stage (s from run start; hop = queued - upstream end; "
            "launch = first start - first queued; to tool = first tool start - first start; "
            "tools = first tool start → last tool end)",
        )
        _spread(p["rows"], "plan", scale)
        _spread(s["rows"], "static", scale)
        print(
            "  median pieces of the node tasks, s (q>start: executor pick-up; launch: start_date → first log "
            "line; parse: DAG file; prep: parse → execute; exec: execute → tool start; post: tool end → end)"
        )
        keys = ("q>start", "launch", "parse", "prep", "exec", "post")
        print("    " + f"{'':<10}" + " ".join(f"{k:>8}" for k in keys))
        groups = [(f"layer_{i}", f"layer_{i}") for i in range(len(layers))] + [
            ("plan all", "layer_"),
            ("static", "n"),
        ]
        for label, prefix in groups:
            m = piece_medians(p["rows"] if prefix != "n" else s["rows"], prefix)
            print("    " + f"{label:<10}" + " ".join(f"{m.get(k, float('nan')):>8.2f}" for k in keys))
        other = [
            r
            for r in p["rows"]
            if not r["task_id"].startswith("layer_") and r["start"] is not None and r["end"] is not None
        ]
        print(
            "  other plan-DAG tasks (start → end, s): "
            + ", ".join(f"{r['task']} {r['end'] - r['start']:.1f}" for r in other)
        )
    return 0


def _spread(rows: list[dict], kind: str, scale: float) -> None:
    """Start-up of the node tasks: how long from queued to tool start (process launch + DAG parse + XCom)."""
    lags = sorted(
        r["tool_start"] - r["queued"] for r in rows if r["tool_start"] is not None and r["queued"] is not None
    )
    if lags:
        print(
            f"  {kind} scale {scale:g}: node queued → tool start: median {lags[len(lags) // 2]:.1f} s, "
            f"p90 {lags[int(len(lags) * 0.9)]:.1f} s, max {lags[-1]:.1f} s over {len(lags)} nodes"
        )


def _peak_concurrency(bench: Bench) -> int:
    from airflow_plan_provider.testing.scripted import CallLog

    return CallLog(bench.calls_folder).max_concurrency()


if __name__ == "__main__":
    sys.exit(main())
