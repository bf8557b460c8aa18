"""What a user reads on the run pages: each run's own result, ready plans, node logs and rendered
params, the trigger form and the plan_llm connection form (dag.test on SQLite, Airflow in-process)."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import pytest

from airflow_plan_provider import NodeExecution
from airflow_plan_provider.contract import FINALIZE_TASK, NODES_TASK, PLAN_TASK, REPLAN_CONF_KEY
from airflow_plan_provider.dag_factory import plan_params
from airflow_plan_provider.testing import CallLog, ScriptedPlanner, scripted_registry
from airflow_plan_provider.testing.in_process import run_plan_dag, run_session
from harness.seed import seed_plan, seed_replan_story, seed_revision, seed_tools
from tests.airflow.support import task_states, xcom

pytestmark = pytest.mark.airflow

GOAL = "find why the payment API got slow yesterday"


def build(dag_id: str, planner: Any, tools: list[Any], **options: Any) -> Any:
    from airflow_plan_provider.dag_factory import build_plan_dag

    options.setdefault("execution", NodeExecution(retries=0, retry_delay=timedelta(0)))
    return build_plan_dag(dag_id, planner=planner, tools=scripted_registry(*tools), **options)


def test_a_run_that_replanned_reports_the_request_not_a_failure(tmp_path):
    log = CallLog(tmp_path)
    planner, tools = seed_replan_story(log)
    runs = run_session(build("pages_replanned", planner, tools), {"goal": GOAL}).runs
    root, child = runs

    assert task_states(root)[FINALIZE_TASK] == "success"
    own = xcom(root, FINALIZE_TASK)
    assert (own["status"], own["reason"]) == ("replanned", "replan_requested")
    assert "failed" not in {r["status"] for r in own["history"]}
    assert own["replan"] == {
        "revision": 1,
        "run_id": child.run_id,
        "trigger_node": "3",
        "failed": {},
        "replan_requested": {"3": "query_deploys: no deploys yesterday"},
        "chain_result": "XCom return_value of task 'replan' in this run",
    }
    assert "node 3 requested a replan" in own["message"]
    final = xcom(child, FINALIZE_TASK)
    assert (final["status"], final["reason"], final["replan"]) == ("completed", "goal_met", None)


def test_an_invalid_ready_plan_is_rejected_with_its_problems_at_once(tmp_path):
    planner = ScriptedPlanner(seed_plan())
    bad = seed_plan()
    bad["edges"].append({"from": "6", "to": "1"})
    bad["nodes"][0]["tool"] = "no_such_tool"
    dag = build("pages_ready_invalid", planner, seed_tools(CallLog(tmp_path)))
    run = run_plan_dag(dag, {"goal": GOAL, "plan": bad})

    assert task_states(run)[PLAN_TASK] == "failed"
    result = xcom(run, FINALIZE_TASK)
    assert result["reason"] == "invalid_plan"
    first_line, *problems = result["message"].splitlines()
    assert first_line.startswith("the ready plan is invalid: 2 problem(s)")
    assert "attempt" not in result["message"] and "repair(s)" not in result["message"]
    assert any("cycle" in p for p in problems) and any("no_such_tool" in p for p in problems)
    assert planner.requests == []  # the DAG's planner was not asked to repair (or write) anything


def test_a_failed_node_of_a_ready_plan_ends_the_session_with_its_error(tmp_path):
    log = CallLog(tmp_path)
    tools = seed_tools(log, query_deploys={"permanent": "deploy API says 403"})
    # the DAG's planner has a revision for this error, but a ready plan is never replanned
    planner = ScriptedPlanner(seed_plan(), on_error=[("403", seed_revision())])
    runs = run_session(build("pages_ready_fails", planner, tools), {"goal": GOAL, "plan": seed_plan()}).runs

    assert len(runs) == 1  # no replan run that cannot help
    assert xcom(runs[0], FINALIZE_TASK, key=REPLAN_CONF_KEY) is None
    result = xcom(runs[0], FINALIZE_TASK)
    assert (result["status"], result["reason"]) == ("failed", "node_failed")
    assert "node 3 failed: query_deploys: deploy API says 403" in result["message"]
    assert "no planner can replan a ready plan" in result["message"]
    assert planner.requests == []
    assert str(runs[0].state) == "failed"


def test_node_logs_tell_decision_params_duration_and_output_and_render_the_params(tmp_path, capfd):
    from tests.airflow.support import rendered_fields

    log = CallLog(tmp_path)
    plan = seed_plan(optional_4_to_5=True)
    plan["nodes"][0]["params"] = {"service": "payment-api", "token": "s3cr3t-token-value"}
    tools = seed_tools(log, query_error_logs={"permanent": "log service down"}, query_deploys={"sleep": 0.2})
    run = run_plan_dag(build("pages_node_logs", ScriptedPlanner(plan), tools, replan=False), {"goal": GOAL})
    text = capfd.readouterr()
    logs = text.out + text.err

    assert "s3cr3t-token-value" not in logs
    assert re.search(r"node 1 params: \{.*\"service\": \"payment-api\".*\"token\": \"\*\*\*\"", logs)
    assert "node 1 runs: every parent succeeded" in logs
    assert re.search(r"node 3 succeeded in 0\.[2-9]\d* s; output: \[\]", logs)
    assert "node 4 failed after " in logs and "log service down" in logs
    assert "node 5 runs with missing inputs: optional parent(s) 4 did not succeed" in logs
    assert re.search(r'node 5 params: \{"latency": \{"p99": 870\}, "logs": null\}', logs)
    assert re.search(r'node 6 succeeded in [\d.]+ s; output: \{"report":', logs)

    rendered = rendered_fields(run)
    assert rendered[NODES_TASK, 0]["resolved_params"] == {"service": "payment-api", "token": "***"}
    assert rendered[NODES_TASK, 4]["resolved_params"] == {"latency": {"p99": 870}, "logs": None}
    # the one rendered field: nothing of the brief a node maps over is rendered or shown again
    assert set(rendered[NODES_TASK, 4]) == {"resolved_params"}


def test_a_skipped_and_a_reused_node_say_why(tmp_path, capfd):
    log = CallLog(tmp_path)
    planner, tools = seed_replan_story(log)
    run_session(build("pages_skip_reuse", planner, tools), {"goal": GOAL})
    text = capfd.readouterr()
    logs = text.out + text.err
    assert "node 5 skipped because parent 3 requested a replan" in logs
    assert "node 6 skipped because parent 5 skipped" in logs
    assert 'node 1 reused: it succeeded in an earlier revision; output: {"p99": 870}' in logs


def test_trigger_form_describes_budgets_and_shows_a_ready_plan_of_the_dags_own_tools():
    from airflow_plan_provider.plan.validate import validate_plan
    from airflow_plan_provider.tools.registry import ToolRegistry

    tools = ToolRegistry()

    @tools.tool(description="Orders of a day.")
    def fetch_orders(day: str, limit: int = 10) -> list:
        return []

    @tools.tool(description="Refunds of a region.")
    def fetch_refunds(region: str = "eu") -> list:
        return []

    @tools.tool(description="Compare two series.")
    def compare(orders: list, refunds: dict, label: str) -> dict:
        return {}

    form = {name: param.dump() for name, param in plan_params("a goal", tools=tools).items()}
    for name in ("max_replans", "max_steps"):
        assert len(form[name]["description"] or "") > 40, name
    assert "replan" in form["max_replans"]["description"] and "tool calls" in form["max_steps"]["description"]
    text = form["plan"]["schema"]["description_md"]
    example = json.loads(re.search(r"```json\n(.*?)\n```", text, re.S).group(1))
    # a valid plan of this DAG's tools: two nodes feeding a third, which takes their outputs
    assert validate_plan(example, tools).layers == [["1", "2"], ["3"]]
    assert {node["tool"] for node in example["nodes"]} <= set(tools)
    assert [node["params"] for node in example["nodes"]] == [
        {"day": "<day>"},
        {},
        {"orders": "${1}", "refunds": "${2}", "label": "<label>"},
    ]
    # no inline code: Airflow draws its box taller than the line, over the lines around it
    assert "`" not in text.replace("```json\n", "").replace("\n```", "")
    assert "example" not in plan_params("a goal")["plan"].dump()["schema"]["description_md"].lower()


def test_a_frozen_or_non_replanning_dags_form_has_only_the_fields_that_apply():
    assert list(plan_params("g", frozen=True)) == ["max_steps"]
    assert list(plan_params("g", replans=False)) == ["goal", "plan", "max_steps"]
    assert list(plan_params("g")) == ["goal", "plan", "max_replans", "max_steps"]


def test_trigger_form_lists_the_dags_tools_beside_the_ready_plan(tmp_path):
    from airflow_plan_provider.tools.registry import ToolRegistry

    registry = ToolRegistry()

    @registry.tool(description="Hourly latency of a service.\nMore detail the form leaves out.")
    def query_metrics(service: str, day: str = "yesterday") -> dict:
        return {}

    @registry.tool(description="Delete stale rows.", needs_approval=True)
    def purge(table: str, rows: int) -> dict:
        return {}

    dag = build("pages_form_tools", ScriptedPlanner(seed_plan()), seed_tools(CallLog(tmp_path)))
    built = dag.params.get_param("plan").dump()["schema"]["description_md"]
    assert "**This DAG's tools**" in built and "- **query_deploys**: " in built
    text = plan_params("g", tools=registry)["plan"].dump()["schema"]["description_md"]
    listed = text.split("**This DAG's tools**\n\n", 1)[1].splitlines()
    assert listed == [
        "- **purge**: Delete stale rows. Needs approval. Params: table (string), rows (integer).",
        "- **query_metrics**: Hourly latency of a service. Params: service (string), day (string, optional).",
    ]


def test_plan_llm_connection_form_through_the_hook_meta_endpoint():
    """What the api-server's ``/ui/connections/hook_meta`` returns for the plan_llm type."""
    from airflow.api_fastapi.core_api.routes.ui.connections import hook_meta_data

    meta = next(m for m in hook_meta_data() if m.connection_type == "plan_llm").model_dump(mode="json")
    assert meta["hook_name"] == "Plan LLM (OpenAI-compatible)"
    fields = meta["standard_fields"]
    assert (fields["host"]["title"], fields["host"]["placeholder"]) == (
        "Base URL",
        "https://api.openai.com/v1",
    )
    assert (fields["password"]["title"], fields["password"]["hidden"]) == ("API key", False)
    assert fields["login"]["hidden"] is True
    model = meta["extra_fields"]["model"]
    assert model["schema"]["title"] == "Model" and "gpt-4o-mini" in model["description"]
    assert "gpt-4o-mini" in model["schema"]["examples"]


