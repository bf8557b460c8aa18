"""Seed scenario: plan DAG vs. a plain loop, the critical path, and the same plan as a static DAG.

The seed plan has 6 nodes in layers 4-1-1 (nodes 1-4 independent, 5 after 1-4, 6 after 5); every tool
sleeps 5 s. Measured side by side in one process and one Airflow:

  (a) loop    the six tools called one after another in a plain Python loop (in-process, 6 x 5 s);
  (b) plan    ``build_plan_dag`` (layered, 3 layers), scripted planner, on the real scheduler:
              makespan = the run's start_date → end_date (REST), and trigger → run end;
  (c) limit   the critical path, 3 x 5 s;
  (d) static  the same shape as an ordinary DAG (one PythonOperator per node sleeping 5 s, real edges);
  (e) noop    a one-task DAG doing nothing: the cost of one Airflow run start (start, one task, end).

DAG runs go plan, static, noop, three rounds (after one noop warm-up run); medians are reported.
Targets: b/c ≤ 1.10 + e/c (within 10 % of the limit plus one Airflow run start); b/d ≤ 1.10.
Then the median plan and static runs are broken down task by task (scheduler hops, launch, start-up
before the tool, tool, after the tool).

Run::

    .venv/bin/python bench/seed_speedup.py [--rounds 3] [--sleep 5]
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _planbench import (
    Bench,
    critical_path,
    load_note,
    log,
    median,
    noop_dag_source,
    piece_medians,
    print_task_table,
    stage_table,
    static_dag_source,
)

from airflow_plan_provider.testing.scripted import CallLog, ScriptedTool
from airflow_plan_provider.testing.seed import seed_plan
from airflow_plan_provider.tools.registry import ToolContext

PLAN_DAG = "bench_seed_plan"
STATIC_DAG = "bench_seed_static"
NOOP_DAG = "bench_noop"

TOOLS = {  # node → tool
    "1": "query_metrics",
    "2": "query_service_health",
    "3": "query_deploys",
    "4": "query_error_logs",
    "5": "analyze",
    "6": "report",
}
SEED_PLAN = seed_plan()


def plan_dag_source(calls_folder: Path, sleep: float) -> str:
    return textwrap.dedent(
        f'''
        """Bench: the seed plan as a plan DAG (scripted planner, scripted tools sleeping {sleep:g} s)."""
        from airflow_plan_provider import Limits, build_plan_dag
        from airflow_plan_provider.testing.scripted import (
            CallLog, ScriptedPlanner, ScriptedTool, scripted_registry,
        )

        LOG = CallLog({str(calls_folder)!r})
        TOOLS = {sorted(set(TOOLS.values()))!r}
        tools = scripted_registry(
            *(ScriptedTool(t, log=LOG, sleep={sleep!r}, returns={{"tool": t}}) for t in TOOLS)
        )
        dag = build_plan_dag(
            {PLAN_DAG!r}, planner=ScriptedPlanner({SEED_PLAN!r}), tools=tools, limits=Limits()
        )
        '''
    )


def run_loop(folder: Path, sleep: float) -> float:
    """(a): the six tools called one after another in this process."""
    calls = CallLog(folder)
    tools = {n: ScriptedTool(t, log=calls, sleep=sleep, returns={"tool": t}) for n, t in TOOLS.items()}
    t0 = time.perf_counter()
    for node in SEED_PLAN["nodes"]:
        tools[node["id"]](ToolContext(node_id=node["id"], idempotency_key=f"loop/loop/{node['id']}/r0"))
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sleep", type=float, default=5.0, help="seconds each tool sleeps")
    args = parser.parse_args()
    sleep = args.sleep
    seconds = {n: sleep for n in TOOLS}
    limit, chain = critical_path(SEED_PLAN, seconds)

    bench = Bench("bench-seed")
    load_before = load_note()
    log(f"(a) loop: 6 tools x {sleep:g} s in-process")
    loop = run_loop(bench.root / "loop_calls", sleep)

    bench.write_dag(PLAN_DAG, plan_dag_source(bench.calls_folder, sleep))
    bench.write_dag(STATIC_DAG, static_dag_source(STATIC_DAG, SEED_PLAN, seconds, bench.calls))
    bench.write_dag(NOOP_DAG, noop_dag_source(NOOP_DAG))
    runs: dict[str, list[dict]] = {"plan": [], "static": [], "noop": []}
    try:
        bench.start(parallelism=8, dag_ids=[PLAN_DAG, STATIC_DAG, NOOP_DAG])
        log("warm-up: one noop run")
        warm = bench.run(NOOP_DAG)
        log(f"  noop warm-up {warm['makespan']:.1f}s")
        for round_ in range(1, args.rounds + 1):
            for kind, dag_id in (("plan", PLAN_DAG), ("static", STATIC_DAG), ("noop", NOOP_DAG)):
                info = bench.run(dag_id)
                runs[kind].append(info)
                log(
                    f"round {round_} {kind}: {info['state']} makespan {info['makespan']:.1f}s "
                    f"trigger→end {info['trigger_to_end']:.1f}s"
                )
                if info["state"] != "success":
                    print(bench.cluster.diagnostics() if bench.cluster else "", file=sys.stderr)
                    return 1

        def pick_median(kind: str) -> dict:
            ordered = sorted(runs[kind], key=lambda r: r["makespan"])
            return ordered[len(ordered) // 2]

        plan_med, static_med = pick_median("plan"), pick_median("static")
        plan_rows = bench.task_times(plan_med)
        static_rows = bench.task_times(static_med)
    finally:
        bench.stop()

    b = median(r["makespan"] for r in runs["plan"])
    b_trig = median(r["trigger_to_end"] for r in runs["plan"])
    d = median(r["makespan"] for r in runs["static"])
    d_trig = median(r["trigger_to_end"] for r in runs["static"])
    e = median(r["makespan"] for r in runs["noop"])
    e_trig = median(r["trigger_to_end"] for r in runs["noop"])
    c = limit

    print(
        f"\nSeed scenario: 6 nodes in layers 4-1-1, every tool sleeps {sleep:g} s; "
        f"{args.rounds} rounds (plan, static, noop), medians; {time.strftime('%Y-%m-%d')}, 2-core machine"
    )
    print(f"before: {load_before}; after: {load_note()}")
    print(f"critical path {' → '.join(chain)} = {c:g} s\n")
    print(
        f"  {'':<36}{'makespan s':>11} {'trigger→end s':>14} {'trigger→start s':>16}   raw makespans (rounds)"
    )
    print(f"  {'(a) loop, in-process (6 x ' + format(sleep, 'g') + ' s)':<36}{loop:>11.1f}")
    for label, kind, ms, trig in (
        ("(b) plan DAG", "plan", b, b_trig),
        ("(d) static DAG (6 PythonOperators)", "static", d, d_trig),
        ("(e) noop DAG (one empty task)", "noop", e, e_trig),
    ):
        raw = ", ".join(f"{r['makespan']:.1f}" for r in runs[kind])
        to_start = median(r["start"] - r["trigger"] for r in runs[kind])
        print(f"  {label:<36}{ms:>11.1f} {trig:>14.1f} {to_start:>16.1f}   {raw}")
    print(f"  {'(c) critical path limit (3 x ' + format(sleep, 'g') + ' s)':<36}{c:>11.1f}")
    print()
    target_bc = 1.10 + e_trig / c  # one Airflow run start = a one-task run, trigger → end
    print(
        f"  speed-up over the loop          a/b = {loop / b:5.2f}   (trigger→end: {loop / b_trig:.2f};"
        f" ideal a/c = {loop / c:.2f})"
    )
    print(
        f"  makespan / critical path        b/c = {b / c:5.2f}   target ≤ 1.10 + (noop trigger→end)/c"
        f" = {target_bc:.2f}  "
        f"-> {'met' if b / c <= target_bc else 'NOT met'}"
    )
    print(
        f"  plan DAG / static DAG           b/d = {b / d:5.2f}   target ≤ 1.10"
        f"  -> {'met' if b / d <= 1.10 else 'NOT met'}"
    )
    print(f"  static DAG / critical path      d/c = {d / c:5.2f}")
    print(
        f"  overhead over the limit         b-c = {b - c:5.1f} s (plan)   d-c = {d - c:.1f} s (static)"
        f"   noop run {e:.1f} s, trigger→end {e_trig:.1f} s"
    )

    plan_end = plan_med["end"] - plan_med["start"]
    static_end = static_med["end"] - static_med["start"]
    print_task_table(
        plan_rows, plan_end, f"Median plan run {plan_med['run_id']} (times in s from the run's start_date)"
    )
    plan_stages = stage_table(
        plan_rows,
        plan_end,
        [(s, [s]) for s in ("plan", "layer_0", "layer_1", "layer_2", "finalize")],
        "Plan run, critical chain (ready = upstream stage end; hop = queued - ready; "
        "launch = start - queued; "
        "to tool = first tool start - start; after = end - last tool end; stage = end - ready)",
    )
    print_task_table(static_rows, static_end, f"Median static run {static_med['run_id']}")
    static_stages = stage_table(
        static_rows,
        static_end,
        [("n1..n4", ["n1", "n2", "n3", "n4"]), ("n5", ["n5"]), ("n6", ["n6"])],
        "Static run, critical chain",
    )
    # Where the plan run's extra time goes, stage against stage.
    plan_gap = plan_end - max(r["end"] for r in plan_rows if r["end"] is not None)
    static_gap = static_end - max(r["end"] for r in static_rows if r["end"] is not None)
    parts = [("plan task (run start → plan end)", plan_stages[0]["stage"])]
    for i, name in enumerate(("layer 0 vs n1..n4", "layer 1 vs n5", "layer 2 vs n6")):
        parts.append((name, plan_stages[i + 1]["stage"] - static_stages[i]["stage"]))
    parts.append(("finalize (last node end → finalize end)", plan_stages[4]["stage"]))
    parts.append(("last task end → run end", plan_gap - static_gap))
    print(f"\nPlan run - static run, median runs: {plan_end - static_end:+.1f} s")
    for name, value in parts:
        print(f"  {name:<42}{value:+6.1f} s")
    print("\nMedian pieces of the node tasks, s (plan: layer_* tasks; static: n* tasks)")
    pp, sp = piece_medians(plan_rows, "layer_"), piece_medians(static_rows, "n")
    print("  " + " ".join(f"{k:>8}" for k in ("", *pp)))
    print("  " + f"{'plan':>8} " + " ".join(f"{pp[k]:>8.2f}" for k in pp))
    print("  " + f"{'static':>8} " + " ".join(f"{sp.get(k, float('nan')):>8.2f}" for k in pp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
