"""``airflow-plan validate`` run as a subprocess: exit codes, stdout and stderr."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import unicodedata
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
STRUCTURE_ONLY = "airflow-plan: no --tools given: checked the plan's structure only, not its tools or params"

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
    *args: str, stdin: str | None = None, cwd: Path | None = None, memory_limit: int | None = None
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
        preexec_fn=None if memory_limit is None else lambda: _limit_memory(memory_limit),
    )


def _limit_memory(limit: int) -> None:
    # a CLI that reads an endless file would otherwise take the machine's memory before it fails
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def problems(result: subprocess.CompletedProcess[str]) -> list[str]:
    """stderr's problem lines, without the closing note that tools were not checked."""
    lines = result.stderr.splitlines()
    return lines[:-1] if lines and lines[-1] == STRUCTURE_ONLY else lines


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
    assert result.stderr.splitlines() == [STRUCTURE_ONLY]


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
        STRUCTURE_ONLY,
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
    assert result.stderr == ""  # tools were checked: no note


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
    result = run_cli("validate", str(plan_file), "--max-nodes", "2")
    assert result.returncode == 1
    codes = [line.split(":", 1)[0] for line in problems(result)]
    assert codes == ["too_many_nodes"]
    assert run_cli("validate", str(plan_file), "--max-nodes", "3").returncode == 0


def test_a_plan_as_deep_as_it_is_long_is_valid_with_the_default_limits(tmp_path: Path) -> None:
    """No depth limit: a chain of 30 nodes (30 layers) is valid, for the CLI as for the DAG."""
    nodes = [{"id": str(i), "action": f"step {i}", "tool": "t", "params": {}} for i in range(30)]
    edges = [{"from": str(i), "to": str(i + 1)} for i in range(29)]
    chain = tmp_path / "chain.json"
    chain.write_text(json.dumps({"goal": "g", "nodes": nodes, "edges": edges}))
    result = run_cli("validate", str(chain))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["layers"] == [[str(i)] for i in range(30)]


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
        ("validate", "plan.json", "--max-nodes", "many"),
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
    assert "--max-nodes" in result.stdout and "--max-depth" not in result.stdout


# --- untrusted input reaching the terminal, tool modules, input size ------------------------------

HOSTILE = "\x1b[2J\x1b]0;owned\x07\x9b\u202e\u2028\x7f\r"


def _terminal_safe(text: str) -> bool:
    """Nothing a terminal would act on: only printable characters and the line breaks between lines."""
    return all(char == "\n" or char.isprintable() for char in text)


def test_control_characters_from_the_plan_are_escaped(tmp_path: Path) -> None:
    plan = {
        f"extra{HOSTILE}": 1,
        "nodes": [
            {"id": f"a{HOSTILE}", "action": f"act{HOSTILE}", "tool": f"t{HOSTILE}"},
            {"id": f"a{HOSTILE}", "action": "b", "tool": "t"},
        ],
        "edges": [{"from": f"a{HOSTILE}", "to": f"z{HOSTILE}"}],
    }
    path = tmp_path / f"plan{HOSTILE}.json"
    path.write_text(json.dumps(plan))
    result = run_cli("validate", str(path))
    assert result.returncode == 1
    assert _terminal_safe(result.stderr), [
        (char, unicodedata.name(char, hex(ord(char)))) for char in result.stderr if not _terminal_safe(char)
    ]
    assert "\\x1b[2J" in result.stderr
    assert "\\u202e" in result.stderr

    missing = run_cli("validate", str(tmp_path / f"nope{HOSTILE}.json"))
    assert missing.returncode == 2
    assert _terminal_safe(missing.stderr)
    assert "nope\\x1b[2J" in missing.stderr


def test_tool_module_raising_on_import_is_one_line_and_exit_2(plan_file: Path, tmp_path: Path) -> None:
    (tmp_path / "boom_tools.py").write_text(f"raise RuntimeError({'no database' + HOSTILE!r})\n")
    result = run_cli("validate", str(plan_file), "--tools", "boom_tools:registry", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        "airflow-plan: cannot load tools 'boom_tools:registry': tool module 'boom_tools' failed to import: "
        "RuntimeError: no database\\x1b[2J\\x1b]0;owned\\x07\\x9b\\u202e\\u2028\\x7f\\r"
    ]


def test_endless_input_is_read_up_to_max_bytes() -> None:
    # /dev/zero never ends: the CLI reads 16 MiB + 1 byte by chunks and stops, well inside 1 GiB
    result = run_cli("validate", "/dev/zero", memory_limit=1024**3)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "airflow-plan: /dev/zero is larger than --max-bytes (16777216 bytes); not validated"
    ]


def test_max_bytes_bounds_stdin_and_files(tmp_path: Path) -> None:
    text = json.dumps(SEED_PLAN)
    exact = run_cli("validate", "-", "--max-bytes", str(len(text.encode())), stdin=text)
    assert exact.returncode == 0, exact.stderr
    over = run_cli("validate", "-", "--max-bytes", str(len(text.encode()) - 1), stdin=text)
    assert over.returncode == 2
    assert over.stderr.splitlines() == [
        f"airflow-plan: stdin is larger than --max-bytes ({len(text.encode()) - 1} bytes); not validated"
    ]


def test_without_tools_only_structure_is_checked_and_said(tmp_path: Path) -> None:
    plan = {"nodes": [{"id": "1", "action": "a", "tool": "no_such_tool", "params": {"x": 1}}]}
    result = run_cli("validate", "-", stdin=json.dumps(plan))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"layers": [["1"]]}
    assert result.stderr.splitlines() == [STRUCTURE_ONLY]
