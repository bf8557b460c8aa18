"""The session's events, metrics and spans, from a real plan session run in-process (dag.test).

The seed story: revision 0 runs nodes 1-4, node 3 finds no deploys and asks for a replan, 5 and 6 are
moot; revision 1 reuses 1-4 and runs the revised 5, then 6.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from airflow_plan_provider import NodeExecution
from airflow_plan_provider.contract import FINALIZE_TASK
from airflow_plan_provider.planners.base import PlannerReply
from airflow_plan_provider.testing import CallLog, ScriptedPlanner, scripted_registry
from airflow_plan_provider.testing.in_process import run_session
from harness.seed import seed_plan, seed_revision, seed_tools
from tests.airflow.support import xcom

pytestmark = pytest.mark.airflow

USAGE = [{"prompt_tokens": 120, "completion_tokens": 30}, {"prompt_tokens": 80, "completion_tokens": 20}]
IDENTIFIERS = ("type", "at", "dag_id", "run_id", "root_run_id", "revision", "node_id", "data")


def seed_session(dag_id: str, tmp_path: Any) -> list[Any]:
    """The seed story as a chain of two runs; each planner call reports token usage."""
    from airflow_plan_provider.dag_factory import build_plan_dag

    log = CallLog(tmp_path)
    tools = seed_tools(log, query_deploys={"replan": "no deploys yesterday"})
    planner = ScriptedPlanner(
        lambda request: PlannerReply(seed_plan(), usage=USAGE[0]),
        on_error=[("no deploys", lambda request: PlannerReply(seed_revision(), usage=USAGE[1]))],
    )
    dag = build_plan_dag(
        dag_id,
        planner=planner,
        tools=scripted_registry(*tools),
        execution=NodeExecution(retries=0, retry_delay=timedelta(seconds=0)),
    )
    return run_session(dag, {"goal": "find why the payment API got slow yesterday"}).runs


def logged_events(text: str) -> list[dict[str, Any]]:
    """The event JSON lines of captured task logs."""
    events = []
    for line in text.splitlines():
        start = line.find('{"type":')
        if start >= 0:
            decoded, _ = json.JSONDecoder().raw_decode(line[start:])
            events.append(decoded)
    return events


def test_one_event_per_state_change_in_order_with_identifiers(tmp_path, capfd):
    runs = seed_session("events_seed", tmp_path)
    assert len(runs) == 2
    root, child = runs[0].run_id, runs[1].run_id
    captured = capfd.readouterr()
    events = xcom(runs[1], FINALIZE_TASK)["events"]

    for event in events:
        assert tuple(event) == IDENTIFIERS
        assert event["dag_id"] == "events_seed" and event["root_run_id"] == root
        assert (event["run_id"], event["revision"]) in ((root, 0), (child, 1))
        has_node = event["type"].startswith("node.") or event["type"] == "replan.requested"
        assert (event["node_id"] is not None) == has_node
    # per run, the order in which things happened
    assert [e["at"] for e in events] == sorted(e["at"] for e in events)
    by_run = {run: [(e["type"], e["node_id"]) for e in events if e["run_id"] == run] for run in (root, child)}
    planned = [("planner.usage", None), ("plan.created", None), ("plan.validated", None)]
    assert by_run[root][:3] == planned
    assert by_run[root][-1] == ("replan.requested", "3")
    assert by_run[child][:3] == [("planner.usage", None), ("plan.diff", None), ("plan.validated", None)]
    assert by_run[child][-1] == ("session.finished", None)
    planner_calls = [e for e in events if e["type"] == "planner.usage"]
    assert [(e["run_id"], e["data"]["prompt_tokens"]) for e in planner_calls] == [(root, 120), (child, 80)]

    # one event per state change of each node: started then its outcome, or only its outcome
    def node_story(run: str, node: str) -> list[str]:
        mine = [e for e in events if e["run_id"] == run and e["node_id"] == node]
        return [e["type"] for e in mine if e["type"].startswith("node.")]

    assert {n: node_story(root, n) for n in "123456"} == {
        **{n: ["node.started", "node.succeeded"] for n in "1234"},
        "5": ["node.skipped"],
        "6": ["node.skipped"],
    }
    assert {n: node_story(child, n) for n in "123456"} == {
        **{n: ["node.reused"] for n in "1234"},
        "5": ["node.started", "node.succeeded"],
        "6": ["node.started", "node.succeeded"],
    }
    by_key = {(e["run_id"], e["node_id"], e["type"]): e["data"] for e in events}
    assert by_key[root, "3", "node.succeeded"]["replan_requested"] is True
    assert "no deploys" in by_key[root, "3", "node.succeeded"]["error"]
    assert by_key[root, "5", "node.skipped"]["reason"] == "parent 3 requested a replan"
    assert by_key[root, "1", "node.succeeded"]["duration_s"] >= 0
    request = by_key[root, "3", "replan.requested"]
    assert request["replan_requested"] == {"3": "query_deploys: no deploys yesterday"}
    assert (request["next_revision"], request["next_run_id"]) == (1, child)
    diff = next(e for e in events if e["type"] == "plan.diff")
    assert diff["data"]["revised"] == ["5"]

    # the task logs carry the same events as JSON lines
    logged = logged_events(captured.out + captured.err)
    assert sorted(json.dumps(e, sort_keys=True) for e in logged) == sorted(
        json.dumps(e, sort_keys=True) for e in events
    )


@pytest.fixture
def statsd_listener(monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A UDP socket on 127.0.0.1 that Airflow's StatsD client sends to, as a task process would set it
    up (``[metrics] statsd_on``, host, port; the task runner initialises Stats the same way)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind(("127.0.0.1", 0))
    listener.settimeout(0.2)
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_ON", "True")
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_HOST", "127.0.0.1")
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_PORT", str(listener.getsockname()[1]))
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_PREFIX", "airflow")
    initialize_stats()
    try:
        yield listener
    finally:
        monkeypatch.delenv("AIRFLOW__METRICS__STATSD_ON")
        initialize_stats()
        listener.close()


def initialize_stats() -> None:
    """Set Airflow's metrics client up again from ``[metrics]``, as a task process does."""
    try:
        from airflow.sdk.observability import stats
        from airflow.sdk.observability.metrics import stats_utils
    except ImportError:  # Airflow 3.1: the client's factory is chosen from the settings once, kept
        from airflow.configuration import conf
        from airflow.metrics.base_stats_logger import NoStatsLogger
        from airflow.metrics.statsd_logger import get_statsd_logger
        from airflow.stats import Stats

        type(Stats).factory = get_statsd_logger if conf.getboolean("metrics", "statsd_on") else NoStatsLogger
        Stats.instance = None  # the client made on first use, kept on the class
        return
    if not hasattr(stats, "initialize"):  # Airflow 3.2: the module's Stats class
        stats.Stats.initialize(factory=stats_utils.get_stats_factory(stats.Stats))
        return
    stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=False)


