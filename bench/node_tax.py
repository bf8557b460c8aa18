"""The per-node tax: what a plan DAG's node task costs around its tool, next to a static DAG's task.

One cluster per database (LocalExecutor; SQLite, then a fresh PostgreSQL database), two DAGs doing the
same work: a plan DAG whose plan has ``--nodes`` independent nodes, and a static DAG with one
``PythonOperator`` per node; every tool or task sleeps ``--sleep`` seconds and logs the call. After an
unmeasured warm-up run of each, ``--repeat`` rounds run the plan DAG, then the static DAG, one at a
time; the figures are medians over the rounds of each run's mean per node.

Measured by a probe loaded into every process of the cluster (``bench/_taxprobe/sitecustomize.py``,
active only in this benchmark), per task process of a node:

- **task CPU s**: CPU seconds of the task process (fork, start-up, DAG file parse, the task, its reads
  and writes, exit), as its supervisor reaps it; **supervisor CPU s**: the supervisor's own CPU seconds
  while it runs that process (relaying requests to the API server, logs, heartbeats);
- **slot s beyond the tool**: the time the worker slot is held (the supervisor's call) less the tool's
  sleep (from the call log);
- **parse ms**: the DAG file parse in the task process (wall and CPU, and the modules it imported);
- **API requests**: execution-API requests made for the node (by its supervisor), by kind, and the
  bytes received (XCom reads among them);
- **XCom bytes written**: what the run's node tasks left in the ``xcom`` table, per node.

Per run, from the processes' CPU counters: API server, scheduler (main process) and triggerer CPU
seconds during the run, divided by the nodes. The plan DAG's per-run tasks (``plan``, ``finalize``) are
reported apart. Then, in a fresh process holding what a LocalExecutor worker holds (the scheduler's
and the task runner's modules), the parse of ``dags/plan_and_execute.py``, of the bench plan DAG and of
the static DAG file (medians of ``--repeat``).

The cluster's processes keep Python's bytecode cache, as a deployment's do (``PYTHONDONTWRITEBYTECODE``
cleared for them: with it set, every task process compiles the provider's modules from source again,
about 100 ms of CPU per node task on this kind of machine); ``--no-bytecode-cache`` measures that case.

Run::

    .venv/bin/python bench/node_tax.py [--db sqlite postgresql] [--repeat 3]
        [--nodes 8] [--sleep 1] [--cap 16] [--json tax.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: its harness package

from _planbench import (
    DATABASES,
    Bench,
    Run,
    log,
    median,
    plan_dag_source,
    repeat_runs,
    run_each_database,
    static_dag_source,
    warm_up_dags,
    work_plan,
)

from airflow_plan_provider.contract import NODES_TASK

PLAN_DAG, STATIC_DAG = "bench_tax_plan", "bench_tax_static"
PROBE = Path(__file__).resolve().parent / "_taxprobe"
REPO = Path(__file__).resolve().parents[1]
EXAMPLE_DAG = REPO / "dags" / "plan_and_execute.py"

PARSE_SNIPPET = """
import json, sys, time
# what a LocalExecutor worker holds when it forks a task process: it was forked from the scheduler
import airflow.jobs.scheduler_job_runner, airflow.executors.local_executor
import airflow.sdk.execution_time.supervisor, airflow.sdk.execution_time.task_runner
from airflow.dag_processing.dagbag import BundleDagBag

path, folder = sys.argv[1], sys.argv[2]
before, t0, c0 = len(sys.modules), time.perf_counter(), time.process_time()
bag = BundleDagBag(dag_folder=path, safe_mode=False, load_op_links=False, bundle_path=folder,
                   bundle_name="dags-folder")
ms, cpu_ms = (time.perf_counter() - t0) * 1000, (time.process_time() - c0) * 1000
print(json.dumps({"ms": ms, "cpu_ms": cpu_ms, "modules": len(sys.modules) - before,
                  "dags": sorted(bag.dags), "errors": [str(e)[:300] for e in bag.import_errors.values()]}))
