"""Shared code of the plan-DAG benchmarks: plans, DAG files, one cluster per database, run timings.

Not a benchmark itself. Each question (``unbalanced``, ``seed``, ``depth``, ``wide``) is a
:class:`Question`: the DAG files it needs, how it measures, how it reports. :func:`main` starts one
:class:`AirflowCluster` per database (SQLite file, or a fresh PostgreSQL database through
:class:`PostgresDatabase`), writes every question's DAG files into one dags folder, runs the questions one
after another and prints each question's table with the databases side by side.

What is measured (wall-clock seconds, reported and never asserted):

- **makespan**: first task instance start → last task instance end of the run (``start_date`` /
  ``end_date`` of its task instances from the REST API; for the plan DAG that is the ``plan`` task's
  start → ``finalize``'s end); **trigger → done**: our ``POST .../dagRuns`` → the run's ``end_date``;
- tool calls: a cross-process call log (``calls.jsonl``) written by the plan DAG's ``work`` tool and by
  the static DAG's tasks alike, so both are measured the same way;
- slots: the periods a node task instance holds a worker slot, read from its own log file (a process
  starts at ``::group::Pre Execute`` and gives the slot back when it ends or pauses as DEFERRED; the
  task instance's ``start_date`` stays the first start across a deferral, so it cannot tell this);
- **scheduler loop**: the scheduler's own timing of each scheduling loop (StatsD
  ``scheduler.scheduler_loop_duration``, received by :mod:`_statsd`) while the run was on, trigger to end.
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import itertools
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from airflow_plan_provider.contract import FINALIZE_TASK, LANE_SEPARATOR, NODES_TASK, PLAN_TASK

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: its harness package

from _statsd import SCHEDULER_LOOP, StatsdReceiver, loop_summary

from harness.cluster import AirflowCluster
from harness.postgres import PostgresDatabase
from harness.servers import RedisServer

Plan = dict[str, Any]
DATABASES = ("sqlite", "postgresql")
WARM_PLAN, WARM_STATIC = "bench_warm_plan", "bench_warm_static"
WARM_UP_SECONDS = 1.0
WARM_UP_PARENT_SECONDS = 4.0


def warm_up_plan(width: int) -> Plan:
    """``width`` independent nodes sleeping ``WARM_UP_SECONDS`` (the first ``WARM_UP_PARENT_SECONDS``),
    and one more node, a child of the first: run once as a plan and once as a static DAG before the
    measured rounds (:func:`warm_up_dags`), it puts a task through every executor worker (the
    LocalExecutor starts ``parallelism`` workers, and a worker's first task pays imports its later ones
    do not), so neither DAG of a round starts on a worker the other one warmed. In the plan DAG the
    child gets its slot while its parent still runs and waits on the triggerer (the warm-up DAG's
    ``slot_wait`` is 0): the triggerer builds Airflow's in-process execution API on its first request
    (the first read of a deferred node's trigger), seconds that a long-lived triggerer pays once and a
    measured round must not."""
    roots = [
        {
            "id": str(i),
            "action": "warm",
            "tool": "work",
            "params": {"seconds": WARM_UP_PARENT_SECONDS if i == 1 else WARM_UP_SECONDS},
        }
        for i in range(1, width + 1)
    ]
    child = {"id": "w", "action": "warm on the triggerer", "tool": "work", "params": {"seconds": 0.1}}
    return {"goal": "warm-up", "nodes": [*roots, child], "edges": [{"from": "1", "to": "w"}]}


def warm_up_dags(bench: Bench, cap: int) -> tuple[dict[str, str], list[tuple[str, str, dict[str, Any]]]]:
    """The warm-up plan's DAG files (plan DAG, static DAG) and the runs :func:`repeat_runs` takes."""
    warm_up = warm_up_plan(cap)
    seconds = {n["id"]: n["params"]["seconds"] for n in warm_up["nodes"]}
    dags = {
        WARM_PLAN: plan_dag_source(WARM_PLAN, bench.calls_folder, cap, slot_wait=0.0),
        WARM_STATIC: static_dag_source(WARM_STATIC, warm_up, seconds, bench.calls, cap),
    }
    runs = [("warm-up plan", WARM_PLAN, {"plan": warm_up}), ("warm-up static", WARM_STATIC, {})]
    return dags, runs


# ------------------------------------------------------------------------------------------ small helpers


def ts(value: str | None) -> float | None:
    """An API or log timestamp (ISO 8601) as epoch seconds."""
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def median(values: Iterable[float]) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None or value != value else f"{value:.{digits}f}"


def load_note() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run_each_database(
    args: argparse.Namespace,
    header: list[str],
    measure: Callable[[str, argparse.Namespace], dict[str, Any]],
    report: Callable[[dict[str, Any]], None],
) -> int:
    """The body of a one-cluster-per-database script: with ``--report FILE``, print a saved ``--json``
    file's tables and run nothing; else ``measure`` each of ``args.db`` (the load average noted before and
    after in ``header``, the figures saved to ``--json`` after each), print the tables, and return 1 if a
    database could not be measured. ``report`` prints the tables of the measured databases; the header
    and what could not be measured are printed here."""
    if args.report:
        saved = json.loads(args.report.read_text())
        results, header = saved["results"], saved["header"]
    else:
        results = {}
        for database in args.db:
            before = load_note()
            try:
                results[database] = measure(database, args)
            except Exception as error:
                log(f"{database}: not measured: {error!r}")
                results[database] = {"error": repr(error)[:500]}
            header.append(f"{database}: {before} before, {load_note()} after")
            save_figures(args.json, results, header)
    print("\n" + "\n  ".join(header))
    report({database: figures for database, figures in results.items() if "error" not in figures})
    for database, figures in results.items():
        if "error" in figures:
            print(f"\n{database}: not measured: {figures['error']}")
    return 0 if not any("error" in r for r in results.values()) else 1


def save_figures(path: Path | None, results: dict[str, Any], header: list[str]) -> None:
    """Write ``results`` and ``header`` to ``path`` (a ``--json`` file ``--report`` reads), if given."""
    if path is not None:
        path.write_text(json.dumps({"results": results, "header": header}, default=str))


def peak_overlap(intervals: Iterable[tuple[float, float]]) -> int:
    """The most intervals open at one moment (an end and a start at the same instant do not overlap)."""
    points = sorted(p for start, end in intervals for p in ((start, 1), (end, -1)))
    running = peak = 0
    for _, delta in sorted(points, key=lambda p: (p[0], p[1])):
        running += delta
        peak = max(peak, running)
    return peak


# ------------------------------------------------------------------------------------------ plans


def edges_of(plan: Plan) -> list[tuple[str, str]]:
    return [(e["from"], e["to"]) for e in plan.get("edges", [])]


def parents_of(plan: Plan) -> dict[str, list[str]]:
    parents: dict[str, list[str]] = {n["id"]: [] for n in plan["nodes"]}
    for source, target in edges_of(plan):
        parents[target].append(source)
    return parents


def layers_of(plan: Plan) -> list[list[str]]:
    """Topological generations (a node's layer is its longest distance from a root)."""
    parents = parents_of(plan)
    depth: dict[str, int] = {}
    for node in parents:  # plans below are generated in topological order
        depth[node] = 1 + max((depth[p] for p in parents[node]), default=-1)
    out: list[list[str]] = [[] for _ in range(max(depth.values()) + 1)]
    for node in parents:
        out[depth[node]].append(node)
    return out


def critical_path(plan: Plan, seconds: Mapping[str, float]) -> tuple[float, list[str]]:
    """Longest sum of node durations along any chain, and the chain."""
    parents = parents_of(plan)
    finish: dict[str, float] = {}
    via: dict[str, str | None] = {}
    for layer in layers_of(plan):
        for node in layer:
            best = max(parents[node], key=lambda p: finish[p], default=None)
            finish[node] = (finish[best] if best else 0.0) + seconds[node]
            via[node] = best
    end = max(finish, key=lambda n: finish[n])
    chain = [end]
    while via[chain[-1]]:
        chain.append(via[chain[-1]])  # type: ignore[arg-type]
    return finish[end], chain[::-1]


def random_layered_plan(
    widths: Sequence[int], seconds: Callable[[random.Random], float], seed: int, goal: str
) -> tuple[Plan, dict[str, float]]:
    """Layers of the given widths (ids 1..N in topological order); every node outside layer 0 has one
    parent in the layer just before (that fixes its layer) and up to two more in any earlier layer."""
    rng = random.Random(seed)
    layers: list[list[str]] = []
    next_id = 1
    for width in widths:
        layers.append([str(next_id + i) for i in range(width)])
        next_id += width
    durations = {n: seconds(rng) for layer in layers for n in layer}
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
        {"id": n, "action": f"step {n} ({durations[n]:g} s)", "tool": "work", "params": {}} for n in durations
    ]
    plan = {"goal": goal, "nodes": nodes, "edges": edges}
    assert layers_of(plan) == layers, "the generated edges must keep the intended layers"
    return plan, durations


