"""The hand-off to a node that waits for its parent on the triggerer, next to a static DAG's hand-off.

``--chains`` independent chains of two nodes: a parent whose tool sleeps ``--parent`` seconds and a
child sleeping ``--child`` seconds. The plan DAG's nodes wait at most ``--slot-wait`` seconds in their
slots (shorter than the parent's tool), so every child defers and waits for its parent on the
triggerer; the static DAG has the same tasks and edges (its child is scheduled once its parent ended);
the mapped-group DAG has one parent task and one child task in a task group mapped over the chains,
where Airflow schedules child instance i once parent instance i ended (a mapped task group's
per-index dependencies: the one way a mapped task's instances depend on another's one by one).
Measured per edge: the parent's tool end → the child's tool start (from the call log). After an
unmeasured run of each DAG, ``--repeat`` rounds of (plan run, static run); medians and quartiles of
all edges printed side by side, with how many children of the plan DAG deferred (their logs).

Run::

    .venv/bin/python bench/deferred.py [--db sqlite] [--repeat 4] [--chains 8] [--parent 4] [--child 0.5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _planbench import (
    DATABASES,
    Bench,
    Run,
    dag_file_head,
    load_note,
    log,
    plan_dag_source,
    static_dag_source,
    work_plan,
)

PLAN_DAG, STATIC_DAG = "bench_deferred_plan", "bench_deferred_static"
GROUP_DAG = "bench_deferred_mapped_group"
DEFERRED = "waiting on the triggerer"  # what a node logs when it defers for its parents


def chains(count: int) -> dict:
    nodes, edges = [], []
    for i in range(count):
        nodes += [
            {"id": f"p{i}", "action": "parent", "tool": "work", "params": {}},
            {"id": f"c{i}", "action": "child", "tool": "work", "params": {}},
        ]
        edges.append({"from": f"p{i}", "to": f"c{i}"})
    return {"goal": "deferred hand-offs", "nodes": nodes, "edges": edges}


def mapped_group_dag_source(
    dag_id: str, calls: Path, count: int, parent: float, child: float, cap: int
) -> str:
    """The chains as one task group mapped over them: ``parent`` → ``child`` inside it, so each child
    instance waits for its own parent instance only. Each task logs its sleep to the bench's call log
    as ``p<i>`` / ``c<i>``."""
    return dag_file_head(
        f"Bench: {count} parent → child chains as one mapped task group.",
        "from airflow.sdk import DAG, task, task_group",
        calls,
    ) + textwrap.dedent(
        f"""

            def _work(node, seconds, context):
                key = f"{{context['dag'].dag_id}}/{{context['run_id']}}/{{node}}"
                _log(node, key, "start")
                _time.sleep(seconds)
                _log(node, key, "end")


            @task
            def parent(i, **context):
                _work(f"p{{i}}", {parent!r}, context)
                return i


            @task
            def child(i, **context):
                _work(f"c{{i}}", {child!r}, context)


            @task_group
            def chain(i):
                parent(i) >> child(i)


            with DAG({dag_id!r}, schedule=None, catchup=False, max_active_tasks={cap!r}) as dag:
                chain.expand(i=list(range({count!r})))
            """
    )


def handoffs(run: Run, count: int) -> list[float]:
    """Per chain: the parent's tool end → the child's tool start, s."""
    return [run.tools[f"c{i}"][0] - run.tools[f"p{i}"][1] for i in range(count)]


def deferred_children(bench: Bench, run: Run) -> int:
    """How many of the run's child instances deferred for their parents (from their task logs)."""
    assert bench.cluster is not None
    found = 0
    for node, ti in run.node_tis().items():
        if not node.startswith("c"):
            continue
        folder = bench.cluster.log_dir / f"dag_id={run.dag_id}" / f"run_id={run.run_id}" / "task_id=nodes"
        logs = (folder / f"map_index={ti['map_index']}").glob("*.log")
        found += any(DEFERRED in path.read_text() for path in logs)
    return found


