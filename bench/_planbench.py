"""Shared helpers of the plan-DAG benchmarks (``seed_speedup``, ``barrier``, ``concurrent_runs``).

Not a benchmark itself. It writes bench DAG files into a temporary dags folder, starts an
:class:`AirflowCluster`, triggers runs through the REST API and reads their timings back:

- run times come from the DAG run resource (``start_date`` → ``end_date``), never from our polling;
- tool times come from a cross-process call log (``calls.jsonl``, the :class:`CallLog` format: one JSON
  line per call start/end with ``time.time()``), written by the plan DAG's tools and by the static DAG's
  tasks alike, so the two are measured the same way;
- task times come from the task instances (``queued_when``, ``start_date``, ``end_date``).

All figures are wall-clock seconds on a shared 2-core machine: report them, never assert on them.
"""

from __future__ import annotations

import atexit
import json
import shutil
import statistics
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from airflow_plan_provider.testing.cluster import AirflowCluster

Plan = dict[str, Any]


# ------------------------------------------------------------------------------------------ time


def ts(value: str | None) -> float | None:
    """An API timestamp (ISO 8601) as epoch seconds."""
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def load_note() -> str:
    """The 1/5/15-minute load averages: other work shares the 2 cores."""
    import os

    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------ plans


def edges_of(plan: Plan) -> list[tuple[str, str]]:
    return [(e["from"], e["to"]) for e in plan.get("edges", [])]


def parents_of(plan: Plan) -> dict[str, list[str]]:
    parents: dict[str, list[str]] = {n["id"]: [] for n in plan["nodes"]}
    for source, target in edges_of(plan):
        parents[target].append(source)
    return parents


def layers_of(plan: Plan) -> list[list[str]]:
    """Topological generations (the plan DAG's layers)."""
    parents = parents_of(plan)
    depth: dict[str, int] = {}

    def d(node: str) -> int:
        if node not in depth:
            depth[node] = 1 + max((d(p) for p in parents[node]), default=-1)
        return depth[node]

    for node in parents:
        d(node)
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


def layered_bound(plan: Plan, seconds: Mapping[str, float]) -> float:
    """Makespan with a barrier after each layer and zero overhead: sum over layers of the longest node."""
    return sum(max(seconds[n] for n in layer) for layer in layers_of(plan))


# ------------------------------------------------------------------------------------------ DAG files

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


def static_dag_source(
    dag_id: str, plan: Plan, seconds: Mapping[str, float], calls: Path, **dag_kwargs: Any
) -> str:
    """An ordinary Airflow DAG with one PythonOperator per plan node (sleeping its seconds, times the
    run conf's ``scale``) and the plan's edges as real task dependencies. Imports Airflow and the stdlib
    only; logs each sleep to the same call log as the plan DAG's tools."""
    kwargs = {"schedule": None, "catchup": False, "max_active_tasks": 64, "max_active_runs": 16, **dag_kwargs}
    return (
        textwrap.dedent(
            f'''
            """Bench: the plan as a static DAG ({len(plan["nodes"])} tasks)."""
            from airflow.sdk import DAG
            from airflow.providers.standard.operators.python import PythonOperator
            '''
        )
        + CALL_LOG_WRITER.format(calls=str(calls))
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
    )


def noop_dag_source(dag_id: str) -> str:
    """One task that does nothing: the fixed cost of an Airflow run (start, one task, end)."""
    return textwrap.dedent(
        f'''
        """Bench: one empty task."""
        from airflow.sdk import DAG
        from airflow.providers.standard.operators.python import PythonOperator

        with DAG({dag_id!r}, schedule=None, catchup=False) as dag:
            PythonOperator(task_id="noop", python_callable=lambda: None)
        '''
    )


