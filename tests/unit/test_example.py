"""The flagship demo without Airflow: the dataset, the six tools, the template planner, and the scenario's
whole session run by the local runner (deploy query requests a replan, node 5 revised, report names
fraud-check)."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_plan_provider.contract import APPROVE_TASK
from airflow_plan_provider.exceptions import PermanentToolError, PlanningError, ReplanRequested
from airflow_plan_provider.local_runner import run_plan
from airflow_plan_provider.plan.merge import PlanDiff, merge_replan
from airflow_plan_provider.plan.model import ValidatedPlan
from airflow_plan_provider.plan.references import MissingInput
from airflow_plan_provider.plan.result import NodeRecord, SessionResult
from airflow_plan_provider.plan.validate import validate_plan
from airflow_plan_provider.planners.base import LockedNode, PlanRequest
from airflow_plan_provider.planners.static import StaticPlanner
from airflow_plan_provider.planners.template import PlanRule, ReplanRule, TemplatePlanner
from airflow_plan_provider.settings import NodeExecution
from airflow_plan_provider.tools.tool import ToolContext
from plan_demo import dataset
from plan_demo.planner import payment_latency_planner
from plan_demo.tools import (
    analyze_correlation,
    query_deploys,
    query_error_logs,
    query_metrics,
    query_service_health,
    registry,
    write_report,
)

GOAL = "find why the payment API got slow yesterday and write a report"
NO_WAIT = NodeExecution(retry_delay=timedelta(0))
LOCKED = {"1", "2", "3", "4"}


@pytest.fixture(autouse=True)
def demo_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PLAN_DEMO_DB", str(tmp_path / "db" / "demo.sqlite"))
    monkeypatch.setenv("PLAN_REPORT_DIR", str(tmp_path / "reports"))
    return tmp_path


def ctx(node_id: str = "6", key: str = "demo/run1/6/r0", missing: tuple[str, ...] = ()) -> ToolContext:
    return ToolContext(node_id=node_id, idempotency_key=key, missing_inputs=missing)


def dump(path: Path) -> list[str]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return list(conn.iterdump())


# --- dataset -------------------------------------------------------------------------------------


def test_dataset_is_deterministic(tmp_path: Path) -> None:
    today = dataset.today_utc()
    first = dataset.build_dataset(tmp_path / "a.sqlite", today)
    second = dataset.build_dataset(tmp_path / "b.sqlite", today)
    assert dump(first) == dump(second)
    with contextlib.closing(dataset.connect(first)) as conn:
        days = [r[0] for r in conn.execute("SELECT DISTINCT day FROM latency ORDER BY day")]
        deploy_days = {r[0][:10] for r in conn.execute("SELECT deployed_at FROM deploys")}
    assert days[-1] == (today - timedelta(days=1)).isoformat()
    assert len(days) == dataset.HISTORY_DAYS
    assert deploy_days and days[-1] not in deploy_days


def test_ensure_dataset_builds_once_at_the_configured_path(demo_env: Path) -> None:
    path = dataset.ensure_dataset()
    assert path == demo_env / "db" / "demo.sqlite" and path.is_file()
    inode = path.stat().st_ino
    assert dataset.ensure_dataset() == path and path.stat().st_ino == inode  # current: not rebuilt


def test_ensure_dataset_rebuilds_a_database_from_another_day(tmp_path: Path) -> None:
    path = tmp_path / "stale.sqlite"
    dataset.build_dataset(path, dataset.today_utc() - timedelta(days=3))
    dataset.ensure_dataset(path)
    with contextlib.closing(dataset.connect(path)) as conn:
        anchor = conn.execute("SELECT value FROM meta WHERE key = 'anchor'").fetchone()[0]
    assert anchor == dataset.today_utc().isoformat()


def test_ensure_dataset_under_concurrent_callers(tmp_path: Path) -> None:
    path = tmp_path / "shared" / "demo.sqlite"
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(dataset.ensure_dataset(path))) for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [path] * 8
    assert [p.name for p in path.parent.iterdir()] == ["demo.sqlite"]  # no temporary files left behind
    assert dump(path) == dump(dataset.build_dataset(tmp_path / "fresh.sqlite"))


# --- tools ---------------------------------------------------------------------------------------


def test_query_metrics_shows_the_slow_hours() -> None:
    metrics = query_metrics("payment-api")
    assert metrics["day"] == (dataset.today_utc() - timedelta(days=1)).isoformat()
    assert all(len(metrics[k]) == 24 for k in ("p50", "p95", "p99"))
    assert metrics["slow_hours"] == list(dataset.INCIDENT_HOURS)
    assert metrics["peak"]["hour"] in dataset.INCIDENT_HOURS
    assert metrics["peak"]["p99"] > 4 * metrics["baseline_p99"]
    assert query_metrics("Payment API", "yesterday") == metrics  # the goal's spelling works too


def test_query_service_health_finds_fraud_check_degraded() -> None:
    health = query_service_health("payment-api")
    assert set(health["dependencies"]) == set(dataset.DEPENDENCIES)
    assert health["degraded"] == ["fraud-check"]
    fraud = health["dependencies"]["fraud-check"]
    assert fraud["degraded_hours"] == [14, 15] and fraud["timeouts"] > 1000
    assert len(fraud["p99"]) == len(fraud["error_rate"]) == 24


def test_query_deploys_requests_a_replan_when_there_was_no_deploy() -> None:
    with pytest.raises(ReplanRequested) as raised:
        query_deploys("payment-api")
    assert raised.value.output == []
    assert str(raised.value).startswith("no deploys of payment-api on ")
    assert query_deploys("payment-api", replan_if_empty=False) == []
    earlier = (dataset.today_utc() - timedelta(days=4)).isoformat()
    assert [d["version"] for d in query_deploys("payment-api", earlier)] == ["v2.14.0"]


def test_query_error_logs_groups_the_fraud_check_timeouts() -> None:
    logs = query_error_logs("payment-api")
    assert "fraud-check" in logs["top"][0]["message"] and "request_id" not in logs["top"][0]["message"]
    assert logs["by_hour"][14] + logs["by_hour"][15] > 0.7 * logs["total"]
    assert len(logs["samples"]) <= 3


@pytest.mark.parametrize(
    ("service", "day", "message"),
    [
        ("payment-api", "last week", "day must be"),
        ("payment-api", "today", "the data covers"),
        ("payment-api", "2001-01-01", "the data covers"),
        ("checkout-api", "yesterday", "unknown service"),
    ],
)
def test_queries_outside_the_data_fail_permanently(service: str, day: str, message: str) -> None:
    with pytest.raises(PermanentToolError, match=message):
        query_metrics(service, day)


def test_params_are_checked_against_the_signature_schema() -> None:
    assert list(registry["query_metrics"].validator.iter_errors({"service": "payment-api"})) == []
    errors = [e.message for e in registry["query_deploys"].validator.iter_errors({"service": 3, "x": 1})]
    assert len(errors) == 2
    assert "ctx" not in registry["write_report"].args_schema["properties"]


def test_correlation_with_dependency_health_points_at_fraud_check() -> None:
    finding = analyze_correlation(query_metrics("payment-api"), query_service_health("payment-api"), "health")
    assert finding["peak_hours"] == [14, 15]
    assert finding["top"]["dependency"] == "fraud-check"
    assert finding["top"]["overlap_hours"] == [14, 15]
    assert finding["coefficient"] > 0.9
    assert all(c["coefficient"] < 0.5 for c in finding["candidates"] if c["dependency"] != "fraud-check")
    assert "fraud-check" in finding["sentence"] and "14:00-16:00" in finding["sentence"]


def test_correlation_without_deploys_or_with_a_missing_input() -> None:
    metrics = query_metrics("payment-api")
    no_deploys = analyze_correlation(metrics, [], "deploys")
    assert no_deploys["top"] is None and no_deploys["coefficient"] is None
    assert "no deploys" in no_deploys["sentence"]
    for missing in (None, MissingInput("3")):
        finding = analyze_correlation(metrics, missing, "deploys")
        assert finding["missing_input"] and "missing" in finding["sentence"]
    earlier = (dataset.today_utc() - timedelta(days=4)).isoformat()
    with_deploy = analyze_correlation(
        query_metrics("payment-api", earlier), query_deploys("payment-api", earlier), "d"
    )
    assert with_deploy["top"]["name"] == "deploys (v2.14.0)"


def test_outputs_are_small_json() -> None:
    metrics, health = query_metrics("payment-api"), query_service_health("payment-api")
    outputs = [metrics, health, query_error_logs("payment-api"), analyze_correlation(metrics, health, "h")]
    assert all(len(json.dumps(output)) < 4096 for output in outputs)


def test_write_report_names_the_cause_and_missing_inputs(demo_env: Path) -> None:
    metrics, health = query_metrics("payment-api"), query_service_health("payment-api")
    finding = analyze_correlation(metrics, health, "dependency health")
    result = write_report(GOAL, finding, metrics, None, ctx=ctx(missing=("4",)))
    path = Path(result["path"])
    assert path.parent == demo_env / "reports"
    text = path.read_text()
    assert text.startswith(f"# {result['title']}") and "fraud-check" in text
    assert "## Missing inputs" in text and "node 4" in text
    assert result["summary"] == finding["sentence"]
    # a retry of the same call overwrites the same file
    again = write_report(GOAL, finding, metrics, query_error_logs("payment-api"), ctx=ctx(missing=()))
    assert again["path"] == result["path"] and len(list(path.parent.iterdir())) == 1
    assert "Missing inputs" not in path.read_text() and "upstream timeout" in path.read_text()


# --- planners ------------------------------------------------------------------------------------


def filled(request: PlanRequest, planner: TemplatePlanner | None = None) -> dict[str, Any]:
    """The planner's reply, which must be a plan."""
    reply = (planner or payment_latency_planner()).plan(request)
    assert reply is not None
    return reply