"""


def flat_plan(width: int) -> dict[str, Any]:
    return {
        "goal": "node tax",
        "nodes": [
            {"id": str(i), "action": f"node {i}", "tool": "work", "params": {}} for i in range(1, width + 1)
        ],
        "edges": [],
    }


# ------------------------------------------------------------------------------------------ reading


def probe_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def request_kind(record: Mapping[str, Any]) -> str:
    """``GET xcoms``, ``PATCH task-instances/state``, ...: the method and the path without its ids."""
    parts = [p for p in record["path"].split("/") if p][1:]  # after "execution"
    head = parts[0] if parts else ""
    tail = parts[-1] if len(parts) > 1 and head == "task-instances" and len(parts[-1]) < 20 else ""
    return f"{record['method']} {head}{'/' + tail if tail else ''}"


def component_cpu(cluster: Any) -> dict[str, float]:
    """CPU seconds so far of the API server (its process and children), the scheduler (its own process:
    its LocalExecutor workers are counted per task process) and the triggerer (with children)."""
    import psutil

    out: dict[str, float] = {}
    for component, pid in cluster.pids.items():
        try:
            process = psutil.Process(pid)
            processes = (
                [process] if component == "scheduler" else [process, *process.children(recursive=True)]
            )
            total = 0.0
            for p in processes:
                times = p.cpu_times()
                total += times.user + times.system
            out[component] = total
        except psutil.Error:
            continue
    return out


def xcom_bytes(cluster: Any, dag_id: str, run_id: str) -> dict[str, int]:
    """(task id, key) → bytes of the run's XCom values as the database holds them (JSON text)."""
    from sqlalchemy import create_engine, text

    cast = "CAST(value AS TEXT)" if cluster.is_sqlite else "value::text"
    engine = create_engine(cluster.database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(f"SELECT task_id, key, {cast} FROM xcom WHERE dag_id = :d AND run_id = :r"),
                {"d": dag_id, "r": run_id},
            ).all()
    finally:
        engine.dispose()
    out: Counter[str] = Counter()
    for task_id, key, value in rows:
        out[f"{task_id} {key}"] += len((value or "").encode())
    return dict(out)