def work_plan_dag_source(dag_id: str, calls_folder: Path, **build_kwargs: Any) -> str:
    """A plan DAG whose plan comes from the run's conf (``plan``); its one tool ``work(seconds)`` sleeps
    and logs the call to ``calls_folder`` through :class:`CallLog`. ``build_kwargs`` are written as their
    ``repr`` (settings objects such as ``Limits()`` included)."""
    return textwrap.dedent(
        f'''
        """Bench: a plan DAG running the plan given in the run's conf."""
        import datetime
        import time

        from airflow_plan_provider import ArtifactStore, Budgets, Limits, NodeExecution, build_plan_dag
        from airflow_plan_provider.testing.scripted import CallLog
        from airflow_plan_provider.tools.registry import ToolRegistry

        LOG = CallLog({str(calls_folder)!r})
        registry = ToolRegistry()


        @registry.tool(description="sleep for a while")
        def work(seconds: float = 1.0, *, ctx):
            with LOG.call("work", ctx):
                time.sleep(seconds)
            return {{"node": ctx.node_id, "slept": seconds}}


        dag = build_plan_dag({dag_id!r}, planner=None, tools=registry, **{build_kwargs!r})
        '''
    )


def work_plan(plan: Plan, seconds: Mapping[str, float], scale: float = 1.0) -> Plan:
    """``plan`` with every node calling ``work`` for its (scaled) seconds."""
    nodes = [
        {**n, "tool": "work", "params": {"seconds": round(seconds[n["id"]] * scale, 3)}}
        for n in plan["nodes"]
    ]
    return {**plan, "nodes": nodes}


# ------------------------------------------------------------------------------------------ cluster