def chain_plan(length: int, seconds: float) -> tuple[Plan, dict[str, float]]:
    nodes = [
        {"id": str(i), "action": f"link {i}", "tool": "work", "params": {}} for i in range(1, length + 1)
    ]
    edges = [{"from": str(i), "to": str(i + 1)} for i in range(1, length)]
    return {"goal": f"a chain of {length}", "nodes": nodes, "edges": edges}, {n["id"]: seconds for n in nodes}


def work_plan(plan: Plan, seconds: Mapping[str, float], scale: float = 1.0) -> Plan:
    """``plan`` with every node calling ``work`` for its (scaled) seconds."""
    nodes = [
        {**n, "tool": "work", "params": {"seconds": round(seconds[n["id"]] * scale, 3)}}
        for n in plan["nodes"]
    ]
    return {**plan, "nodes": nodes}


# ------------------------------------------------------------------------------------------ DAG files

PLAN_IN_CONF_HELP = "trigger the plan DAG with the plan in the run's conf (default: its planner reads a file)"
PLANS_FOLDER = "plans"  # of a bench, beside its call log's folder: the plan files its runs' confs name

CALL_LOG_WRITER = """
import json as _json, os as _os, time as _time

CALLS = {calls!r}


def _log(node, key, event):
    line = _json.dumps({{"tool": "work", "node": node, "key": key, "pid": _os.getpid(),
                         "event": event, "t": _time.time()}}, sort_keys=True) + "\\n"
    fd = _os.open(CALLS, _os.O_WRONLY | _os.O_APPEND | _os.O_CREAT, 0o644)
    try:
        _os.write(fd, line.encode())
    finally:
        _os.close(fd)
"""


def dag_file_head(doc: str, imports: str, calls: Path) -> str:
    """The start of a bench DAG file: its docstring, its ``imports`` and the writer of the call log
    ``calls`` (``_log(node, key, event)``), which the plan DAG's tools write to as well."""
    return f'\n"""{doc}"""\n{imports}\n' + CALL_LOG_WRITER.format(calls=str(calls))