def received(listener: socket.socket) -> list[str]:
    lines: list[str] = []
    while True:
        try:
            packet = listener.recv(65535)
        except TimeoutError:
            return lines
        lines += packet.decode().splitlines()


def test_node_outcomes_durations_and_tokens_reach_statsd(tmp_path, statsd_listener):
    seed_session("metrics_seed", tmp_path)
    metrics = received(statsd_listener)

    def total(name: str) -> int:
        """The sum of a counter's increments (``name:N|c``)."""
        values = [line.split(":", 1)[1] for line in metrics if line.split(":", 1)[0] == name]
        return sum(int(value.split("|")[0]) for value in values if value.endswith("|c"))

    assert total("airflow.plan.node.succeeded") == 6  # 1-4 in revision 0, 5 and 6 in revision 1
    assert total("airflow.plan.node.skipped") == 2
    assert total("airflow.plan.node.reused") == 4
    assert total("airflow.plan.node.failed") == 0
    assert total("airflow.plan.planner.calls") == 2
    assert total("airflow.plan.planner.prompt_tokens") == 200
    assert total("airflow.plan.planner.completion_tokens") == 50
    assert total("airflow.plan.replans") == 1
    assert total("airflow.plan.session.completed") == 1
    durations = [line for line in metrics if line.startswith("airflow.plan.node.duration:")]
    assert len(durations) == 6 and all(line.endswith("|ms") for line in durations)


def test_spans_only_when_airflow_tracing_is_on(tmp_path, monkeypatch):
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from airflow_plan_provider.operators._telemetry import span

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    if trace.get_tracer_provider() is not provider:
        pytest.skip("another test of this process set the global tracer provider first")

    monkeypatch.setenv("AIRFLOW__TRACES__OTEL_ON", "False")
    with span("plan.node", node_id="1"):
        pass
    assert exporter.get_finished_spans() == ()

    monkeypatch.setenv("AIRFLOW__TRACES__OTEL_ON", "True")
    seed_session("spans_seed", tmp_path)
    spans = exporter.get_finished_spans()
    nodes = sorted(
        (s.attributes["plan.revision"], s.attributes["plan.node_id"]) for s in spans if s.name == "plan.node"
    )
    assert nodes == [(0, "1"), (0, "2"), (0, "3"), (0, "4"), (1, "5"), (1, "6")]
    assert sum(s.name == "plan.planning" for s in spans) == 2
    node_3 = next(s for s in spans if s.name == "plan.node" and s.attributes["plan.node_id"] == "3")
    assert node_3.attributes["plan.tool"] == "query_deploys"


def test_a_node_that_never_reported_gets_its_outcome_event_from_finalize():
    from airflow_plan_provider.operators.finalize import NO_REPORT
    from airflow_plan_provider.plan.events import EventSource, make_event
    from airflow_plan_provider.plan.result import NodeRecord
    from airflow_plan_provider.plan.session import SessionState, record_node_outcomes
    from airflow_plan_provider.plan.validate import validate_plan

    plan = validate_plan(
        {"nodes": [{"id": "1", "action": "a", "tool": "a"}, {"id": "2", "action": "b", "tool": "b"}]}
    )
    state = SessionState(dag_id="d", root_run_id="r", run_ids=["r"])
    source = EventSource("d", "r", "r", 0)
    started = make_event("node.started", source, "1", tool="a")
    succeeded = make_event("node.succeeded", source, "1", tool="a")
    records = {
        "1": NodeRecord(node_id="1", tool="a", status="success", events=[started, succeeded]),
        "2": NodeRecord(node_id="2", tool="b", status="failed", error=NO_REPORT),
    }
    recorded = record_node_outcomes(state, plan, records)
    assert [(e.type, e.node_id, e.run_id, e.data.get("error")) for e in recorded.events] == [
        ("node.started", "1", "r", None),
        ("node.succeeded", "1", "r", None),
        ("node.failed", "2", "r", NO_REPORT),
    ]
    assert state.events == []  # the transition returns a new session
    assert "events" not in records["1"].model_dump()  # the history does not repeat them