class Bench:
    """A temporary dags folder + call log, and (once started) the cluster running them."""

    def __init__(self, prefix: str) -> None:
        self.root = Path(tempfile.mkdtemp(prefix=f"{prefix}-"))
        atexit.register(shutil.rmtree, self.root, ignore_errors=True)
        self.dags = self.root / "dags"
        self.dags.mkdir()
        self.calls_folder = self.root / "calls"
        self.calls_folder.mkdir()
        self.calls = self.calls_folder / "calls.jsonl"
        self.cluster: AirflowCluster | None = None

    def write_dag(self, dag_id: str, source: str) -> None:
        (self.dags / f"{dag_id}.py").write_text(source)

    def start(
        self, *, parallelism: int = 8, env: Mapping[str, str] | None = None, dag_ids: Sequence[str]
    ) -> AirflowCluster:
        t0 = time.monotonic()
        env = {"AIRFLOW__CORE__PARALLELISM": str(parallelism), **(env or {})}
        self.cluster = AirflowCluster(self.dags, env=env, parallelism=parallelism, startup_timeout=180)
        self.cluster.__enter__()
        for dag_id in dag_ids:
            self.cluster.wait_for_dag(dag_id, timeout=180)
            self.cluster.unpause(dag_id)
        log(f"cluster up with {len(dag_ids)} DAGs in {time.monotonic() - t0:.0f}s ({self.cluster.home})")
        return self.cluster

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None

    # ---- runs

    def run(self, dag_id: str, conf: Mapping[str, Any] | None = None, timeout: float = 600) -> dict[str, Any]:
        """Trigger, wait, and return the run's timings (epoch seconds) and state."""
        assert self.cluster is not None
        t_trigger = time.time()
        run_id = self.cluster.trigger(dag_id, conf or {})
        state = self.cluster.wait_for_run(dag_id, run_id, timeout=timeout, poll=0.25)
        return self.run_info(dag_id, run_id, t_trigger, state)

    def run_info(
        self, dag_id: str, run_id: str, t_trigger: float, state: str | None = None
    ) -> dict[str, Any]:
        assert self.cluster is not None
        run = self.cluster.get_run(dag_id, run_id)
        start, end = ts(run["start_date"]), ts(run["end_date"])
        assert start is not None and end is not None, run
        return {
            "dag_id": dag_id,
            "run_id": run_id,
            "state": state or run["state"],
            "trigger": t_trigger,
            "queued": ts(run.get("queued_at")),
            "start": start,
            "end": end,
            "makespan": end - start,
            "trigger_to_end": end - t_trigger,
        }

    # ---- call log

    def calls_of(self, run_id: str | None = None) -> list[dict[str, Any]]:
        if not self.calls.exists():
            return []
        entries = [json.loads(line) for line in self.calls.read_text().splitlines() if line.strip()]
        return [e for e in entries if run_id is None or f"/{run_id}/" in e["key"]]

    def tool_spans(self, run_id: str) -> dict[str, tuple[float, float]]:
        """node id → (tool start, tool end) for one run."""
        spans: dict[str, list[float]] = {}
        for e in self.calls_of(run_id):
            spans.setdefault(e["node"], [0.0, 0.0])[0 if e["event"] == "start" else 1] = e["t"]
        return {n: (s, e) for n, (s, e) in spans.items()}

    # ---- where the time goes

    def log_marks(
        self, info: Mapping[str, Any], task_id: str, map_index: int, try_number: int
    ) -> dict[str, float]:
        """Epoch times read from a task's own log file: first line (the process is up), DAG parsed,
        execute begins (end of the pre-execute group), post-execute begins."""
        assert self.cluster is not None
        path = (
            self.cluster.log_dir
            / f"dag_id={info['dag_id']}"
            / f"run_id={info['run_id']}"
            / f"task_id={task_id}"
        )
        if map_index >= 0:
            path = path / f"map_index={map_index}"
        path = path / f"attempt={try_number}.log"
        marks: dict[str, float] = {}
        try:
            lines = path.read_text().splitlines()
        except OSError:
            return marks
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            event, at = str(entry.get("event", "")), ts(entry.get("timestamp"))
            if at is None:
                continue
            marks.setdefault("log_first", at)
            if event == "Worker startup parse complete":
                marks.setdefault("log_parsed", at)
            elif event == "::endgroup::" and "log_parsed" in marks:
                marks.setdefault("log_exec", at)
            elif event == "::group::Post Execute":
                marks.setdefault("log_post", at)
        return marks

    def task_times(self, info: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Every task instance of a run with queued/start/end and its tool span, relative to run start."""
        assert self.cluster is not None
        spans = self.tool_spans(info["run_id"])
        t0 = info["start"]
        rows = []
        for ti in self.cluster.task_instances(info["dag_id"], info["run_id"]):
            label = ti.get("rendered_map_index") or ""
            node = label.split(" · ")[0] if ti["map_index"] >= 0 else None
            if ti["task_id"].startswith("n") and ti["task_id"][1:] in spans:
                node = ti["task_id"][1:]
            span = spans.get(node) if node else None

            def rel(v: float | None) -> float | None:
                return None if v is None else v - t0

            marks = self.log_marks(info, ti["task_id"], ti["map_index"], ti.get("try_number") or 1)
            rows.append(
                {
                    **{k: rel(v) for k, v in marks.items()},
                    "task": ti["task_id"] + (f"[{ti['map_index']}]" if ti["map_index"] >= 0 else ""),
                    "task_id": ti["task_id"],
                    "node": node,
                    "state": ti["state"],
                    "scheduled": rel(ts(ti.get("scheduled_when"))),
                    "queued": rel(ts(ti.get("queued_when"))),
                    "start": rel(ts(ti.get("start_date"))),
                    "tool_start": rel(span[0]) if span else None,
                    "tool_end": rel(span[1]) if span else None,
                    "end": rel(ts(ti.get("end_date"))),
                }
            )
        rows.sort(key=lambda r: (r["start"] if r["start"] is not None else 1e9, r["task"]))
        return rows


def print_task_table(rows: Sequence[Mapping[str, Any]], run_end: float, title: str) -> None:
    """Per task: times relative to the run's start (s), and the pieces of its own duration:
    q>start (queued → TI start_date: executor pick-up), launch (start_date → the task process's first log
    line), parse (DAG file parse in the task process), prep (parse → execute: unmapping, template and
    map-index rendering, API round trips), exec (execute → tool start, or → post-execute for tasks without
    a tool: XCom pulls, checks), tool, post (tool end or post-execute → TI end_date)."""
    print(f"\n{title}")
    print(
        f"  {'task':<18}{'node':>5} {'queued':>7} {'start':>6} {'tool+':>6} {'tool-':>6} {'end':>6}"
        f" | {'q>start':>7} {'launch':>6} {'parse':>6} {'prep':>5} {'exec':>5} {'tool':>5} {'post':>5}"
    )
    for r in rows:

        def d(a: str, b: str, r: Mapping[str, Any] = r) -> str:
            return fmt(r[b] - r[a], 2) if r.get(a) is not None and r.get(b) is not None else "-"

        exec_end = "tool_start" if r["tool_start"] is not None else "log_post"
        post_from = "tool_end" if r["tool_end"] is not None else "log_post"
        print(
            f"  {r['task']:<18}{r['node'] or '':>5} {fmt(r['queued']):>7} {fmt(r['start']):>6}"
            f" {fmt(r['tool_start']):>6} {fmt(r['tool_end']):>6} {fmt(r['end']):>6}"
            f" | {d('queued', 'start'):>7} {d('start', 'log_first'):>6} {d('log_first', 'log_parsed'):>6}"
            f" {d('log_parsed', 'log_exec'):>5} {d('log_exec', exec_end):>5} {d('tool_start', 'tool_end'):>5}"
            f" {d(post_from, 'end'):>5}"
        )
    last = max(r["end"] for r in rows if r["end"] is not None)
    print(f"  run end {fmt(run_end)} s after run start; {fmt(run_end - last)} s after the last task ended")


def piece_medians(rows: Sequence[Mapping[str, Any]], task_prefix: str) -> dict[str, float]:
    """Median of each piece of the tasks whose id starts with ``task_prefix``."""
    pieces = {
        "q>start": ("queued", "start"),
        "launch": ("start", "log_first"),
        "parse": ("log_first", "log_parsed"),
        "prep": ("log_parsed", "log_exec"),
        "exec": ("log_exec", "tool_start"),
        "post": ("tool_end", "end"),
    }
    out = {}
    for name, (a, b) in pieces.items():
        values = [
            r[b] - r[a]
            for r in rows
            if r["task_id"].startswith(task_prefix) and r.get(a) is not None and r.get(b) is not None
        ]
        if values:
            out[name] = median(values)
    return out


def stage_table(
    rows: Sequence[Mapping[str, Any]],
    run_end: float,
    stages: Sequence[tuple[str, Sequence[str]]],
    title: str,
) -> list[dict[str, Any]]:
    """The chain of stages (task ids, mapped instances grouped): when each became ready (its upstream
    stage ended), was queued, started, ran its tools, ended; the gaps are the scheduling hops."""
    by_task: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        by_task.setdefault(r["task_id"], []).append(r)
    print(f"\n{title}")
    print(
        f"  {'stage':<16}{'n':>3} {'ready':>6} {'queued':>7} {'start':>6} {'tool+':>6} {'tool-':>6}"
        f" {'end':>6} | {'hop':>5} {'launch':>6} {'to tool':>7} {'tools':>6} {'after':>6} {'stage':>6}"
    )
    ready = 0.0
    out = []
    for task_id, members in stages:
        group = [r for m in members for r in by_task.get(m, []) if r["start"] is not None]
        if not group:
            continue
        queued = min(r["queued"] for r in group if r["queued"] is not None)
        start = min(r["start"] for r in group)
        end = max(r["end"] for r in group)
        tool_starts = [r["tool_start"] for r in group if r["tool_start"] is not None]
        tool_ends = [r["tool_end"] for r in group if r["tool_end"] is not None]
        t_s = min(tool_starts) if tool_starts else None
        t_e = max(tool_ends) if tool_ends else None
        row = {
            "hop": queued - ready,
            "launch": start - queued,
            "to_tool": (t_s - start) if t_s is not None else None,
            "tools": (t_e - t_s) if t_s is not None and t_e is not None else None,
            "after": (end - t_e) if t_e is not None else None,
            "stage": end - ready,
        }
        print(
            f"  {task_id:<16}{len(group):>3} {fmt(ready):>6} {fmt(queued):>7} {fmt(start):>6}"
            f" {fmt(t_s):>6} {fmt(t_e):>6} {fmt(end):>6} | {fmt(row['hop']):>5} {fmt(row['launch']):>6}"
            f" {fmt(row['to_tool']):>7}"
            f" {fmt(row['tools']):>6} {fmt(row['after']):>6} {fmt(row['stage']):>6}"
        )
        out.append({"task": task_id, **row})  # type: ignore[dict-item]
        ready = end
    blank = f"{'':>7} {'':>6} {'':>6} {'':>6}"
    print(f"  {'run end':<16}{'':>3} {fmt(ready):>6} {blank} {fmt(run_end):>6} | {fmt(run_end - ready):>5}")
    return out