def run_tax(
    bench: Bench, run: Run, records: Sequence[Mapping[str, Any]], cpu: Mapping[str, float], nodes: int
) -> dict[str, Any]:
    """One run's figures: per node (means over its node tasks) and per run."""
    assert bench.cluster is not None
    mine = [r for r in records if r.get("run_id") == run.run_id]
    processes = [r for r in mine if r["kind"] == "process"]
    parses = [r for r in mine if r["kind"] == "parse"]
    requests = [
        r
        for r in records
        if r["kind"] == "request"
        and (
            (r.get("ti") or {}).get("run_id") == run.run_id or (not r.get("ti") and run.run_id in r["query"])
        )
    ]

    def is_node(record: Mapping[str, Any]) -> bool:
        task = record.get("task_id") or ""
        return task == NODES_TASK or (task.startswith("n") and task[1:].isdigit())

    node_of = {}  # (task id, map index) → node id
    for node, ti in run.node_tis().items():
        node_of[(ti["task_id"], ti["map_index"])] = node
    node_processes = [p for p in processes if is_node(p)]
    held: Counter[str] = Counter()
    for p in node_processes:
        held[node_of.get((p["task_id"], p["map_index"]), "?")] += p["t1"] - p["t0"]
    tools = {n: end - start for n, (start, end) in run.tools.items()}
    beyond = [held[n] - tools.get(n, 0.0) for n in held]
    node_requests = [r for r in requests if r.get("ti") and is_node(r["ti"])]
    kinds = Counter(request_kind(r) for r in node_requests)
    xcoms = xcom_bytes(bench.cluster, run.dag_id, run.run_id)
    node_xcom = sum(b for k, b in xcoms.items() if is_node({"task_id": k.split(" ")[0]}))
    other = [p for p in processes if not is_node(p)]
    return {
        "nodes": nodes,
        "task processes": len(node_processes),
        "task cpu": sum(p["task_cpu"] for p in node_processes) / nodes,
        "supervisor cpu": sum(p["supervisor_cpu"] for p in node_processes) / nodes,
        "slot held": sum(held.values()) / nodes,
        "tool": sum(tools.values()) / nodes,
        "beyond tool": sum(beyond) / nodes,
        "parse ms": median(p["ms"] for p in parses if is_node(p)),
        "parse cpu ms": median(p["cpu_ms"] for p in parses if is_node(p)),
        "parse modules": median(p["modules"] for p in parses if is_node(p)),
        "requests": len(node_requests) / nodes,
        "request kinds": {k: v / nodes for k, v in sorted(kinds.items())},
        "bytes received": sum(r["received"] for r in node_requests) / nodes,
        "xcom bytes received": sum(r["received"] for r in node_requests if "/xcoms/" in r["path"]) / nodes,
        "bytes sent": sum(r["sent"] for r in node_requests) / nodes,
        "xcom bytes written": node_xcom / nodes,
        "xcoms": xcoms,
        "api-server cpu": cpu.get("api-server", 0.0) / nodes,
        "scheduler cpu": cpu.get("scheduler", 0.0) / nodes,
        "triggerer cpu": cpu.get("triggerer", 0.0) / nodes,
        "run tasks": {
            p["task_id"]: {
                "task cpu": p["task_cpu"],
                "supervisor cpu": p["supervisor_cpu"],
                "slot held": p["t1"] - p["t0"],
                "requests": dict(
                    sorted(
                        Counter(
                            request_kind(r)
                            for r in requests
                            if (r.get("ti") or {}).get("task_id") == p["task_id"]
                        ).items()
                    )
                ),
            }
            for p in other
        },
        "run requests": len(requests) - len(node_requests),
        "makespan": run.makespan,
    }


def parse_probe(
    env: Mapping[str, str], files: Mapping[str, tuple[Path, Path]], repeat: int
) -> dict[str, Any]:
    """label → median parse (wall ms, CPU ms, modules) of a DAG file in a fresh worker-like process."""
    out: dict[str, Any] = {}
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as script:
        script.write(PARSE_SNIPPET)
    try:
        for label, (path, folder) in files.items():
            runs = []
            for _ in range(repeat):
                child_env = {k: v for k, v in env.items() if k != "PLAN_BENCH_TAX_LOG"}
                done = subprocess.run(
                    [sys.executable, script.name, str(path), str(folder)],
                    env=child_env,
                    capture_output=True,
                    text=True,
                    timeout=300,
                    check=False,
                )
                lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
                if done.returncode or not lines:
                    raise RuntimeError(f"parse probe of {path} failed: {done.stderr[-2000:]}")
                runs.append(json.loads(lines[-1]))
            if any(r["errors"] for r in runs):
                raise RuntimeError(f"{path} did not parse: {runs[0]['errors']}")
            out[label] = {k: median(r[k] for r in runs) for k in ("ms", "cpu_ms", "modules")} | {
                "raw ms": [round(r["ms"]) for r in runs]
            }
    finally:
        os.unlink(script.name)
    return out


# ------------------------------------------------------------------------------------------ main


