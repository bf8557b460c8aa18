"""Many concurrent sessions sharing one Airflow pool: throughput next to the same work as static DAG runs,
and the pool limit held; optionally on the CeleryExecutor with several workers (scale-out).

Each session runs the same 20-node plan (4 layers of 5; node i of layer k needs nodes i and i+1 of
layer k-1; every tool call sleeps 1 s). The plan DAG is built with ``pool="bench_pool"`` (created through
``POST /api/v2/pools`` with 8 slots, deferred instances not counted) so the node instances of every
session share 8 slots; its plan and finalize tasks use the default pool. The static DAG has one
``PythonOperator`` per node, the plan's edges as dependencies, every task in the same pool. Executor
``parallelism`` is 16 (and ``max_active_nodes`` above it) so that the pool, not the executor, is the
binding limit. A round triggers ``--runs`` plan sessions back to back and waits for all of them, then
``--runs`` static runs the same way; ``--repeat`` rounds (every other one in the reverse order), medians
printed. With ``--bookends`` each
round has a third batch: the static DAG with a task before its nodes and one after them (``head`` and
``tail``, in the default pool, doing nothing), the shape of a plan run without a planner, a node
protocol or a result: what two more task instances per run cost on their own.

Printed per DAG: throughput in nodes per minute over the window from the first task start to the last
task end, its ratio to the static DAG's, the ideal for the pool (node-seconds / slots), pool
utilisation (tool-seconds / (slots x window)), per-run makespans, the slot-seconds a node held, where
the rest of the window went (the lead-in from the first task start to the first node's, the tail from the
last node's end to the last task end, and the slot-seconds idle between them per node: slots x window is
slots x lead-in + slot-seconds held + idle + slots x tail), the peak
number of node task processes (from their logs: a deferred instance holds no slot) and of tool calls
at once (must be ≤ the pool), the scheduler's loop time, the CPU seconds the whole machine spent per
node while the batch ran (every process: the cluster's services, the task processes, the benchmark's
own polling; ``/proc/stat``), and with Celery the nodes each worker ran. With ``--probe`` the cluster's
processes load ``node_tax.py``'s probe (``bench/_taxprobe``), and each DAG's task processes are broken
down by task: processes per node, CPU seconds of each process and of its supervisor, the DAG file parse
in it (CPU ms, modules imported) and the execution-API requests its supervisor made. ``--profile-scheduler``
adds a cProfile of the scheduler's loops during each batch and prints where they spent their CPU.

Run::

    .venv/bin/python bench/concurrent_runs.py [--runs 20] [--slots 8] [--sleep 1] [--db sqlite] [--repeat 3]
    # scale-out: CeleryExecutor, PostgreSQL, a Redis server of its own, 2 workers of 8 slots
    .venv/bin/python bench/concurrent_runs.py --db postgresql --celery-workers 2 --runs 10
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _planbench import (
    DATABASES,
    PLAN_IN_CONF_HELP,
    Bench,
    Run,
    load_note,
    log,
    median,
    peak_overlap,
    plan_dag_source,
    static_dag_source,
    work_plan,
)
from _proc import breakdown, snapshot
from _statsd import SCHEDULER_LOOP, loop_summary
from node_tax import PROBE, probe_records, request_kind
from results import head_commit

from bench.simulator.families import quantile

PLAN_DAG, STATIC_DAG = "bench_concurrent_plan", "bench_concurrent_static"
BOOKENDS_DAG = "bench_concurrent_bookends"
DOWNSTREAM_DAG = "bench_concurrent_plan_downstream"
DATABASE_NAMES = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}
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


def machine_cpu_seconds() -> float:
    """The seconds the machine's cores have been busy since it booted, every process counted (user,
    system, interrupts; ``/proc/stat``): task processes that came and went included."""
    ticks = [int(field) for field in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # less idle and iowait


def batch(
    bench: Bench, dag_id: str, conf: dict[str, Any], runs: int
) -> tuple[list[Run], float, dict[str, float]]:
    """``runs`` runs of ``dag_id`` triggered back to back, once all of them ended, the CPU seconds the
    machine spent meanwhile, and the CPU seconds of each part of the cluster (:mod:`_proc`)."""
    assert bench.cluster is not None
    t_first, busy, procs = time.time(), machine_cpu_seconds(), snapshot()
    conf = bench.handed_over(conf)
    triggered = [(bench.cluster.trigger(dag_id, conf), time.time()) for _ in range(runs)]
    out = []
    for run_id, t_trigger in triggered:
        state = bench.cluster.wait_for_run(dag_id, run_id, timeout=1200, poll=1.0)
        out.append(bench.collect(dag_id, run_id, t_trigger, state))
    log(f"{dag_id}: {runs} runs ended {time.time() - t_first:.0f}s after the first trigger")
    parts = breakdown(procs, snapshot(), bench.cluster.pids)
    return out, machine_cpu_seconds() - busy, dict(parts)


def figures(
    bench: Bench,
    runs: list[Run],
    n_nodes: int,
    slots: int,
    sleep: float,
    busy: float,
    parts: dict[str, float],
) -> dict[str, Any]:
    """One batch's figures (JSON-able); ``busy``: the machine's CPU seconds during the batch, ``parts``
    the CPU seconds of each part of the cluster."""
    node_tis = [(run, ti) for run in runs for ti in run.node_tis().values()]
    # slots a node task holds: one period per task process (a deferral gives the slot back)
    segments = [s for run, ti in node_tis for s in bench.process_segments(run, ti)]
    tools = [span for run in runs for span in run.tools.values()]
    tool_seconds = sum(end - start for start, end in tools)
    first_start, last_end = min(r.first_start for r in runs), max(r.last_end for r in runs)
    window = last_end - first_start
    total = n_nodes * len(runs)
    held = sum(end - start for start, end in segments)
    # where the window goes: slots x window = slots x lead-in + held + idle between + slots x tail
    first_node = min((start for start, _ in segments), default=first_start)
    last_node = max((end for _, end in segments), default=first_node)
    makespans = sorted(r.makespan for r in runs)
    latencies = sorted(r.trigger_to_done for r in runs)  # a session's wait: its trigger → its end
    # the scheduler's loops while any run of the batch was on
    loops = bench.metrics.timings(SCHEDULER_LOOP, min(r.trigger for r in runs), max(r.run_end for r in runs))
    return {
        "pool slots": slots,
        "states": dict(Counter(r.state for r in runs)),
        "tool calls": len(tools),
        "expected": total,
        "window s": window,
        "nodes/min": total / window * 60,
        "ideal nodes/min": slots / sleep * 60,
        "pool utilisation": tool_seconds / (slots * window),
        "makespan min/median/max": [makespans[0], median(makespans), makespans[-1]],
        "latency p50 s": median(latencies),
        "latency p95 s": quantile(latencies, 0.95),
        "slot-s per node": held / max(len(node_tis), 1),
        "lead-in s": first_node - first_start,
        "tail s": last_end - last_node,
        "idle slot-s per node": (slots * (last_node - first_node) - held) / total,
        "tool share of slot time": tool_seconds / held if held else None,
        "peak slots": peak_overlap(segments),
        "peak tools": peak_overlap(tools),
        "per worker": dict(Counter(str(ti.get("hostname") or "?") for _, ti in node_tis)),
        "machine cpu per node": busy / total,
        "cpu per node by part": {part: seconds / total for part, seconds in parts.items()},
        **loop_summary(loops),
    }


def by_task(runs: list[Run], records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per task of the batch's runs (``node`` for the node tasks, else the task id): task processes per
    run, and per process the mean task-process and supervisor CPU seconds, the median DAG file parse
    (CPU ms, modules) and the mean execution-API requests (by kind), from the probe's records."""
    run_ids = {run.run_id for run in runs}
    nodes = {(run.run_id, ti["task_id"], ti["map_index"]) for run in runs for ti in run.node_tis().values()}

    def role(record: dict[str, Any]) -> str:
        key = (record.get("run_id"), record.get("task_id"), record.get("map_index"))
        return "node" if key in nodes else str(record.get("task_id"))

    out: dict[str, dict[str, Any]] = {}
    processes = [r for r in records if r["kind"] == "process" and r.get("run_id") in run_ids]
    parses = [r for r in records if r["kind"] == "parse" and r.get("run_id") in run_ids]
    requests = [r for r in records if r["kind"] == "request" and (r.get("ti") or {}).get("run_id") in run_ids]
    for name in sorted({role(p) for p in processes}):
        mine = [p for p in processes if role(p) == name]
        parsed = [p for p in parses if role(p) == name]
        asked = [r for r in requests if role(r["ti"]) == name]
        out[name] = {
            "processes per run": len(mine) / len(runs),
            "task cpu": sum(p["task_cpu"] for p in mine) / len(mine),
            "supervisor cpu": sum(p["supervisor_cpu"] for p in mine) / len(mine),
            "parse cpu ms": median(p["cpu_ms"] for p in parsed) if parsed else 0.0,
            "parse modules": median(p["modules"] for p in parsed) if parsed else 0.0,
            "requests": len(asked) / len(mine),
            "request kinds": {
                k: v / len(mine) for k, v in sorted(Counter(request_kind(r) for r in asked).items())
            },
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="sessions (and static runs) at once")
    parser.add_argument("--slots", type=int, default=8, help="slots of the shared pool")
    parser.add_argument("--sleep", type=float, default=1.0, help="seconds each tool call sleeps")
    parser.add_argument("--db", choices=DATABASES, default="sqlite", help="metadata database")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of (plan batch, static batch)")
    parser.add_argument(
        "--celery-workers", type=int, default=0, help="run the CeleryExecutor with this many workers"
    )
    parser.add_argument(
        "--bookends",
        action="store_true",
        help="a third batch per round: the static DAG with a task before and after its nodes (what a plan"
        " run's shape costs on its own)",
    )
    parser.add_argument(
        "--downstream",
        action="store_true",
        help="another batch per round: the plan DAG with Airflow's downstream weight rule instead of"
        " sessions in turn (every session's instances of one weight)",
    )
    parser.add_argument(
        "--node-cap",
        type=int,
        help="the plan DAGs' NodeExecution.max_active_nodes: the most node instances one session holds"
        " (default: none below the plan's size)",
    )
    parser.add_argument(
        "--probe",
        action="store_true",
        help="load node_tax.py's probe into the cluster's processes: per task, the CPU of its processes and"
        " supervisors, its DAG file parse and its execution-API requests",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="with --probe: a folder for a cProfile of every task process (CPU time; slows them down)",
    )
    parser.add_argument(
        "--profile-scheduler",
        type=Path,
        help="with --probe: a folder for a cProfile of the scheduler's loops during each batch (CPU time),"
        " and the functions it spent most in, per node, printed by DAG",
    )
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument("--plan-in-conf", action="store_true", help=PLAN_IN_CONF_HELP)
    parser.add_argument("--report", type=Path, help="print the table of a --json file; run nothing")
    parser.add_argument(
        "--record",
        type=Path,
        help="with --report: write its figures as a bench/results record (the question"
        " concurrent-20x20 or, with Celery workers, celery-scale-out; with --node-cap, -node-cap after"
        " it) to this file",
    )
    args = parser.parse_args()
    if args.report:
        saved = json.loads(args.report.read_text())
        report(saved["header"], saved["rounds"])
        if args.record:
            write_record(args.record, saved)
        return 0
    if args.celery_workers and args.db != "postgresql":
        parser.error("the CeleryExecutor needs --db postgresql")

    plan = make_plan()
    n_nodes = len(plan["nodes"])
    seconds = {n["id"]: args.sleep for n in plan["nodes"]}
    bench = Bench("bench-concurrent", args.db, plan_in_conf=args.plan_in_conf)
    load_before = load_note()

    def write_plan_dag(dag_id: str, **dag: Any) -> None:
        source = plan_dag_source(
            dag_id,
            bench.calls_folder,
            PARALLELISM,
            pool=POOL,
            node_cap=args.node_cap or True,
            max_active_runs=args.runs,
            **dag,
        )
        bench.write_dag(dag_id, source)

    write_plan_dag(PLAN_DAG)
    bench.write_dag(
        STATIC_DAG,
        static_dag_source(
            STATIC_DAG, plan, seconds, bench.calls, PARALLELISM, pool=POOL, max_active_runs=args.runs
        ),
    )
    kinds = [("plan", PLAN_DAG, True), ("static", STATIC_DAG, False)]
    if args.bookends:
        bench.write_dag(
            BOOKENDS_DAG,
            static_dag_source(
                BOOKENDS_DAG,
                plan,
                seconds,
                bench.calls,
                PARALLELISM,
                pool=POOL,
                max_active_runs=args.runs,
                bookends=True,
            ),
        )
        kinds.append(("bookends", BOOKENDS_DAG, False))
    if args.downstream:
        write_plan_dag(DOWNSTREAM_DAG, operator_args={"weight_rule": "downstream"})
        kinds.append(("downstream", DOWNSTREAM_DAG, True))
    workers = [f"worker-{chr(ord('a') + i)}" for i in range(args.celery_workers)]
    per_worker = PARALLELISM // len(workers) if workers else None
    executor = f"CeleryExecutor, {len(workers)} workers of {per_worker} slots" if workers else "LocalExecutor"
    rounds: list[dict[str, Any]] = []
    probe_log = bench.root / "probe.jsonl"
    env = {"PYTHONPATH": str(PROBE), "PLAN_BENCH_TAX_LOG": str(probe_log)} if args.probe else {}
    if args.probe and args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
        env["PLAN_BENCH_PROFILE"] = str(args.profile.resolve())
    scheduler_profile = args.profile_scheduler if args.probe else None
    if scheduler_profile:
        scheduler_profile.mkdir(parents=True, exist_ok=True)
        env["PLAN_BENCH_PROFILE_SCHEDULER"] = str(scheduler_profile.resolve())
    try:
        cluster = bench.start(
            parallelism=PARALLELISM,
            dag_ids=[dag_id for _, dag_id, _ in kinds],
            env=env,
            celery_workers=workers,
            worker_concurrency=per_worker,
        )
        cluster.api(
            "POST",
            "/pools",
            {"name": POOL, "slots": args.slots, "description": "bench", "include_deferred": False},
        )
        conf = {"goal": plan["goal"], "plan": work_plan(plan, seconds)}
        # one unmeasured session and static run: every worker process has started
        for _, dag_id, planned in kinds:
            batch(bench, dag_id, conf if planned else {}, 1)
        for round_ in range(1, args.repeat + 1):
            measured = {}
            # every other round in the reverse order, so that a drift of the machine over the rounds
            # (its load, the database's tables growing) weighs on every DAG alike
            for kind, dag_id, planned in kinds if round_ % 2 else kinds[::-1]:
                if scheduler_profile:
                    cut_scheduler_profile(scheduler_profile, "-")  # what came before the batch
                runs, busy, parts = batch(bench, dag_id, conf if planned else {}, args.runs)
                if scheduler_profile:
                    cut_scheduler_profile(scheduler_profile, f"{kind}.{round_}")
                measured[kind] = figures(bench, runs, n_nodes, args.slots, args.sleep, busy, parts)
                if args.probe:
                    time.sleep(1.0)  # the last task's supervisor writes its record after the task ends
                    measured[kind]["by task"] = by_task(runs, probe_records(probe_log))
                log(f"round {round_} {kind}: {measured[kind]['nodes/min']:.0f} nodes/min")
            rounds.append(measured)
            header = [
                f"Concurrent sessions: {args.runs} x {n_nodes} nodes ({LAYERS} layers of {WIDTH}, tools"
                f" sleep {args.sleep:g} s), pool {POOL} of {args.slots} slots, parallelism {PARALLELISM},"
                f" {executor}, {args.db}"
                + (f", plan DAGs' node cap {args.node_cap} per session" if args.node_cap else "")
                + f"; {time.strftime('%Y-%m-%d %H:%M %Z')};"
                f" {load_before} before, {load_note()} after",
            ]
            if args.json:
                setup = {
                    "executor": executor,
                    "db": args.db,
                    "node_cap": args.node_cap,
                    "command": " ".join(["python", *sys.argv]),
                }
                args.json.write_text(
                    json.dumps({"header": header, "setup": setup, "rounds": rounds}, default=str)
                )
    finally:
        bench.stop()
    report(header, rounds)
    if scheduler_profile:
        scheduler_report(scheduler_profile, [kind for kind, _, _ in kinds], args.runs * n_nodes)
    ok = all(
        r[kind]["states"] == {"success": args.runs} and r[kind]["peak slots"] <= args.slots
        for r in rounds
        for kind in r
    )
    return 0 if ok else 1


