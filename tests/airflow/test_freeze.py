"""Freezing a session into a scheduled DAG file: templates, secrets, the rendered file, the command line,
and the committed example ``dags/daily_payment_report.py`` run under ``dag.test()`` against its source
session.

Freezing through the REST API of a real Airflow, and a backfill of the example: tests/e2e/test_approval.py.
"""

from __future__ import annotations

import ast
import importlib.util
import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_plan_provider.cli import main
from airflow_plan_provider.contract import APPROVE_TASK, FINALIZE_TASK, PLAN_KEY, PLAN_TASK
from airflow_plan_provider.exceptions import FreezeError
from airflow_plan_provider.freeze import (
    FrozenSource,
    ParamTemplate,
    apply_templates,
    drop_answered,
    literal,
    render_dag_file,
    replan_requests,
    secret_params,
    source_from_plan,
)

ROOT = Path(__file__).resolve().parents[2]
DAILY = ROOT / "dags" / "daily_payment_report.py"
TOOLS = "plan_demo.tools:registry"
DAY = "{{ macros.ds_add(ds, -1) }}"


def demo_plan(**extra_params: Any) -> dict[str, Any]:
    return {
        "goal": "latency report",
        "nodes": [
            {"id": "1", "action": "metrics", "tool": "query_metrics", "params": {"service": "payment-api"}},
            {
                "id": "2",
                "action": "health",
                "tool": "query_service_health",
                "params": {"service": "payment-api", "day": "yesterday", **extra_params},
            },
        ],
        "edges": [{"from": "1", "to": "2"}],
    }


def render(plan: dict[str, Any], *templates: str, **options: Any) -> str:
    options.setdefault("dag_id", "daily_report")
    options.setdefault("tools", TOOLS)
    options.setdefault("schedule", "@daily")
    options.setdefault("start_date", date(2024, 1, 1))
    source = FrozenSource(
        plan=plan,
        origin="DAG d, session run r",
        revision=2,
        replans=1,
        final_run="r__replan_2",
        dag_id="d",
        run_id="r",
        run_date="2026-11-29",
    )
    return render_dag_file(source, templates=[ParamTemplate.parse(t) for t in templates], **options)


def module_parts(text: str) -> tuple[str, dict[str, Any], dict[str, str]]:
    """The file's docstring, its PLAN literal, and the build_plan_dag call's keyword arguments (source)."""
    tree = ast.parse(text)
    plan = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "PLAN")  # type: ignore[attr-defined]
    call = next(n.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call))
    keywords = {k.arg: ast.unparse(k.value) for k in call.keywords if k.arg}  # type: ignore[attr-defined]
    return ast.get_docstring(tree) or "", ast.literal_eval(plan.value), keywords


# --- templates and secrets --------------------------------------------------------------------------------


def test_a_template_replaces_a_param_in_every_node_or_in_one() -> None:
    everywhere = apply_templates(demo_plan(), [ParamTemplate.parse("service={{ params.svc }}")])
    assert [n["params"]["service"] for n in everywhere["nodes"]] == ["{{ params.svc }}"] * 2
    one = apply_templates(demo_plan(), [ParamTemplate.parse("2.day={{ ds }}")])
    assert one["nodes"][1]["params"]["day"] == "{{ ds }}" and demo_plan() == apply_templates(demo_plan(), [])
    with pytest.raises(FreezeError, match="any node has no param 'region'"):
        apply_templates(demo_plan(), [ParamTemplate.parse("region=eu")])
    with pytest.raises(FreezeError, match="node 1 has no param 'day'"):
        apply_templates(demo_plan(), [ParamTemplate.parse("1.day={{ ds }}")])
    with pytest.raises(FreezeError, match="no node '9'"):
        apply_templates(demo_plan(), [ParamTemplate.parse("9.day={{ ds }}")])
    with pytest.raises(FreezeError, match=r"not \[NODE\.\]NAME=VALUE"):
        ParamTemplate.parse("no equals sign")


def test_a_secret_in_the_params_must_be_a_template_rendered_at_run_time() -> None:
    plan = demo_plan(auth={"api_key": "sk-live-123", "region": "eu"}, password="")
    assert secret_params(plan) == ["node 2 param auth.api_key"]
    with pytest.raises(FreezeError, match=r"node 2 param auth\.api_key") as raised:
        render(plan)
    assert "sk-live-123" not in str(raised.value)
    assert secret_params(demo_plan(api_key="{{ var.value.report_key }}")) == []
    # a template with the secret beside it is no template
    assert secret_params(demo_plan(api_key="{{ ds }}sk-live-123{{ ds }}")) == ["node 2 param api_key"]
    text = render(demo_plan(api_key="sk-live-123"), "2.api_key={{ var.value.report_key }}")
    assert "sk-live-123" not in text and "{{ var.value.report_key }}" in text