def demo_plan(goal: str = GOAL, conf: dict[str, Any] | None = None) -> ValidatedPlan:
    return validate_plan(filled(PlanRequest(goal=goal, tools=registry, conf=conf or {})), registry)


def test_template_planner_fills_the_demo_plan() -> None:
    plan = demo_plan()
    assert plan.layers == [["1", "2", "3", "4"], ["5"], ["6"]]
    assert plan.goal == GOAL
    assert plan.node("1").params == {"service": "payment-api", "day": "yesterday"}
    assert plan.node("6").params["goal"] == GOAL
    assert plan.is_optional("4", "5") and not plan.is_optional("3", "5")


def test_template_values_come_from_groups_then_conf_then_defaults() -> None:
    conf = {"service": "checkout-api", "day": "2026-01-01"}
    plan = demo_plan("why is latency high yesterday", conf)
    assert plan.node("1").params == {"service": "checkout-api", "day": "yesterday"}
    plan = demo_plan("ledger-api got slow", conf)
    assert plan.node("1").params == {"service": "ledger-api", "day": "2026-01-01"}


def test_unmatched_goal_and_unfilled_placeholder_fail() -> None:
    with pytest.raises(PlanningError, match=r"known patterns: .*slow"):
        payment_latency_planner().plan(PlanRequest(goal="book me a flight", tools=registry))
    template = {
        "nodes": [{"id": "1", "action": "a", "tool": "query_metrics", "params": {"service": "{{svc}}"}}]
    }
    with pytest.raises(PlanningError, match=r"\{\{svc\}\}"):
        TemplatePlanner([PlanRule("x", template)]).plan(PlanRequest(goal="x", tools=registry))