# the static DAG's head and tail tasks (static_dag_source(bookends=True)), inside its ``with DAG`` block
BOOKENDS = """\
    head = PythonOperator(task_id="head", python_callable=print, pool="default_pool")
    tail = PythonOperator(task_id="tail", python_callable=print, pool="default_pool", trigger_rule="all_done")
    for op in ops.values():
        if not op.upstream_task_ids:
            head >> op
        if not op.downstream_task_ids:
            op >> tail
"""


def static_dag_source(
    dag_id: str,
    plan: Plan,
    seconds: Mapping[str, float],
    calls: Path,
    cap: int,
    *,
    pool: str | None = None,
    max_active_runs: int = 16,
    bookends: bool = False,
) -> str:
    """An ordinary Airflow DAG with one PythonOperator per plan node (sleeping its seconds times the run
    conf's ``scale``) and the plan's edges as task dependencies, ``max_active_tasks=cap``, every task in
    ``pool`` if given. Imports Airflow and the stdlib only; logs each sleep to the same call log as the
    plan DAG's tools.

    ``bookends``: the DAG has the shape of a plan DAG's run too, a task before every node (``head``) and
    one after them all (``tail``, trigger rule ``all_done``), both in the default pool as the plan DAG's
    planning and finalize tasks are, and each doing nothing: what that shape costs on its own."""
    kwargs: dict[str, Any] = {
        "schedule": None,
        "catchup": False,
        "max_active_tasks": cap,
        "max_active_runs": max_active_runs,
    }
    if pool:
        kwargs["default_args"] = {"pool": pool}
    return (
        dag_file_head(
            f"Bench: a plan written as a static DAG ({len(plan['nodes'])} tasks).",
            "from airflow.sdk import DAG\n"
            "from airflow.providers.standard.operators.python import PythonOperator",
            calls,
        )
        + textwrap.dedent(
            f"""

            SECONDS = {dict(seconds)!r}
            EDGES = {edges_of(plan)!r}


            def work(node, **context):
                key = f"{{context['dag'].dag_id}}/{{context['run_id']}}/{{node}}"
                scale = float((context["dag_run"].conf or {{}}).get("scale", 1))
                _log(node, key, "start")
                _time.sleep(SECONDS[node] * scale)
                _log(node, key, "end")
                return {{"node": node}}


            with DAG({dag_id!r}, **{kwargs!r}) as dag:
                ops = {{n: PythonOperator(task_id=f"n{{n}}", python_callable=work, op_kwargs={{"node": n}})
                       for n in SECONDS}}
                for source, target in EDGES:
                    ops[source] >> ops[target]
            """
        )
        + (BOOKENDS if bookends else "")
    )


def plan_dag_source(
    dag_id: str,
    calls_folder: Path,
    cap: int,
    max_nodes: int = 200,
    pool: str | None = None,
    node_cap: bool | int = True,
    slot_wait: float | None = None,
    start_on_triggerer: bool = False,
    **dag: Any,
) -> str:
    """A plan DAG with the provider's defaults but for the cap, the static DAG's (``max_active_tasks``
    = ``cap``: at most ``cap`` task instances hold a worker slot; ``max_active_nodes`` = ``max_nodes``,
    so no node task cap counts the nodes that wait on the triggerer), ``max_nodes`` (also the step budget),
    ``pool``, ``slot_wait`` (seconds; None: the provider's default) and ``dag`` (more DAG arguments).
    Its planner returns the plan in the file of the bench's plans folder (beside ``calls_folder``) that
    the run's conf names as ``plan_file`` (:meth:`Bench.handed_over`); it also runs a plan given in the
    run's conf itself. Its one tool
    ``work(seconds)`` sleeps and logs the call through :class:`CallLog`. ``start_on_triggerer``: the
    nodes with parents start on the triggerer (no node task cap, and no pool counting deferred
    instances, as that setting needs)."""
    # ``node_cap=False``: max_active_nodes=None, no task-level cap on the node task; a number: that cap
    if isinstance(node_cap, bool):
        node_cap = max(cap, max_nodes) if node_cap else None
    if start_on_triggerer:
        node_cap = None
    execution = f"max_active_nodes={node_cap}, pool={pool!r}"
    if start_on_triggerer:
        execution += ", pools_count_deferred=False, start_on_triggerer=True"
    if slot_wait is not None:
        execution += f", slot_wait=timedelta(seconds={slot_wait!r})"
    limits = f"max_nodes={max_nodes}"
    return textwrap.dedent(
        f'''
        """Bench: a plan DAG running the plan its planner reads from the file the run's conf names."""
        import time
        from datetime import timedelta
        from pathlib import Path

        from airflow_plan_provider import Budgets, Limits, NodeExecution, build_plan_dag
        from airflow_plan_provider.testing.scripted import CallLog
        from airflow_plan_provider.tools.registry import ToolRegistry

        LOG = CallLog({str(calls_folder)!r})
        PLANS = Path({str(calls_folder.parent / PLANS_FOLDER)!r})
        registry = ToolRegistry()


        class PlanFiles:
            """The plan in the plans folder's file that the run's conf names (``plan_file``)."""

            def plan(self, request):
                name = (request.conf or {{}}).get("plan_file")
                if request.is_replan or not name:
                    return None
                return (PLANS / Path(name).name).read_text()


        @registry.tool(description="sleep for a while")
        def work(seconds: float = 1.0, *, ctx):
            with LOG.call("work", ctx):
                time.sleep(seconds)
            return {{"node": ctx.node_id, "slept": seconds}}


        dag = build_plan_dag(
            {dag_id!r},
            planner=PlanFiles(),
            tools=registry,
            limits=Limits({limits}),
            budgets=Budgets(max_steps={max_nodes}),
            execution=NodeExecution({execution}),
            max_active_tasks={cap},
            **{dag!r},
        )
        '''
    )


