"""``airflow-plan validate`` run as a subprocess: exit codes, stdout and stderr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]

SEED_PLAN: dict[str, Any] = {
    "goal": "find why checkout latency went up",
    "nodes": [
        {
            "id": "1",
            "action": "query latency metrics",
            "tool": "query_metrics",
            "params": {"service": "checkout"},
        },
        {
            "id": "2",
            "action": "query error rates",
            "tool": "query_metrics",
            "params": {"service": "payments"},
        },
        {"id": "3", "action": "summarize", "tool": "summarize", "params": {"text": "${1.p99}"}},
    ],
    "edges": [{"from": "1", "to": "3"}, {"from": "2", "to": "3", "optional": True}],
}

TOOLS_MODULE = """
from airflow_plan_provider.tools.registry import ToolRegistry

registry = ToolRegistry()


@registry.tool
def query_metrics(service: str) -> dict:
    return {}


@registry.tool
def summarize(text: str) -> str:
    return text
"""


def run_cli(
    *args: str, stdin: str | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(ROOT), str(cwd or ""), os.environ.get("PYTHONPATH")])
        ),
    }
    return subprocess.run(
        [sys.executable, "-m", "airflow_plan_provider.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd or ROOT,
        timeout=60,
    )


@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(SEED_PLAN))
    return path


@pytest.fixture
def tools_dir(tmp_path: Path) -> Path:
    (tmp_path / "my_tools.py").write_text(TOOLS_MODULE)
    return tmp_path


def test_valid_plan_prints_layers(plan_file: Path) -> None:
    result = run_cli("validate", str(plan_file))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"layers": [["1", "2"], ["3"]]}
    assert result.stderr == ""


def test_plan_from_stdin() -> None:
    result = run_cli("validate", "-", stdin=json.dumps(SEED_PLAN))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"layers": [["1", "2"], ["3"]]}


def test_invalid_plan_prints_one_line_per_problem(tmp_path: Path) -> None:
    plan = {
        "nodes": [{"id": "1", "action": "a", "tool": "t"}, {"id": "1", "action": "b", "tool": "t"}],
        "edges": [{"from": "1", "to": "9"}],
    }
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(plan))
    result = run_cli("validate", str(path))
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "duplicate_id: node id '1' is used 2 times [nodes: 1]",
        "dangling_edge: edge 1 -> 9 names unknown node(s) 9 [nodes: 9] at edges[0]",
    ]


def test_cycle_is_reported(tmp_path: Path) -> None:
    plan = {
        "nodes": [{"id": "1", "action": "a", "tool": "t"}, {"id": "2", "action": "b", "tool": "t"}],
        "edges": [{"from": "1", "to": "2"}, {"from": "2", "to": "1"}],
    }
    result = run_cli("validate", "-", stdin=json.dumps(plan))
    assert result.returncode == 1
    assert result.stderr.startswith("cycle: plan has a cycle: ")


def test_text_that_is_not_json_is_a_problem_not_a_usage_error() -> None:
    result = run_cli("validate", "-", stdin="nodes: [1, 2]")
    assert result.returncode == 1
    assert result.stderr.startswith("schema: plan is not valid JSON")


def test_tools_from_module_attribute(plan_file: Path, tools_dir: Path) -> None:
    result = run_cli("validate", str(plan_file), "--tools", "my_tools:registry", cwd=tools_dir)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"layers": [["1", "2"], ["3"]]}


def test_tools_check_params_and_names(tools_dir: Path) -> None:
    plan = {
        "nodes": [
            {"id": "1", "action": "a", "tool": "query_metrics", "params": {"service": 5}},
            {"id": "2", "action": "b", "tool": "page_oncall", "params": {}},
        ]
    }
    result = run_cli("validate", "-", "--tools", "my_tools:registry", stdin=json.dumps(plan), cwd=tools_dir)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "bad_params: node '1' (query_metrics): 5 is not of type 'string' [nodes: 1] at params.service",
        "unknown_tool: node '2' uses unknown tool 'page_oncall'; known tools: query_metrics, summarize"
        " [nodes: 2] at nodes[1].tool",
    ]


def test_limits_are_applied(plan_file: Path) -> None:
    result = run_cli("validate", str(plan_file), "--max-nodes", "2", "--max-depth", "1")
    assert result.returncode == 1
    codes = [line.split(":", 1)[0] for line in result.stderr.splitlines()]
    assert codes == ["too_many_nodes", "too_deep"]
    assert run_cli("validate", str(plan_file), "--max-nodes", "3", "--max-depth", "2").returncode == 0


def test_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    result = run_cli("validate", str(tmp_path / "nope.json"))
    assert result.returncode == 2
    assert result.stdout == ""
    assert "cannot read" in result.stderr
    assert "nope.json" in result.stderr


def test_directory_is_a_usage_error(tmp_path: Path) -> None:
    assert run_cli("validate", str(tmp_path)).returncode == 2


def test_unknown_tool_registry_is_a_usage_error(plan_file: Path) -> None:
    result = run_cli("validate", str(plan_file), "--tools", "no_such_registry_name")
    assert result.returncode == 2
    assert "cannot load tools 'no_such_registry_name'" in result.stderr

    result = run_cli("validate", str(plan_file), "--tools", "no_such_module_xyz:registry")
    assert result.returncode == 2
    assert "cannot load tools" in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        (),
        ("lint", "plan.json"),
        ("validate",),
        ("validate", "plan.json", "--max-nodes", "0"),
        ("validate", "plan.json", "--max-depth", "many"),
        ("validate", "plan.json", "--colour"),
    ],
)
def test_usage_errors_exit_2(args: tuple[str, ...]) -> None:
    result = run_cli(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "usage: airflow-plan" in result.stderr


def test_help_exits_0() -> None:
    result = run_cli("validate", "--help")
    assert result.returncode == 0
    assert "--max-depth" in result.stdout