def write_record(path: Path, saved: dict[str, Any]) -> None:
    """A ``bench/results/`` record of a ``--json`` file: the plan DAG's throughput and its sessions'
    latency (p50, p95) next to the static DAG's, medians over the rounds."""
    rounds = saved["rounds"]
    # each measure: its name in the ratios, its figure's name, its key in a batch's figures
    measures = [("throughput", "nodes_per_min", "nodes/min"), ("p50", "p50_s", "latency p50 s")]
    measures.append(("p95", "p95_s", "latency p95 s"))

    def mid(kind: str, key: str) -> float:
        return median(r[kind][key] for r in rounds)

    def ratios_of(kind: str) -> dict[str, float]:
        return {name: mid(kind, key) / mid("static", key) for name, _, key in measures}

    ratios = ratios_of("plan")
    figures = {
        f"{kind}_{figure}": round(mid(kind, key), 1)
        for kind in ("plan", "static")
        for _, figure, key in measures
    } | {f"{name}_ratio": round(value, 3) for name, value in ratios.items()}
    if all("downstream" in r for r in rounds):  # --downstream: the plan DAG without sessions in turn
        figures |= {f"downstream_{name}_ratio": round(v, 3) for name, v in ratios_of("downstream").items()}
    header, setup = saved["header"][0], saved["setup"]
    celery = "CeleryExecutor" in setup["executor"]
    cap = setup.get("node_cap")
    record = {
        "question": ("celery-scale-out" if celery else "concurrent-20x20") + ("-node-cap" if cap else ""),
        "title": (
            "scale-out: sessions sharing a pool, CeleryExecutor"
            if celery
            else "20 sessions x 20 nodes, pool of 8"
        )
        + (f", node cap {cap} per session" if cap else ""),
        "script": "concurrent_runs.py",
        "command": setup["command"],
        "date": time.strftime("%Y-%m-%dT%H:%M", time.gmtime()),
        "machine": f"{os.cpu_count()} cores, {setup['executor']}, {DATABASE_NAMES[setup['db']]}",
        "commit": head_commit(),
        "headline": f"{ratios['throughput']:.2f} x static throughput"
        f" ({figures['plan_nodes_per_min']} vs {figures['static_nodes_per_min']} nodes/min); session latency"
        f" p50 {ratios['p50']:.2f} x, p95 {ratios['p95']:.2f} x static"
        + (
            f"; without sessions in turn {figures['downstream_throughput_ratio']:.2f} x, p50"
            f" {figures['downstream_p50_ratio']:.2f} x, p95 {figures['downstream_p95_ratio']:.2f} x"
            if "downstream_throughput_ratio" in figures
            else ""
        ),
        "figures": figures,
        "target": "throughput >= 0.95 x static; session latency p50, p95 <= 1.1 x static",
        "met": ratios["throughput"] >= 0.95 and ratios["p50"] <= 1.1 and ratios["p95"] <= 1.1,
        "note": f"{header}; medians of {len(rounds)} rounds",
    }
    path.write_text(json.dumps(record, indent=1) + "\n")