def measure(database: str, args: argparse.Namespace) -> dict[str, Any]:
    bench = Bench("node-tax", database)
    probe_log = bench.root / "probe.jsonl"
    plan = flat_plan(args.nodes)
    seconds = {n["id"]: args.sleep for n in plan["nodes"]}
    dags, warm_up_runs = warm_up_dags(bench, args.cap)
    dags |= {
        PLAN_DAG: plan_dag_source(PLAN_DAG, bench.calls_folder, args.cap),
        STATIC_DAG: static_dag_source(STATIC_DAG, plan, seconds, bench.calls, args.cap),
    }
    for dag_id, source in dags.items():
        bench.write_dag(dag_id, source)
    env = {
        "PYTHONPATH": str(PROBE),
        "PLAN_BENCH_TAX_LOG": str(probe_log),
        # Python reads PYTHONDONTWRITEBYTECODE as set when it is not empty
        "PYTHONDONTWRITEBYTECODE": "" if args.bytecode_cache else "1",
    }
    figures: dict[str, Any] = {"plan": [], "static": []}
    try:
        cluster = bench.start(parallelism=args.cap, dag_ids=list(dags), env=env)
        repeat_runs(bench, 1, warm_up_runs)
        conf = {"goal": plan["goal"], "plan": work_plan(plan, seconds)}
        for round_ in range(1, args.repeat + 1):
            for kind, dag_id, run_conf in (("plan", PLAN_DAG, conf), ("static", STATIC_DAG, {})):
                before = component_cpu(cluster)
                run = bench.run(dag_id, run_conf)
                time.sleep(1.0)  # the last task's supervisor writes its record after the task ends
                after = component_cpu(cluster)
                if run.state != "success":
                    raise RuntimeError(f"{kind} run {run.run_id} ended {run.state}")
                cpu = {c: after[c] - before.get(c, after[c]) for c in after}
                tax = run_tax(bench, run, probe_records(probe_log), cpu, args.nodes)
                figures[kind].append(tax)
                log(
                    f"{database} round {round_} {kind}: task cpu {tax['task cpu']:.3f} s, beyond tool"
                    f" {tax['beyond tool']:.2f} s, parse {tax['parse ms']:.0f} ms,"
                    f" {tax['requests']:.1f} requests"
                )
        if args.parse_probe:
            files = {
                "dags/plan_and_execute.py": (EXAMPLE_DAG, EXAMPLE_DAG.parent),
                "bench plan DAG": (bench.dags / f"{PLAN_DAG}.py", bench.dags),
                "static DAG": (bench.dags / f"{STATIC_DAG}.py", bench.dags),
            }
            figures["parse probe"] = parse_probe(cluster.env, files, args.repeat)
    finally:
        bench.stop()
    return figures


NUMBERS = (
    ("task cpu", "task process CPU s", 3),
    ("supervisor cpu", "supervisor CPU s", 3),
    ("slot held", "slot held s", 2),
    ("beyond tool", "slot held beyond the tool s", 2),
    ("parse ms", "DAG file parse in the task ms", 0),
    ("parse cpu ms", "  its CPU ms", 0),
    ("parse modules", "  modules it imported", 0),
    ("requests", "execution API requests", 1),
    ("bytes received", "  bytes received", 0),
    ("xcom bytes received", "  of which XCom reads", 0),
    ("bytes sent", "  bytes sent", 0),
    ("xcom bytes written", "XCom bytes written (in the table)", 0),
    ("api-server cpu", "API server CPU s (run / nodes)", 3),
    ("scheduler cpu", "scheduler CPU s (run / nodes)", 3),
    ("triggerer cpu", "triggerer CPU s (run / nodes)", 3),
)


