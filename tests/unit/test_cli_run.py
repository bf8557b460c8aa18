"""``airflow-plan run`` as a subprocess: the seed plan with the demo tools, exit codes, what it prints."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from airflow_plan_provider.plan.result import SessionResult
from airflow_plan_provider.planners.base import PlanRequest
from airflow_plan_provider.testing.scripted import CallLog
from harness.seed import seed_plan
from tests.unit.test_cli import ROOT, run_cli

DEMO_TOOLS = "dags/plan_demo/tools.py:registry"  # the example DAGs' demo, by its file
DEMO_GOAL = "find why the payment API got slow yesterday and write a report"
SEED_PLAN_FILE = ROOT / "dags" / "plan_demo" / "seed_plan.json"

SCRIPTED_TOOLS = """
import os

from airflow_plan_provider.testing.scripted import CallLog, scripted_registry
from harness.seed import seed_tools

registry = scripted_registry(*seed_tools(CallLog(os.environ["CALL_LOG"])))
"""


@pytest.fixture
def demo_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PLAN_DEMO_DB", str(tmp_path / "demo.sqlite"))
    monkeypatch.setenv("PLAN_REPORT_DIR", str(tmp_path / "reports"))
    return tmp_path


@pytest.fixture
def demo_seed_plan(demo_env: Path) -> Path:
    """The demo's seed plan file (the plan the demo's planner writes for its goal)."""
    return SEED_PLAN_FILE


def test_the_demo_seed_plan_file_is_the_plan_the_demo_planner_writes() -> None:
    from plan_demo.planner import payment_latency_planner
    from plan_demo.tools import registry

    plan = payment_latency_planner().plan(PlanRequest(goal=DEMO_GOAL, tools=registry))
    assert json.loads(SEED_PLAN_FILE.read_text()) == plan


@pytest.fixture
def scripted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CallLog:
    """Scripted seed tools in ``tmp_path/seed_tools.py``, calls logged to ``tmp_path/calls``."""
    (tmp_path / "seed_tools.py").write_text(SCRIPTED_TOOLS)
    monkeypatch.setenv("CALL_LOG", str(tmp_path / "calls"))
    (tmp_path / "seed.json").write_text(json.dumps(seed_plan()))
    return CallLog(tmp_path / "calls")


def test_seed_plan_with_the_demo_tools_prints_the_session_result(demo_seed_plan: Path) -> None:
    result = run_cli("run", str(demo_seed_plan), "--tools", DEMO_TOOLS)
    assert result.returncode == 1, result.stderr  # yesterday had no deploy: node 3 asks for a replan
    lines = result.stdout.splitlines()
    assert lines[0] == "status: failed (replan_unavailable)"
    assert lines[1] == f"goal: {DEMO_GOAL}"
    assert lines[2].startswith("message: node 3 requested a replan: no deploys of payment-api on ")
    nodes = [line.split(":")[0].strip() for line in lines if line.startswith("  node ")]
    assert nodes == [
        "node 1 [query_metrics] success",
        "node 2 [query_service_health] success",
        "node 3 [query_deploys] success",
        "node 4 [query_error_logs] success",
        "node 5 [analyze_correlation] skipped",
        "node 6 [write_report] skipped",
    ]
    assert "steps: 4" in result.stdout


def test_with_the_demo_planner_the_seed_session_replans_and_completes(
    demo_seed_plan: Path, demo_env: Path
) -> None:
    planner = "dags/plan_demo/planner.py:payment_latency_planner"
    result = run_cli("run", str(demo_seed_plan), "--tools", DEMO_TOOLS, "--planner", planner)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:3] == [
        "status: completed (goal_met)",
        f"goal: {DEMO_GOAL}",
        "message: every node succeeded",
    ]
    assert lines[3].startswith("runs: 2  replans: 1  steps: 6")
    assert lines[4].startswith("revision 1 (node 3 requested a replan: no deploys of payment-api on ")
    assert lines[4].endswith("removed [] added [] revised ['5']")
    nodes = [line.split(":")[0].strip() for line in lines if line.startswith("  node ")]
    assert nodes == [
        "node 1 [query_metrics] success (reused)",
        "node 2 [query_service_health] success (reused)",
        "node 3 [query_deploys] success (reused)",
        "node 4 [query_error_logs] success (reused)",
        "node 5 [analyze_correlation] success",
        "node 6 [write_report] success",
    ]
    reports = list((demo_env / "reports").iterdir())
    assert len(reports) == 1 and "fraud-check" in reports[0].read_text()


def test_json_output_is_the_session_result(demo_seed_plan: Path) -> None:
    result = run_cli("run", str(demo_seed_plan), "--tools", DEMO_TOOLS, "--json")
    assert result.returncode == 1, result.stderr
    session = SessionResult.model_validate_json(result.stdout)
    assert (session.status, session.reason) == ("failed", "replan_unavailable")
    by_id = {record.node_id: record for record in session.history}
    assert by_id["3"].replan_requested and session.outputs["3"] == []
    assert session.outputs["1"]["slow_hours"] == [14, 15]
    assert [e.type for e in session.events][-1] == "session.finished"


def test_a_completed_run_exits_0_with_tools_from_a_file(scripted: CallLog, tmp_path: Path) -> None:
    spec = f"{tmp_path / 'seed_tools.py'}:registry"
    result = run_cli("run", str(tmp_path / "seed.json"), "--tools", spec, "--max-workers", "2", "--json")
    assert result.returncode == 0, result.stderr
    session = SessionResult.model_validate_json(result.stdout)
    assert session.status == "completed" and session.outputs["6"] == {
        "report": {"inputs": ["latency", "logs"]}
    }
    assert scripted.count() == 6 and scripted.max_concurrency() <= 2


def test_the_step_budget_applies(scripted: CallLog, tmp_path: Path) -> None:
    result = run_cli(
        "run", str(tmp_path / "seed.json"), "--tools", "seed_tools:registry", "--max-steps", "2", cwd=tmp_path
    )
    assert result.returncode == 1, result.stderr
    assert result.stdout.splitlines()[0] == "status: failed (step_budget)"
    assert scripted.count() == 2


def test_an_invalid_plan_is_bad_input_and_nothing_runs(scripted: CallLog, tmp_path: Path) -> None:
    plan = seed_plan()
    plan["nodes"][4]["tool"] = "no_such_tool"
    (tmp_path / "bad.json").write_text(json.dumps(plan))
    result = run_cli("run", str(tmp_path / "bad.json"), "--tools", "seed_tools:registry", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0] == "airflow-plan: the plan is invalid; nothing ran:"
    assert any("no_such_tool" in line for line in lines[1:])
    assert scripted.count() == 0


@pytest.mark.parametrize(
    "args",
    [
        ("run", "missing.json", "--tools", "seed_tools:registry"),
        ("run", "seed.json", "--tools", "no_such_module:registry"),
        ("run", "seed.json", "--tools", "no/such/file.py:registry"),
        ("run", "seed.json"),  # --tools is required
        ("run", "seed.json", "--tools", "seed_tools:registry", "--planner", "seed_tools:registry"),
        ("run", "seed.json", "--tools", "seed_tools:registry", "--planner", "seed_tools:nothing"),
        ("run", "seed.json", "--tools", "seed_tools:registry", "--max-workers", "0"),
    ],
)
def test_bad_input_exits_2(scripted: CallLog, tmp_path: Path, args: tuple[str, ...]) -> None:
    result = run_cli(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stdout
    assert result.stdout == "" and "Traceback" not in result.stderr
    assert scripted.count() == 0
    assert os.path.exists(tmp_path / "seed.json")