# ------------------------------------------------------------------------------------------ runs


@dataclass
class Run:
    """One finished DAG run: its timings (epoch seconds) and its task instances."""

    dag_id: str
    run_id: str
    state: str
    trigger: float
    run_end: float
    tis: list[dict[str, Any]]
    tools: dict[str, tuple[float, float]]  # node id → tool call (start, end)
    loop_ms: list[float] = field(default_factory=list)  # the scheduler's loops while the run was on
    first_start: float = 0.0
    last_end: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        ran = [ti for ti in self.tis if ti.get("start") is not None and ti.get("end") is not None]
        self.first_start = min(ti["start"] for ti in ran)
        self.last_end = max(ti["end"] for ti in ran)

    @property
    def makespan(self) -> float:
        return self.last_end - self.first_start

    @property
    def trigger_to_done(self) -> float:
        return self.run_end - self.trigger

    def ti(self, task_id: str) -> dict[str, Any] | None:
        return next((t for t in self.tis if t["task_id"] == task_id), None)

    def node_tis(self) -> dict[str, dict[str, Any]]:
        """node id → its task instance (plan DAG: ``nodes[i]``, or a lane's ``nodes__<lane>[i]``,
        labelled ``id · action``; static DAG: ``n<id>``)."""
        out = {}
        for ti in self.tis:
            if ti["task_id"] == NODES_TASK or ti["task_id"].startswith(NODES_TASK + LANE_SEPARATOR):
                out[(ti.get("rendered_map_index") or "").split(" · ")[0]] = ti
            elif ti["task_id"].startswith("n") and ti["task_id"][1:] in self.tools:
                out[ti["task_id"][1:]] = ti
        return out


class AsGiven(dict[str, Any]):
    """A run's conf to trigger as it is: a plan in it stays in the conf (see :meth:`Bench.handed_over`)."""