def cut_scheduler_profile(folder: Path, name: str) -> None:
    """Ask the probe in the scheduler to write its profile of the loops so far as ``name`` (``-``: drop
    it) and start a new one; wait until a loop has taken the request."""
    cut = folder / "cut"
    cut.write_text(name)
    deadline = time.monotonic() + 30
    while cut.exists() and time.monotonic() < deadline:
        time.sleep(0.1)


def scheduler_report(folder: Path, kinds: list[str], nodes: int, top: int = 25) -> None:
    """The scheduler's CPU in its loops per node, by DAG (every round of a DAG's batches together), and
    the functions it spent most in (cumulative, ms per node), side by side."""
    import pstats

    files = {kind: sorted(str(f) for f in folder.glob(f"{kind}.*.prof")) for kind in kinds}
    stats = {kind: pstats.Stats(*found) for kind, found in files.items() if found}
    if not stats:
        print("  scheduler profile: none written")
        return
    rounds = {kind: len(files[kind]) for kind in stats}

    def per_node(kind: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for (file, line, name), (_, _, _, cumulative, _) in stats[kind].stats.items():  # type: ignore[attr-defined]
            key = f"{Path(file).name}:{line}({name})"
            out[key] = out.get(key, 0.0) + cumulative * 1000 / (nodes * rounds[kind])
        return out

    tables = {kind: per_node(kind) for kind in stats}
    ranked = sorted(
        set().union(*tables.values()), key=lambda key: -max(t.get(key, 0.0) for t in tables.values())
    )
    batches = ", ".join(f"{kind} {count} batches" for kind, count in rounds.items())
    print(f"  scheduler loops, CPU ms per node, cumulative (cProfile; {batches})")
    print(f"    {'function':<72}" + "".join(f"{kind:>10}" for kind in stats))
    for key in ranked[:top]:
        print(f"    {key[:72]:<72}" + "".join(f"{tables[kind].get(key, 0.0):>10.2f}" for kind in stats))


def report(header: list[str], rounds: list[dict[str, Any]]) -> None:
    print("\n" + "\n  ".join(header) + f"; medians of {len(rounds)} round(s)")

    def med(kind: str, key: str) -> float:
        return median(float(r[kind][key]) for r in rounds)

    rows = [
        ("nodes executed (tool calls)", "tool calls", "{:.0f}"),
        ("window: first task start → last task end, s", "window s", "{:.1f}"),
        ("throughput, nodes/min", "nodes/min", "{:.1f}"),
        ("session latency (trigger → end) p50, s", "latency p50 s", "{:.1f}"),
        ("session latency p95, s", "latency p95 s", "{:.1f}"),
        ("pool utilisation (tool-s / (slots x window))", "pool utilisation", "{:.2f}"),
        ("slot-s held per node", "slot-s per node", "{:.2f}"),
        ("lead-in: first task start → first node start, s", "lead-in s", "{:.1f}"),
        ("tail: last node end → last task end, s", "tail s", "{:.1f}"),
        ("slot-s idle per node between them", "idle slot-s per node", "{:.2f}"),
        ("tool share of slot time", "tool share of slot time", "{:.0%}"),
        ("peak node task processes (pool)", "peak slots", "{:.0f}"),
        ("peak tool calls at once", "peak tools", "{:.0f}"),
        ("machine CPU s per node (every process)", "machine cpu per node", "{:.3f}"),
        ("scheduler loop ms, median", "loop ms", "{:.0f}"),
        ("scheduler loop ms, p95", "loop p95 ms", "{:.0f}"),
    ]
    kinds = [kind for kind in ("plan", "static", "bookends", "downstream") if all(kind in r for r in rounds)]
    # the ratios printed: plan / static, and with bookends, bookends / static and plan / bookends; with
    # the downstream plan DAG, it / static
    ratios = (
        [("plan", "static")]
        + ([("bookends", "static"), ("plan", "bookends")] if "bookends" in kinds else [])
        + ([("downstream", "static")] if "downstream" in kinds else [])
    )
    print(
        f"  {'':<48}"
        + "".join(f"{kind:>10}" for kind in kinds)
        + "".join(f"{f'{a}/{b}':>16}" for a, b in ratios)
    )
    for label, key, form in rows:
        if not all(key in r[kind] and r[kind][key] is not None for r in rounds for kind in kinds):
            continue
        values = {kind: med(kind, key) for kind in kinds}
        cells = "".join(f"{form.format(values[kind]):>10}" for kind in kinds)
        shares = "".join(f"{values[a] / values[b]:>16.2f}" if values[b] else f"{'-':>16}" for a, b in ratios)
        print(f"  {label:<48}{cells}{shares}")
    parts = sorted({p for r in rounds for kind in kinds for p in r[kind].get("cpu per node by part", {})})
    if parts:
        print("  CPU ms per node, by part of the cluster (/proc; medians)")
        for part in parts:
            values = {
                kind: median(r[kind].get("cpu per node by part", {}).get(part, 0.0) for r in rounds)
                for kind in kinds
            }
            cells = "".join(f"{values[kind] * 1000:>10.1f}" for kind in kinds)
            shares = "".join(
                f"{values[a] / values[b]:>16.2f}" if values[b] else f"{'-':>16}" for a, b in ratios
            )
            print(f"    {part:<46}{cells}{shares}")
    tasks = sorted({t for r in rounds for kind in kinds for t in r[kind].get("by task", {})})
    if tasks:
        print("  per task process, by task (probe; medians over the rounds of each batch's means)")
        print(
            f"    {'DAG':<10}{'task':<12}{'per run':>9}{'task CPU s':>12}{'superv. s':>11}"
            f"{'parse ms':>10}{'modules':>9}{'requests':>10}"
        )
        for kind in kinds:
            for task in tasks:
                found = [r[kind]["by task"][task] for r in rounds if task in r[kind].get("by task", {})]
                if not found:
                    continue

                def mid(key: str, found: list[dict[str, Any]] = found) -> float:
                    return median(f[key] for f in found)

                print(
                    f"    {kind:<10}{task:<12}{mid('processes per run'):>9.1f}{mid('task cpu'):>12.3f}"
                    f"{mid('supervisor cpu'):>11.3f}{mid('parse cpu ms'):>10.0f}{mid('parse modules'):>9.0f}"
                    f"{mid('requests'):>10.1f}"
                )
        for kind in kinds:
            found = [r[kind]["by task"]["node"] for r in rounds if "node" in r[kind].get("by task", {})]
            if found:
                middle = found[len(found) // 2]["request kinds"]
                print(
                    f"    {kind} node requests by kind: "
                    + ", ".join(f"{k} {v:.1f}" for k, v in middle.items())
                )
    for kind in kinds:
        spans = [r[kind]["makespan min/median/max"] for r in rounds]
        print(
            f"  {kind}: per-run makespan min / median / max "
            + " / ".join(f"{median(s[i] for s in spans):.1f}" for i in range(3))
            + " s; states "
            + ", ".join(f"{k} x {v}" for k, v in rounds[-1][kind]["states"].items())
            + "; nodes per worker (last round) "
            + ", ".join(f"{k} {v}" for k, v in sorted(rounds[-1][kind]["per worker"].items()))
        )
    print(
        "  plan / static by round: "
        + ", ".join(f"{r['plan']['nodes/min'] / r['static']['nodes/min']:.2f}" for r in rounds)
        + (
            "; static with bookends / static by round: "
            + ", ".join(f"{r['bookends']['nodes/min'] / r['static']['nodes/min']:.2f}" for r in rounds)
            if "bookends" in kinds
            else ""
        )
    )
    ideal = rounds[0]["plan"]["ideal nodes/min"]
    plan_rate, static_rate = med("plan", "nodes/min"), med("static", "nodes/min")
    print(
        f"  throughput plan / static: {plan_rate / static_rate:.2f} x (target ≥ 0.95); ideal for the pool"
        f" {ideal:.0f} nodes/min; pool limit held: "
        + ("yes" if all(r[k]["peak slots"] <= r[k]["pool slots"] for r in rounds for k in r) else "NO")
    )
    if "bookends" in kinds:
        bookends_rate = med("bookends", "nodes/min")
        print(
            f"  throughput of the static DAG with a task before and after its nodes / static:"
            f" {bookends_rate / static_rate:.2f} x; plan / that: {plan_rate / bookends_rate:.2f} x"
        )


if __name__ == "__main__":
    sys.exit(main())