def summary(rounds: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {key: median(r[key] for r in rounds) for key, _, _ in NUMBERS}
    kinds = sorted({k for r in rounds for k in r["request kinds"]})
    out["request kinds"] = {k: median(r["request kinds"].get(k, 0.0) for r in rounds) for k in kinds}
    tasks = sorted({t for r in rounds for t in r["run tasks"]})
    out["run tasks"] = {
        t: {
            f: median(r["run tasks"][t][f] for r in rounds if t in r["run tasks"])
            for f in ("task cpu", "supervisor cpu", "slot held")
        }
        # the requests of the median round's task (a task makes the same ones each round)
        | {"requests": rounds[len(rounds) // 2]["run tasks"].get(t, {}).get("requests", {})}
        for t in tasks
    }
    out["task processes"] = median(r["task processes"] for r in rounds)
    out["xcoms"] = rounds[len(rounds) // 2]["xcoms"]
    return out


def report(results: Mapping[str, Any]) -> None:
    for database, figures in results.items():
        plan, static = summary(figures["plan"]), summary(figures["static"])
        nodes = figures["plan"][0]["nodes"]
        print(
            f"\nPer-node tax, {database}: {nodes} independent nodes, medians of {len(figures['plan'])} rounds"
        )
        print(f"  {'per node':<40}{'plan':>10}{'static':>10}{'plan/static':>13}")
        for key, label, digits in NUMBERS:
            p, s = plan[key], static[key]
            ratio = f"{p / s:.2f}" if s else "-"
            print(f"  {label:<40}{p:>10.{digits}f}{s:>10.{digits}f}{ratio:>13}")
        p_cpu, s_cpu = (f["task cpu"] + f["supervisor cpu"] for f in (plan, static))
        print(f"  {'CPU s, task + supervisor':<40}{p_cpu:>10.3f}{s_cpu:>10.3f}{p_cpu / s_cpu:>13.2f}")
        print("  requests per node by kind (plan / static):")
        for kind in sorted({*plan["request kinds"], *static["request kinds"]}):
            p_n, s_n = plan["request kinds"].get(kind, 0), static["request kinds"].get(kind, 0)
            print(f"    {kind:<38}{p_n:>10.1f}{s_n:>10.1f}")
        print("  XCom bytes of the median round, by task and key (plan; static):")
        print(f"    {plan['xcoms']}; {static['xcoms']}")
        print(
            "  plan DAG's per-run tasks (median): "
            + ", ".join(
                f"{t} CPU {v['task cpu']:.3f} + {v['supervisor cpu']:.3f} s, slot {v['slot held']:.2f} s"
                for t, v in plan["run tasks"].items()
            )
        )
        for task_id, v in plan["run tasks"].items():
            kinds = v.get("requests") or {}
            listed = ", ".join(f"{kind} {n}" for kind, n in kinds.items())
            print(f"    {task_id}: {sum(kinds.values())} execution-API requests ({listed})")
        print(
            f"  raw per round, plan; static: task CPU {[round(r['task cpu'], 3) for r in figures['plan']]};"
            f" {[round(r['task cpu'], 3) for r in figures['static']]}, beyond tool"
            f" {[round(r['beyond tool'], 2) for r in figures['plan']]};"
            f" {[round(r['beyond tool'], 2) for r in figures['static']]}"
        )
        probe = figures.get("parse probe")
        if probe:
            print("  DAG file parse in a fresh worker-like process (median ms, CPU ms, modules; raw ms):")
            for label, f in probe.items():
                print(
                    f"    {label:<28}{f['ms']:>8.0f}{f['cpu_ms']:>8.0f}{f['modules']:>6.0f}   {f['raw ms']}"
                )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", nargs="+", choices=DATABASES, default=list(DATABASES))
    parser.add_argument("--repeat", type=int, default=3, help="rounds (medians are printed)")
    parser.add_argument("--nodes", type=int, default=8, help="independent nodes of the plan")
    parser.add_argument("--sleep", type=float, default=1.0, help="seconds each tool sleeps")
    parser.add_argument("--cap", type=int, default=16, help="LocalExecutor parallelism, DAG max_active_tasks")
    parser.add_argument("--no-parse-probe", dest="parse_probe", action="store_false")
    parser.add_argument(
        "--no-bytecode-cache",
        dest="bytecode_cache",
        action="store_false",
        help="run the cluster with PYTHONDONTWRITEBYTECODE=1: every task process compiles the provider's"
        " source (and the DAG file) again, as no deployment does",
    )
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument("--report", type=Path, help="print the tables of a --json file; run nothing")
    args = parser.parse_args()
    header = [
        f"{time.strftime('%Y-%m-%d %H:%M %Z')}; LocalExecutor, parallelism {args.cap}; {args.nodes} nodes x"
        f" {args.sleep:g} s; medians of {args.repeat};"
        f" bytecode cache {'on' if args.bytecode_cache else 'off (PYTHONDONTWRITEBYTECODE=1)'}"
    ]
    return run_each_database(args, header, measure, report)


if __name__ == "__main__":
    sys.exit(main())