# --- the file ---------------------------------------------------------------------------------------------


def test_the_file_names_goal_revision_and_source_and_builds_a_frozen_scheduled_dag() -> None:
    text = render(demo_plan(), f"day={DAY}")
    assert text == render(demo_plan(), f"day={DAY}")  # the same inputs, the same file
    doc, plan, keywords = module_parts(text)
    assert doc.splitlines()[:8] == [
        "daily_report: a frozen plan, run on a schedule with no planner call.",
        "",
        "- **Goal:** latency report",
        "- **Frozen from:** run r of DAG d, made on 2026-11-29 (a run of the Airflow the plan was read from,",
        "  which may not be this one)",
        "- **Revision:** 2, after 1 replan(s); it ran as r__replan_2",
        "- **Schedule:** @daily, from 2024-01-01 (UTC)",
        "",
    ]
    assert "- 2 · health (query_service_health)" in doc
    assert f"    --param 'day={DAY}'" in doc and "    --schedule @daily" in doc
    assert plan == apply_templates(demo_plan(), [ParamTemplate.parse(f"day={DAY}")])
    assert keywords == {
        "planner": "None",
        "plan": "PLAN",
        "tools": "tools",
        "goal": "PLAN['goal']",
        "schedule": "'@daily'",
        "start_date": "datetime(2024, 1, 1, tzinfo=UTC)",
        "catchup": "False",
        "replan": "False",
        "budgets": "Budgets(max_replans=0)",
        "tags": "['plan', 'frozen']",
        "description": "'Frozen plan, @daily: latency report'",
        "doc_md": "__doc__",
    }
    assert "from plan_demo.tools import registry as tools\n" in text
    by_name = render(demo_plan(), tools="example_tools", import_tools=False, approval="always")
    assert module_parts(by_name)[2]["tools"] == "'example_tools'"
    assert module_parts(by_name)[2]["approval"] == "ApprovalPolicy('always')"


def test_plan_text_cannot_escape_the_docstring_or_the_literal() -> None:
    hostile = '"""\nimport os; os.system("x")  # \\ \x1b[31m \u202e end'
    plan = demo_plan(note=hostile)
    plan["goal"] = hostile
    plan["nodes"][0]["action"] = hostile
    text = render(plan)
    tree = ast.parse(text)
    kinds = [type(n).__name__ for n in tree.body]
    assert kinds == ["Expr", *["ImportFrom"] * 4, "Assign", "Assign"]  # docstring, imports, PLAN, the DAG
    doc, frozen, _ = module_parts(text)
    assert frozen == plan  # the literal holds the text exactly
    assert "\x1b" not in text and "\u202e" not in text  # escaped, visible
    shown = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in hostile)
    assert f"- **Goal:** {shown}" in " ".join(doc.splitlines()) and f"- 1 · {shown} (query_metrics)" in doc


def test_a_node_that_requested_a_replan_is_dropped_only_when_no_node_depends_on_it() -> None:
    plan = demo_plan()
    plan["nodes"].append({"id": "3", "action": "deploys", "tool": "query_deploys", "params": {}})
    plan["edges"].append({"from": "3", "to": "2", "optional": True})
    result = {
        "history": [{"node_id": "1", "replan_requested": True}, {"node_id": "3", "replan_requested": True}]
    }
    assert replan_requests(result) == ["1", "3"]
    # node 1 and node 3 feed node 2: both kept
    assert drop_answered(plan, ["1", "3"]) == (plan, [])
    plan["edges"].pop()  # the revision stopped reading node 3
    kept, dropped = drop_answered(plan, ["1", "3"])
    assert (
        dropped == ["3"] and [n["id"] for n in kept["nodes"]] == ["1", "2"] and kept["edges"] == plan["edges"]
    )
    source = FrozenSource(plan=kept, origin="DAG d, session run r", dropped=(plan["nodes"][2],))
    text = render_dag_file(
        source, dag_id="daily", tools=TOOLS, schedule="@daily", start_date=date(2024, 1, 1)
    )
    doc, frozen, _ = module_parts(text)
    assert [n["id"] for n in frozen["nodes"]] == ["1", "2"]
    assert "**Left out** of the source's final plan" in doc and "- 3 · deploys (query_deploys)" in doc
    assert "a conf that gives a plan is refused" in doc