def quartiles(values: list[float]) -> str:
    low, mid, high = statistics.quantiles(values, n=4)
    return f"{mid:.2f} ({low:.2f} / {high:.2f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=DATABASES, default="sqlite", help="metadata database")
    parser.add_argument("--repeat", type=int, default=4, help="rounds of (plan run, static run)")
    parser.add_argument("--chains", type=int, default=8, help="independent parent → child chains")
    parser.add_argument("--parent", type=float, default=4.0, help="seconds each parent's tool sleeps")
    parser.add_argument("--child", type=float, default=0.5, help="seconds each child's tool sleeps")
    parser.add_argument("--slot-wait", type=float, default=1.0, help="the plan DAG's slot_wait, s")
    args = parser.parse_args()
    plan = chains(args.chains)
    seconds = {n["id"]: args.parent if n["id"].startswith("p") else args.child for n in plan["nodes"]}
    bench = Bench("bench-deferred", args.db)
    cap = 2 * args.chains
    bench.write_dag(PLAN_DAG, plan_dag_source(PLAN_DAG, bench.calls_folder, cap, slot_wait=args.slot_wait))
    bench.write_dag(STATIC_DAG, static_dag_source(STATIC_DAG, plan, seconds, bench.calls, cap))
    bench.write_dag(
        GROUP_DAG, mapped_group_dag_source(GROUP_DAG, bench.calls, args.chains, args.parent, args.child, cap)
    )
    load_before = load_note()
    measured: dict[str, list[float]] = {"plan": [], "static": [], "group": []}
    deferred = 0
    try:
        bench.start(parallelism=cap, dag_ids=[PLAN_DAG, STATIC_DAG, GROUP_DAG])
        conf = {"goal": plan["goal"], "plan": work_plan(plan, seconds)}
        bench.run(PLAN_DAG, conf)  # unmeasured: every process has started once
        bench.run(STATIC_DAG, {})
        bench.run(GROUP_DAG, {})
        for round_ in range(1, args.repeat + 1):
            plan_run = bench.run(PLAN_DAG, conf)
            static_run = bench.run(STATIC_DAG, {})
            group_run = bench.run(GROUP_DAG, {})
            if {plan_run.state, static_run.state, group_run.state} != {"success"}:
                states = f"plan {plan_run.state}, static {static_run.state}, group {group_run.state}"
                log(f"round {round_}: {states}")
                return 1
            measured["plan"] += handoffs(plan_run, args.chains)
            measured["static"] += handoffs(static_run, args.chains)
            measured["group"] += handoffs(group_run, args.chains)
            deferred += deferred_children(bench, plan_run)
            latest = measured["plan"][-args.chains :]
            log(f"round {round_}: median hand-off plan {statistics.median(latest):.2f} s")
    finally:
        bench.stop()
    edges = args.repeat * args.chains
    print(
        f"\nDeferred hand-offs: {args.chains} chains (parent {args.parent:g} s → child {args.child:g} s),"
        f" plan DAG slot_wait {args.slot_wait:g} s, LocalExecutor, {args.db};"
        f" {time.strftime('%Y-%m-%d %H:%M %Z')}; {load_before} before, {load_note()} after"
    )
    print(f"  parent tool end → child tool start, s, median (quartiles) of {edges} edges")
    plan_median, static_median = (statistics.median(measured[k]) for k in ("plan", "static"))
    print(f"    plan DAG (the child deferred: {deferred} of {edges})    {quartiles(measured['plan'])}")
    print(f"    static DAG (the child scheduled)         {quartiles(measured['static'])}")
    print(f"    mapped task group (per-index upstream)   {quartiles(measured['group'])}")
    print(f"    plan / static                            {plan_median / static_median:.2f}")
    group_median = statistics.median(measured["group"])
    print(f"    mapped group / static                    {group_median / static_median:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