def replan_request(
    plan: ValidatedPlan,
    failed: str,
    error: str,
    conf: dict[str, Any] | None = None,
    locked: set[str] = LOCKED,
) -> PlanRequest:
    """A replan request as the planning task builds it."""
    return PlanRequest(
        goal=plan.goal,
        tools=registry,
        conf=conf or {},
        current_plan=plan.as_plan(),
        failed_node=failed,
        locked=tuple(LockedNode(n, plan.node(n).action, plan.node(n).tool, "") for n in sorted(locked)),
        last_error=error,
        affected=tuple(n for n in plan.node_ids if n not in locked),
        revision=1,
    )


def test_replan_revises_only_node_5() -> None:
    plan = demo_plan()
    replacement = filled(replan_request(plan, "3", "no deploys of payment-api on 2026-01-01"))
    assert [n["id"] for n in replacement["nodes"]] == ["5", "6"]
    merged, diff = merge_replan(plan.as_plan(), replacement, locked=LOCKED)
    assert diff == PlanDiff(removed=[], added=[], revised=["5"])
    revised = validate_plan(merged, registry)
    assert revised.layers == [["1", "2", "3", "4"], ["5"], ["6"]]
    assert revised.node("5").params["against"] == "${2}"
    assert revised.node("6") == plan.node("6")


def test_replan_reads_values_back_from_the_current_plan() -> None:
    plan = demo_plan(conf={"service": "checkout-api"})
    replacement = filled(replan_request(plan, "3", "no deploys"))  # the replan run has no conf
    assert replacement["nodes"][0]["params"]["label"] == "dependency health of checkout-api"


def test_replan_rule_selection() -> None:
    plan = demo_plan()
    assert payment_latency_planner().plan(replan_request(plan, "1", "timeout")) is None
    by_error = TemplatePlanner(
        [],
        [
            ReplanRule(
                {"nodes": [{"id": "9", "action": "{{error}}", "tool": "query_metrics"}]}, when_error="5\\d\\d"
            )
        ],
    )
    assert filled(replan_request(plan, "2", "HTTP 503"), by_error)["nodes"][0]["action"] == "HTTP 503"
    assert by_error.plan(replan_request(plan, "2", "HTTP 404")) is None
    with pytest.raises(ValueError):
        ReplanRule("x.json")