class Bench:
    """A temporary dags folder and call log, and (once started) the cluster running them on ``database``."""

    def __init__(self, prefix: str, database: str = "sqlite", *, plan_in_conf: bool = False) -> None:
        if database not in DATABASES:
            raise ValueError(f"database must be one of {DATABASES}, not {database!r}")
        self.database = database
        self.plan_in_conf = plan_in_conf  # see handed_over
        self.root = Path(tempfile.mkdtemp(prefix=f"{prefix}-"))
        atexit.register(shutil.rmtree, self.root, ignore_errors=True)
        self.dags = self.root / "dags"
        self.dags.mkdir()
        self.calls_folder = self.root / "calls"
        self.calls_folder.mkdir()
        self.calls = self.calls_folder / "calls.jsonl"
        self.plans = self.root / PLANS_FOLDER
        self.plans.mkdir()
        self.cluster: AirflowCluster | None = None
        self._stack = ExitStack()
        self.metrics = StatsdReceiver()  # for as long as the benchmark runs (its thread is a daemon)

    def write_dag(self, dag_id: str, source: str) -> None:
        (self.dags / f"{dag_id}.py").write_text(source)

    def start(
        self,
        *,
        parallelism: int,
        dag_ids: Sequence[str],
        env: Mapping[str, str] | None = None,
        celery_workers: Sequence[str] = (),
        worker_concurrency: int | None = None,
    ) -> AirflowCluster:
        """Start the cluster (``env``: more environment for its processes) and unpause ``dag_ids``. With
        ``celery_workers``, the CeleryExecutor with those workers (``worker_concurrency`` slots each) and
        a Redis server of its own as the broker (the database must be PostgreSQL)."""
        t0 = time.monotonic()
        url = None
        if self.database == "postgresql":
            url = self._stack.enter_context(PostgresDatabase(prefix="plan_bench")).url
        options: dict[str, Any] = {}
        if celery_workers:
            redis = self._stack.enter_context(RedisServer())
            options = {"broker_url": redis.url, "celery_workers": tuple(celery_workers)}
            if worker_concurrency:
                options["worker_concurrency"] = worker_concurrency
        env = {
            "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": str(parallelism),
            **self.metrics.env(),
            **(env or {}),
        }
        self.cluster = self._stack.enter_context(
            AirflowCluster(
                self.dags,
                env=env,
                parallelism=parallelism,
                startup_timeout=180,
                database_url=url,
                **options,
            )
        )
        for dag_id in dag_ids:
            self.cluster.wait_for_dag(dag_id, timeout=240)
            self.cluster.unpause(dag_id)
        log(f"{self.database}: cluster up with {len(dag_ids)} DAGs in {time.monotonic() - t0:.0f}s")
        return self.cluster

    def stop(self) -> None:
        self._stack.close()
        self.cluster = None

    def run(self, dag_id: str, conf: Mapping[str, Any] | None = None, timeout: float = 1200) -> Run:
        """Trigger (the conf :meth:`handed_over`), wait for the end, and read the run back (task instances,
        tool calls)."""
        assert self.cluster is not None
        t_trigger = time.time()
        run_id = self.cluster.trigger(dag_id, self.handed_over(conf or {}))
        state = self.cluster.wait_for_run(dag_id, run_id, timeout=timeout, poll=0.25)
        return self.collect(dag_id, run_id, t_trigger, state)

    def handed_over(self, conf: Mapping[str, Any]) -> dict[str, Any]:
        """The conf to trigger a plan DAG with: a ``plan`` in ``conf`` goes to the plans folder and the
        conf names its file (``plan_file``), so the plan DAG's planner returns it, as a planner would, and
        the run's conf stays small. Airflow loads a run with each of its task instances and decodes the
        run's conf once per instance: with a 500-node plan in the conf (71 kB), 73 % of the scheduler's
        time went to decoding it (py-spy). ``plan_in_conf`` (or a conf given as :class:`AsGiven`) keeps
        the plan in the conf, to measure that (``wide.py --wide-conf-plan``)."""
        if "plan" not in conf or self.plan_in_conf or isinstance(conf, AsGiven):
            return dict(conf)
        text = json.dumps(conf["plan"], sort_keys=True)
        name = hashlib.sha256(text.encode()).hexdigest()[:16] + ".json"
        (self.plans / name).write_text(text)
        return {**{k: v for k, v in conf.items() if k != "plan"}, "plan_file": name}

    def collect(self, dag_id: str, run_id: str, t_trigger: float, state: str) -> Run:
        """A finished run read back: its task instances (REST API) and tool calls (call log)."""
        assert self.cluster is not None
        run = self.cluster.get_run(dag_id, run_id)
        tis = [
            {
                **ti,
                "queued": ts(ti.get("queued_when")),
                "start": ts(ti.get("start_date")),
                "end": ts(ti.get("end_date")),
            }
            for ti in self.cluster.task_instances(dag_id, run_id)
            if ti.get("queued_when")  # skipped without running (e.g. replan) has none
        ]
        end = ts(run["end_date"])
        assert end is not None, run
        loops = self.metrics.timings(SCHEDULER_LOOP, t_trigger, end)
        result = Run(dag_id, run_id, state, t_trigger, end, tis, self.tool_spans(run_id), loops)
        if state != "success":
            log(f"{dag_id} {run_id} ended {state}:\n{self.cluster.diagnostics()}")
        return result

    def tool_spans(self, run_id: str) -> dict[str, tuple[float, float]]:
        spans: dict[str, list[float]] = {}
        if self.calls.exists():
            for line in self.calls.read_text().splitlines():
                entry = json.loads(line)
                if f"/{run_id}/" in entry["key"]:
                    spans.setdefault(entry["node"], [0.0, 0.0])[0 if entry["event"] == "start" else 1] = (
                        entry["t"]
                    )
        return {n: (s, e) for n, (s, e) in spans.items()}

    def process_segments(self, run: Run, ti: Mapping[str, Any]) -> list[tuple[float, float]]:
        """The periods the task instance held a worker slot, one per task process, from its log files
        (every attempt): a process's first line is ``::group::Pre Execute``, its last is the last line
        before the next process's first (after it deferred, rescheduled itself or failed); the last
        process ends at the task instance's ``end_date``, when its state ended and Airflow's pool gave
        the slot back. (A process logs for up to a second more after that, its ``Post Execute``; a
        period that ran to its last line counted a 9th-11th slot in a pool of 8 that was never
        exceeded.)"""
        assert self.cluster is not None
        folder = (
            self.cluster.log_dir
            / f"dag_id={run.dag_id}"
            / f"run_id={run.run_id}"
            / f"task_id={ti['task_id']}"
        )
        if ti["map_index"] >= 0:
            folder = folder / f"map_index={ti['map_index']}"
        segments: list[list[float]] = []
        for attempt in range(1, (ti.get("try_number") or 1) + 1):
            try:
                lines = (folder / f"attempt={attempt}.log").read_text().splitlines()
            except OSError:
                continue
            for line in lines:
                try:
                    entry = json.loads(line)
                    at = ts(entry.get("timestamp"))
                except (ValueError, AttributeError):
                    continue
                if at is None:
                    continue
                if entry.get("event") == "::group::Pre Execute" or not segments:
                    segments.append([at, at])
                segments[-1][1] = at
        if not segments:
            return [(ti["start"], ti["end"])]
        segments[-1][1] = ti["end"]
        return [(start, end) for start, end in segments]


# ------------------------------------------------------------------------------------------ analysis


def handoffs(bench: Bench, run: Run, plan: Plan) -> list[dict[str, Any]]:
    """For every node with parents: its last parent to finish, and where the time between that parent's
    tool end and this node's tool start went.

    - ``post``: parent tool end → parent task instance end (record push, task end);
    - ``pickup``: parent task end → child tool start;
    - ``kind``: ``in slot`` when the child's task process was already running when the parent ended
      (it noticed by polling), ``started`` when a process started after the parent ended (a fresh
      start, or a resume from deferral);
    - for ``started``: ``hop`` parent end → child queued (scheduler, or triggerer + scheduler), ``start``
      queued → process start, ``to_tool`` process start → tool start (process start-up, DAG parse, reads).
    """
    tis = run.node_tis()
    out = []
    for node, parents in parents_of(plan).items():
        if not parents or node not in run.tools:
            continue
        last = max(parents, key=lambda p: run.tools[p][1])
        parent_ti, child_ti = tis[last], tis[node]
        tool_end, tool_start = run.tools[last][1], run.tools[node][0]
        parent_end = parent_ti["end"]
        segment = next(
            (s for s in bench.process_segments(run, child_ti) if s[0] <= tool_start <= s[1]),
            (child_ti["start"], child_ti["end"]),
        )
        row = {
            "node": node,
            "parent": last,
            "total": tool_start - tool_end,
            "post": parent_end - tool_end,
            "pickup": tool_start - parent_end,
            "kind": "in slot" if segment[0] < parent_end else "started",
        }
        if row["kind"] == "started":
            queued = child_ti["queued"] if child_ti["queued"] is not None else segment[0]
            row |= {
                "hop": queued - parent_end,
                "start": segment[0] - queued,
                "to_tool": tool_start - segment[0],
            }
        out.append(row)
    return out