def test_bad_dag_id_or_approval_mode_is_refused() -> None:
    with pytest.raises(FreezeError, match="not a valid DAG id"):
        render(demo_plan(), dag_id="daily report")
    with pytest.raises(FreezeError, match="--approval"):
        render(demo_plan(), approval="sometimes")
    with pytest.raises(FreezeError, match="is not a plan"):
        source_from_plan(b'{"nodes": "none"}', "plan.json")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=25,
)


@given(json_values)
def test_the_literal_of_any_json_value_reads_back_as_that_value(value: Any) -> None:
    assert ast.literal_eval(literal(value)) == value


# --- the command line ---------------------------------------------------------------------------------------


def freeze(tmp_path: Path, plan: dict[str, Any], *args: str) -> int:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return main(
        ["freeze", str(path), f"--tools={TOOLS}", "--dag-id=daily_report", "--schedule=@daily", *args]
    )


def test_cli_writes_the_file_or_says_why_not(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "daily_report.py"
    assert freeze(tmp_path, demo_plan(), f"--param=day={DAY}", "--start-date=2024-05-01", "-o", str(out)) == 0
    doc, plan, keywords = module_parts(out.read_text())
    assert "- **Frozen from:** plan file plan.json" in doc and "- **Revision:** unknown (a plan file)" in doc
    assert plan["nodes"][1]["params"]["day"] == DAY and keywords["start_date"].startswith(
        "datetime(2024, 5, 1"
    )

    assert freeze(tmp_path, demo_plan(api_key="sk-live-123"), "-o", str(tmp_path / "x.py")) == 1
    assert "looks like a secret" in capsys.readouterr().err and not (tmp_path / "x.py").exists()
    unknown = demo_plan()
    unknown["nodes"][0]["tool"] = "drop_database"
    assert freeze(tmp_path, unknown) == 1
    assert "unknown_tool" in capsys.readouterr().err
    assert freeze(tmp_path, demo_plan(), "--param=region=eu") == 1
    assert main(["freeze", "--tools", TOOLS, "--dag-id", "d", "--schedule", "@daily"]) == 2
    assert "give PLAN, or --api" in capsys.readouterr().err
    assert freeze(tmp_path, demo_plan()) == 0
    assert capsys.readouterr().out.startswith('"""daily_report: a frozen plan')


# --- the committed example against its source session ----------------------------------------------------


def load_dag_file(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.airflow
def test_the_daily_report_runs_its_source_sessions_final_plan_for_each_day() -> None:
    from airflow_plan_provider.testing.in_process import run_plan_dag, run_session
    from tests.airflow.support import xcom

    example = load_dag_file(ROOT / "dags" / "plan_and_execute.py", "plan_and_execute_source")
    source_runs = run_session(example.plan_and_execute, {"goal": example.GOAL}).runs
    assert len(source_runs) == 2  # the seed session replans once
    source = xcom(source_runs[-1], FINALIZE_TASK)
    final_plan = xcom(source_runs[-1], PLAN_TASK, key=PLAN_KEY)
    frozen = load_dag_file(DAILY, "daily_payment_report_under_test")
    # the committed file is the seed session's final plan, with the day as a template
    # without node 3: it requested the source's replan and no node of the final plan depends on it
    assert replan_requests(source) == ["3"]
    kept, dropped = drop_answered({k: final_plan[k] for k in ("goal", "nodes", "edges")}, ["3"])
    assert dropped == ["3"]
    expected = apply_templates(kept, [ParamTemplate.parse(f"day={DAY}")])
    for edge in expected["edges"]:
        if edge.get("optional") is False:
            del edge["optional"]
    assert expected == frozen.PLAN
    dag = frozen.daily_payment_report
    assert dag.task_dict[PLAN_TASK].ready_plan == frozen.PLAN and APPROVE_TASK not in dag.task_ids

    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    run = run_plan_dag(
        dag, logical_date=today
    )  # the run at 00:00 reports on the day before: the source's "yesterday"
    assert str(run.state) == "success"
    result = xcom(run, FINALIZE_TASK)
    assert result["status"] == "completed" and result["usage"]["replans"] == 0
    # nothing in the report a reader cannot act on: no request a frozen plan cannot answer
    assert "replan" not in result["message"] and result["replan"] is None
    assert {n: result["outputs"][n] for n in "1245"} == {n: source["outputs"][n] for n in "1245"}
    assert "3" not in result["outputs"]
    mine, theirs = result["outputs"]["6"], source["outputs"]["6"]
    assert (mine["title"], mine["summary"]) == (theirs["title"], theirs["summary"])
    yesterday = (today - timedelta(days=1)).date().isoformat()
    assert Path(mine["path"]).name.startswith(f"{yesterday}_daily_payment_report_")
    # the report says which DAG and run wrote it, in the file and in the output the Plan view opens
    footer = f"Written by node 6 of run {run.run_id} of DAG daily_payment_report (revision 0, try 1)."
    assert footer in Path(mine["path"]).read_text() and footer in mine["markdown"]
    assert json.dumps(result).count("{{") == 0  # every template was rendered

    earlier = run_plan_dag(dag, logical_date=today - timedelta(days=3))
    outputs = xcom(earlier, FINALIZE_TASK)["outputs"]
    day = (today - timedelta(days=4)).date().isoformat()
    assert outputs["1"]["day"] == outputs["2"]["day"] == day and Path(outputs["6"]["path"]).name.startswith(
        day
    )


@pytest.mark.airflow
def test_only_the_dags_own_plan_is_rendered_and_a_bad_template_fails_planning(tmp_path: Path) -> None:
    from airflow_plan_provider.dag_factory import build_plan_dag
    from airflow_plan_provider.testing import CallLog, ScriptedTool, scripted_registry
    from airflow_plan_provider.testing.in_process import run_plan_dag
    from tests.airflow.support import task_states, xcom

    log = CallLog(tmp_path)
    tools = scripted_registry(ScriptedTool("echo", log=log, returns=lambda params: params))

    def plan_with(text: str) -> dict[str, Any]:
        return {
            "goal": "echo",
            "nodes": [{"id": "1", "action": "echo", "tool": "echo", "params": {"text": text}}],
        }

    dag = build_plan_dag("frozen_echo", planner=None, plan=plan_with("day {{ ds }}"), tools=tools)
    run = run_plan_dag(dag, logical_date=datetime(2024, 3, 5, tzinfo=UTC))
    assert xcom(run, FINALIZE_TASK)["outputs"]["1"] == {"text": "day 2024-03-05"}
    # the DAG runs its own plan only: the form has no "Ready plan" field, and a conf plan is refused
    assert list(dag.params) == ["max_steps"]  # only what applies: no goal, ready plan or replan budget
    refused = run_plan_dag(dag, {"plan": plan_with("{{ ds }}")})
    assert task_states(refused)[PLAN_TASK] == "failed" and log.count("echo") == 1
    result = xcom(refused, FINALIZE_TASK)
    assert result["reason"] == "invalid_plan" and "runs its own frozen plan" in result["message"]
    # a plan given in the conf (of a DAG without a frozen plan) is user input: never rendered
    conf_dag = build_plan_dag("conf_echo", planner=None, tools=tools)
    assert "plan" in conf_dag.params
    conf_run = run_plan_dag(conf_dag, {"plan": plan_with("{{ ds }}")})
    assert xcom(conf_run, FINALIZE_TASK)["outputs"]["1"] == {"text": "{{ ds }}"}

    broken = build_plan_dag("frozen_broken", planner=None, plan=plan_with("{{ no_such_name }}"), tools=tools)
    failed = run_plan_dag(broken)
    assert task_states(failed)[PLAN_TASK] == "failed" and log.count("echo") == 2
    result = xcom(failed, FINALIZE_TASK)
    assert result["reason"] == "invalid_plan" and "cannot render the DAG's plan" in result["message"]


@pytest.mark.airflow
def test_a_run_without_a_logical_date_renders_the_plan_with_its_run_after(tmp_path: Path) -> None:
    """A REST API trigger may give ``"logical_date": null``: the frozen plan's date templates then
    render with the run's ``run_after`` (the committed daily report reports on the day before it)."""
    from airflow_plan_provider.testing.in_process import run_plan_dag
    from tests.airflow.support import xcom

    frozen = load_dag_file(DAILY, "daily_payment_report_without_date")
    run_after = datetime.now(UTC).replace(hour=6, minute=47, second=0, microsecond=0)
    run = run_plan_dag(frozen.daily_payment_report, run_after=run_after, without_logical_date=True)
    assert run.logical_date is None
    assert str(run.state) == "success", xcom(run, FINALIZE_TASK)
    outputs = xcom(run, FINALIZE_TASK)["outputs"]
    yesterday = (run_after - timedelta(days=1)).date().isoformat()
    assert outputs["1"]["day"] == outputs["2"]["day"] == yesterday
    assert Path(outputs["6"]["path"]).name.startswith(f"{yesterday}_daily_payment_report_")