def test_static_planner() -> None:
    plan = {"nodes": [{"id": "1", "action": "a", "tool": "query_metrics", "params": {"service": "x"}}]}
    assert StaticPlanner(plan).plan(PlanRequest(goal="g", tools=registry)) is plan
    assert StaticPlanner().plan(PlanRequest(goal="g", tools=registry, conf={"plan": plan})) is plan
    assert StaticPlanner().plan(PlanRequest(goal="g", tools=registry)) is None
    assert StaticPlanner(plan).plan(replan_request(validate_plan(plan), "1", "boom", locked=set())) is None


# --- the scenario, walked in process -------------------------------------------------------------


def walk(goal: str) -> SessionResult:
    """The scenario's whole session, run by the local runner with the demo's planner."""
    return run_plan(demo_plan(goal), registry, planner=payment_latency_planner(), execution=NO_WAIT)


def last_records(result: SessionResult) -> dict[str, NodeRecord]:
    return {record.node_id: record for record in result.history if record.revision == len(result.revisions)}


def test_scenario_replans_and_reports_fraud_check() -> None:
    result = walk(GOAL)
    assert (result.status, result.reason) == ("completed", "goal_met")
    assert [r.diff for r in result.revisions] == [PlanDiff(revised=["5"])]
    assert result.revisions[0].trigger_node == "3"
    outputs, last = result.outputs, last_records(result)
    assert outputs["3"] == [] and all(last[n].reused for n in "1234")
    assert outputs["5"]["top"]["dependency"] == "fraud-check"
    report = Path(outputs["6"]["path"])
    assert report.name.startswith(f"{outputs['1']['day']}_local_")  # the day it covers, then the call's key
    text = report.read_text()
    assert "fraud-check" in text and "upstream timeout calling fraud-check" in text
    assert "Missing inputs" not in text and last["6"].missing_inputs == []


def test_scenario_without_error_logs_still_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(service: str, day: str = "yesterday") -> dict:
        raise PermanentToolError("log store unavailable")

    monkeypatch.setattr(registry["query_error_logs"], "func", broken)
    result = walk(GOAL)
    # node 4 failed next to node 3's request: the replacement carries node 4 over, so it runs again
    assert [r.diff for r in result.revisions] == [PlanDiff(revised=["5"])]
    last = last_records(result)
    assert last["4"].status == "failed" and not last["4"].reused and "4" not in result.outputs
    assert last["5"].missing_inputs == ["4"] and last["6"].missing_inputs == ["4"]
    assert result.status == "completed" and "failed optional input(s) 4" in result.message
    text = Path(result.outputs["6"]["path"]).read_text()
    assert "fraud-check" in text and "node 4" in text and "No error-log data" in text


def test_replacement_carries_over_a_failed_node_it_depends_on() -> None:
    plan = demo_plan()
    error = "node 4 failed: log store unavailable; node 3 requested a replan: no deploys of payment-api"
    replacement = filled(replan_request(plan, "4", error, locked={"1", "2", "3"}))
    assert sorted(n["id"] for n in replacement["nodes"]) == ["4", "5", "6"]
    merged, diff = merge_replan(plan.as_plan(), replacement, locked={"1", "2", "3"})
    assert diff == PlanDiff(revised=["5"])
    assert validate_plan(merged, registry).node("4") == plan.node("4")


def test_the_publishing_example_asks_approval_for_its_risky_step_and_publishes_the_report(
    demo_env: Path,
) -> None:
    """``dags/plan_and_publish.py``: its plan runs to the end (local runner), the risky tool publishes
    the written report, and the DAG has the approval task that asks before any node runs."""
    import importlib.util

    from plan_demo.publishing import registry as publishing

    path = Path(__file__).resolve().parents[2] / "dags" / "plan_and_publish.py"
    spec = importlib.util.spec_from_file_location("plan_and_publish_under_test", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    tools = registry.merge(publishing)
    assert [name for name, tool in tools.items() if tool.needs_approval] == ["publish_report"]
    assert APPROVE_TASK in example.plan_and_publish.task_ids
    result = run_plan(validate_plan(example.PLAN, tools), tools)
    assert result.status == "completed", result.message
    published = Path(result.outputs["5"]["published"])
    assert published.read_text() == Path(result.outputs["4"]["path"]).read_text()
    assert published.parent == demo_env / "reports" / "published" / "payments-oncall"
    with pytest.raises(PermanentToolError, match="is not a report written under"):
        publishing["publish_report"].call({"path": "/etc/passwd", "channel": "x"}, ctx("5"))