def realized_chain(bench: Bench, run: Run, plan: Plan) -> dict[str, Any]:
    """The chain of tool calls that set the run's makespan: from the tool that ended last, back through
    the parent whose tool ended last (the one the node waited for), to a root. Its ``gaps`` (parent tool
    end → child tool start, each with its hand-off kind) are the time the run lost between tools on its
    real critical path; with the head (first start → the chain's first tool) and the tail (last tool end
    → run end) they add up to the makespan less the chain's tool time."""
    parents = parents_of(plan)
    rows = {r["node"]: r for r in handoffs(bench, run, plan)}
    node = max(run.tools, key=lambda n: run.tools[n][1])
    chain = [node]
    while parents.get(chain[-1]):
        chain.append(max(parents[chain[-1]], key=lambda p: run.tools[p][1]))
    chain.reverse()
    gaps = [(n, run.tools[n][0] - run.tools[p][1], rows[n]["kind"]) for p, n in itertools.pairwise(chain)]
    return {
        "nodes": chain,
        "tools": sum(run.tools[n][1] - run.tools[n][0] for n in chain),
        "head": run.tools[chain[0]][0] - run.first_start,
        "gaps": [round(g, 2) for _, g, _ in gaps],
        "kinds": [kind for _, _, kind in gaps],
        "gap sum": sum(g for _, g, _ in gaps),
        "tail": run.last_end - run.tools[chain[-1]][1],
    }


def handoff_summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Medians of the hand-off pieces, overall and per kind, with counts."""
    out: dict[str, Any] = {"n": len(rows)}
    for key in ("total", "post", "pickup"):
        out[key] = median(r[key] for r in rows)
    for kind in ("in slot", "started"):
        group = [r for r in rows if r["kind"] == kind]
        out[f"{kind} n"] = len(group)
        out[f"{kind} pickup"] = median(r["pickup"] for r in group)
        for key in ("hop", "start", "to_tool"):
            if kind == "started":
                out[f"started {key}"] = median(r[key] for r in group)
    return out


def phases(run: Run) -> dict[str, float]:
    """Where a run's makespan goes: before the first tool, the tools' span, after the last tool; for the
    plan DAG also the plan task and the finalize hop."""
    first_tool = min(s for s, _ in run.tools.values())
    last_tool = max(e for _, e in run.tools.values())
    out = {
        "to first tool": first_tool - run.first_start,
        "tools span": last_tool - first_tool,
        "after last tool": run.last_end - last_tool,
    }
    plan, finalize = run.ti(PLAN_TASK), run.ti(FINALIZE_TASK)
    if plan is not None:
        out["plan task"] = plan["end"] - plan["start"]
        out["plan end → first tool"] = first_tool - plan["end"]
    if finalize is not None:
        node_end = max(t["end"] for t in run.node_tis().values())
        out["last node end → finalize end"] = finalize["end"] - node_end
    return out


def tie_order(run: Run, plan: Plan) -> dict[str, int]:
    """Which of a static DAG's tasks of equal priority weight the scheduler queued first, when both
    waited for a slot (the later one's upstream had ended half a second before the first was queued):
    ``pairs`` such pairs, ``in task order`` of them queued in the DAG's task order (the plan's node
    order, the order Airflow created their instances in). The simulator queues them in that order."""
    tis = run.node_tis()
    parents = parents_of(plan)
    place = {node: i for i, node in enumerate(parents)}
    ready = {node: max((tis[p]["end"] for p in parents[node]), default=run.first_start) for node in tis}
    queued = sorted((ti["queued"], node) for node, ti in tis.items() if ti.get("queued") is not None)
    pairs = in_order = 0
    for i, (first_at, first) in enumerate(queued):
        for later_at, later in queued[i + 1 :]:
            if later_at == first_at or tis[first]["priority_weight"] != tis[later]["priority_weight"]:
                continue
            if ready[later] > first_at - 0.5:
                continue
            pairs += 1
            in_order += place[first] < place[later]
    return {"pairs": pairs, "in task order": in_order}


def slot_peak(bench: Bench, run: Run) -> tuple[int, int]:
    """(peak node slots held at once, number of task process starts) of a plan-DAG run's node tasks."""
    segments = [s for ti in run.node_tis().values() for s in bench.process_segments(run, ti)]
    return peak_overlap(segments), len(segments)


def tool_peak(run: Run) -> int:
    return peak_overlap(run.tools.values())


# ------------------------------------------------------------------------------------------ questions


class Question:
    """One benchmark question: DAG files, measurement in a running cluster, report per database."""

    name = ""

    def dags(self, bench: Bench, cap: int) -> dict[str, str]:
        """dag id → DAG file source."""
        raise NotImplementedError

    def measure(self, bench: Bench, repeat: int) -> dict[str, Any]:
        """Run the question's DAGs on the running cluster; returns figures (JSON-able)."""
        raise NotImplementedError

    def report(self, results: Mapping[str, Mapping[str, Any]]) -> None:
        """Print the figures of each database (``results[database]``) side by side."""
        raise NotImplementedError