def test_a_missing_llm_connection_says_how_to_define_it_and_the_command_given_does(monkeypatch):
    """``plan_and_execute_llm`` without its connection: the error gives the command, the UI path and the
    environment variable; the command, run as given, defines the connection, and so does the variable."""
    import shlex
    import subprocess
    import sys
    from pathlib import Path

    from airflow_plan_provider.exceptions import PlanningError
    from airflow_plan_provider.hooks.llm import PlanLLMHook
    from airflow_plan_provider.planners.base import PlanRequest
    from airflow_plan_provider.planners.llm import LLMPlanner

    conn_id = "plan_llm_help_check"
    monkeypatch.delenv(f"AIRFLOW_CONN_{conn_id.upper()}", raising=False)
    request = PlanRequest(goal="g", tools=scripted_registry(*seed_tools(CallLog(Path("/nonexistent")))))
    with pytest.raises(PlanningError) as caught:
        LLMPlanner(conn_id=conn_id).plan(request)
    message = str(caught.value)
    assert f"The conn_id `{conn_id}` isn't defined" in message
    assert "Admin > Connections > Add Connection" in message and '"Plan LLM (OpenAI-compatible)"' in message
    [command] = [line.strip() for line in message.splitlines() if "airflow connections add" in line]
    [variable] = [line.split(": ", 1)[1] for line in message.splitlines() if "AIRFLOW_CONN_" in line]

    airflow = Path(sys.executable).with_name("airflow")

    def cli(*words: str) -> str:
        done = subprocess.run(
            [str(airflow), *words], capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    arguments = shlex.split(command.replace("<API key>", "sk-test-0123456789"))
    assert arguments[:3] == ["airflow", "connections", "add"]
    cli(*arguments[1:])
    try:
        shown = cli("connections", "get", conn_id, "-o", "json")
    finally:
        cli("connections", "delete", conn_id)
    [defined] = json.loads(shown[shown.index("[") :])
    assert (defined["conn_type"], defined["host"], defined["password"]) == (
        "plan_llm",
        "https://api.openai.com/v1",
        "sk-test-0123456789",
    )
    assert defined["extra_dejson"] == {"model": "gpt-4o-mini"}

    name, value = variable.split("=", 1)
    monkeypatch.setenv(name, shlex.split(value)[0].replace("<API key>", "sk-env"))
    settings = PlanLLMHook(conn_id).settings
    assert (settings.base_url, settings.model, settings.api_key) == (
        "https://api.openai.com/v1",
        "gpt-4o-mini",
        "sk-env",
    )