def repeat_runs(
    bench: Bench, repeat: int, runs: Sequence[tuple[str, str, Mapping[str, Any]]]
) -> dict[str, list[Run]]:
    """``repeat`` rounds of the given (label, dag id, conf) runs, one at a time in that order."""
    out: dict[str, list[Run]] = {label: [] for label, _, _ in runs}
    for round_ in range(1, repeat + 1):
        for label, dag_id, conf in runs:
            run = bench.run(dag_id, conf)
            out[label].append(run)
            log(
                f"{bench.database} round {round_} {label}: {run.state}, makespan {run.makespan:.1f}s, "
                f"trigger→done {run.trigger_to_done:.1f}s"
            )
            if run.state != "success":
                raise RuntimeError(f"{label} run {run.run_id} ended {run.state}")
    return out


def median_run(runs: Sequence[Run]) -> Run:
    return sorted(runs, key=lambda r: r.makespan)[len(runs) // 2]


def run_figures(runs: Sequence[Run]) -> dict[str, Any]:
    return {
        "makespan": median(r.makespan for r in runs),
        "trigger_to_done": median(r.trigger_to_done for r in runs),
        "raw": [round(r.makespan, 1) for r in runs],
        **loop_figures(runs),
    }


def execution_requests_per_second(api_server_log: Path, runs: Sequence[Run]) -> float | None:
    """Execution-API requests per second while each run was on (its first task's start → its last
    task's end), median over ``runs``, from the API server's access log (``[http.access]`` lines of
    ``/execution/`` paths: the task processes', their supervisors' and the triggerer's requests). Runs
    one at a time (:func:`repeat_runs`), so every request in a run's window is for that run. None when
    the log holds no such line."""
    stamps = []
    with suppress(OSError), api_server_log.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if "[http.access]" in line and "path=/execution/" in line:
                with suppress(ValueError):
                    stamps.append(
                        datetime.fromisoformat(line.split(" ", 1)[0].replace("Z", "+00:00")).timestamp()
                    )
    if not stamps:
        return None
    return median(
        sum(1 for t in stamps if r.first_start <= t <= r.last_end) / max(r.last_end - r.first_start, 1e-9)
        for r in runs
    )


def loop_figures(runs: Sequence[Run]) -> dict[str, Any]:
    """The scheduler's loop time over ``runs`` (medians over the runs of each run's median and p95 ms,
    and of its loops per second), when the scheduler's timings were received."""
    timed = [r for r in runs if r.loop_ms]
    if not timed:
        return {}
    summaries = [loop_summary(r.loop_ms) for r in timed]
    return {
        **{key: median(s[key] for s in summaries) for key in summaries[0]},
        "loops/s": median(len(r.loop_ms) / max(r.run_end - r.trigger, 1e-9) for r in timed),
    }


def main(questions: Sequence[Question], description: str, argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--db", nargs="+", choices=DATABASES, default=list(DATABASES), help="metadata databases"
    )
    parser.add_argument("--repeat", type=int, default=3, help="rounds per figure (medians are printed)")
    parser.add_argument(
        "--cap",
        type=int,
        default=16,
        help="LocalExecutor parallelism and every DAG's max_active_tasks",
    )
    parser.add_argument("--json", type=Path, help="write the figures to this file after every question")
    parser.add_argument("--plan-in-conf", action="store_true", help=PLAN_IN_CONF_HELP)
    parser.add_argument("--report", type=Path, help="print the tables of a --json file; run nothing")
    for question in questions:
        add = getattr(question, "add_arguments", None)
        if add:
            add(parser)
    args = parser.parse_args(argv)
    for question in questions:
        configure = getattr(question, "configure", None)
        if configure:
            configure(args)
    if args.report:
        saved = json.loads(args.report.read_text())
        report(questions, saved["results"], saved["header"])
        return 0
    results: dict[str, dict[str, Any]] = {q.name: {} for q in questions}
    header = [
        f"{time.strftime('%Y-%m-%d %H:%M %Z')}; LocalExecutor, parallelism {args.cap}, every DAG"
        f" max_active_tasks {args.cap} (plan DAG max_active_nodes: its max_nodes); medians of {args.repeat}"
    ]
    for database in args.db:
        bench = Bench("plan-bench", database, plan_in_conf=args.plan_in_conf)
        before = load_note()
        dags, warm_up_runs = warm_up_dags(bench, args.cap)
        for question in questions:
            dags |= question.dags(bench, args.cap)
        for dag_id, source in dags.items():
            bench.write_dag(dag_id, source)
        try:
            bench.start(parallelism=args.cap, dag_ids=list(dags))
            # one unmeasured run of each kind, as wide as the cap: every worker and the triggerer has
            # run something
            repeat_runs(bench, 1, warm_up_runs)
            for question in questions:
                t0 = time.monotonic()
                try:
                    results[question.name][database] = question.measure(bench, args.repeat)
                except Exception as error:  # a failed or stuck run: report it, go on with the next question
                    log(f"{database}: {question.name} failed: {error!r}")
                    results[question.name][database] = {"error": repr(error)[:500]}
                log(f"{database}: {question.name} measured in {time.monotonic() - t0:.0f}s")
                if args.json:
                    args.json.write_text(json.dumps({"results": results, "header": header}, default=str))
        finally:
            bench.stop()
        header.append(f"{database}: {before} before, {load_note()} after")
        if args.json:
            args.json.write_text(json.dumps({"results": results, "header": header}, default=str))
    report(questions, results, header)
    return 0 if not any("error" in r for q in results.values() for r in q.values()) else 1


def report(questions: Sequence[Question], results: Mapping[str, Any], header: Sequence[str]) -> None:
    print("\n" + "\n  ".join(header))
    for question in questions:
        measured = {db: r for db, r in results.get(question.name, {}).items() if "error" not in r}
        for db, r in results.get(question.name, {}).items():
            if "error" in r:
                print(f"\n{question.name} on {db}: not measured: {r['error']}")
        if measured:
            question.report(measured)


# ------------------------------------------------------------------------------------------ plan vs static


def breakdown(bench: Bench, run: Run, plan: Plan) -> dict[str, Any]:
    """Where the median run's time went (phases, hand-offs; slots for the plan DAG)."""
    out: dict[str, Any] = {
        "phases": phases(run),
        "handoffs": handoff_summary(handoffs(bench, run, plan)),
        "chain": realized_chain(bench, run, plan),
    }
    if run.ti(PLAN_TASK) is not None:
        out["slot peak"], out["processes"] = slot_peak(bench, run)
    else:
        out["ties"] = tie_order(run, plan)
    out["tool peak"] = tool_peak(run)
    return out


def compare(
    bench: Bench,
    repeat: int,
    dags: tuple[str, str],
    plan: Plan,
    seconds: Mapping[str, float],
    scale: float = 1.0,
    also: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """``repeat`` rounds of (plan DAG, static DAG) on ``plan``; medians, and the median runs' breakdown.
    ``also``: more plan DAGs (kind → DAG id) run on the same plan in each round, between the two."""
    plan_dag, static_dag = dags
    conf = {"goal": plan["goal"], "plan": work_plan(plan, seconds, scale)}
    runs = repeat_runs(
        bench,
        repeat,
        [
            ("plan", plan_dag, conf),
            *((kind, dag_id, conf) for kind, dag_id in (also or {}).items()),
            ("static", static_dag, {"scale": scale}),
        ],
    )
    cp, _ = critical_path(plan, seconds)
    out: dict[str, Any] = {"cp": cp * scale}
    for kind, group in runs.items():
        out[kind] = run_figures(group)
        try:
            out[kind] |= breakdown(bench, median_run(group), plan)
        except Exception as error:  # the makespans stand without the breakdown
            log(f"{kind}: no breakdown of the median run: {error!r}")
    return out


def print_breakdown(figures: Mapping[str, Any], indent: str = "    ") -> None:
    """The plan and static median runs' breakdown, side by side."""
    plan, static = figures["plan"], figures["static"]
    if "phases" not in plan or "phases" not in static:
        print(f"{indent}(no breakdown: see the log)")
        return
    names = list(dict.fromkeys([*plan["phases"], *static["phases"]]))
    print(f"{indent}{'makespan phases, s':<34}{'plan':>8}{'static':>8}")
    for name in names:
        print(
            f"{indent}  {name:<32}{fmt(plan['phases'].get(name), 2):>8}"
            f"{fmt(static['phases'].get(name), 2):>8}"
        )
    print(f"{indent}{'hand-offs (parent tool end → child tool start), median s':<58}")
    for key, label in (
        ("n", "edges measured (last parent per node)"),
        ("total", "parent tool end → child tool start"),
        ("post", "  parent tool end → parent task end"),
        ("pickup", "  parent task end → child tool start"),
        ("in slot n", "child already running (polling): count"),
        ("in slot pickup", "  its pickup"),
        ("started n", "child process started after: count"),
        ("started pickup", "  its pickup"),
        ("started hop", "    parent end → child queued"),
        ("started start", "    queued → process start"),
        ("started to_tool", "    process start → tool start"),
    ):
        p, s = plan["handoffs"].get(key), static["handoffs"].get(key)
        digits = 0 if key.endswith(" n") or key == "n" else 2
        print(f"{indent}  {label:<46}{fmt(p, digits):>8}{fmt(s, digits):>8}")
    if "chain" in plan and "chain" in static:
        print(f"{indent}the chain of tool calls that set the makespan (head + tools + gaps + tail), s")
        for kind, chain in (("plan", plan["chain"]), ("static", static["chain"])):
            gaps = ", ".join(
                f"{gap:.2f}{'' if k == 'in slot' else '*'}"
                for gap, k in zip(chain["gaps"], chain["kinds"], strict=True)
            )
            print(
                f"{indent}  {kind:<7}{' → '.join(chain['nodes'])}: head {chain['head']:.2f} + tools"
                f" {chain['tools']:.1f} + gaps {chain['gap sum']:.2f} ({gaps}) + tail {chain['tail']:.2f}"
            )
        print(f"{indent}  (* the child's task process started after its parent ended)")
    if static.get("ties", {}).get("pairs"):
        ties = static["ties"]
        print(
            f"{indent}static DAG: of {ties['pairs']} pairs of tasks of equal weight both waiting for a slot,"
            f" {ties['in task order']} queued in the DAG's task order"
        )
    if "slot peak" in plan:
        print(
            f"{indent}plan DAG node slots: peak held {plan['slot peak']}, task processes {plan['processes']}"
            f" (starts + resumes); peak concurrent tool calls plan {plan['tool peak']},"
            f" static {static['tool peak']}"
        )
