"""A deployment offers its planner only the tools its DAG names: no registry is in a catalog by being
installed (the demo's least of all), ``tools=None`` is refused at DAG build, ``"*"`` opts in to every
installed registry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tomllib
from importlib.metadata import distribution
from pathlib import Path

import pytest

from airflow_plan_provider.contract import NODES_TASK, PLAN_TASK
from airflow_plan_provider.tools.registry import ENTRY_POINT_GROUP, load_tools

ROOT = Path(__file__).resolve().parents[2]


def test_the_package_installs_no_tool_registry() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"].get("entry-points", {})
    assert declared.get(ENTRY_POINT_GROUP, {}) == {}
    installed = [
        p for p in distribution("airflow-plan-provider").entry_points if p.group == ENTRY_POINT_GROUP
    ]
    assert installed == []


def test_load_tools_refuses_none() -> None:
    with pytest.raises(ValueError, match=r"name the tools this DAG offers: .*installed: \["):
        load_tools(None)


@pytest.mark.airflow
def test_build_plan_dag_refuses_unnamed_tools() -> None:
    from airflow_plan_provider.dag_factory import build_plan_dag

    with pytest.raises(
        ValueError, match=r"name the tools this DAG offers: a ToolRegistry, 'module:attribute'"
    ):
        build_plan_dag("no_tools", planner=None)
    with pytest.raises(ValueError, match="name the tools this DAG offers"):
        build_plan_dag("no_tools", planner=None, tools=None)


# An installed team package: a distribution on sys.path whose entry point names its registry.
TEAM_TOOLS = """
from airflow_plan_provider.tools.registry import ToolRegistry

registry = ToolRegistry()


@registry.tool(description="page the on-call engineer")
def page_oncall(team: str) -> str:
    return team
"""

CHECK = """
import json, sys
from airflow_plan_provider.contract import NODES_TASK, PLAN_TASK
from airflow_plan_provider.dag_factory import build_plan_dag
from airflow_plan_provider.tools.registry import load_tools

out = {}
try:
    build_plan_dag("unnamed", planner=None)
except ValueError as error:
    out["unnamed"] = str(error)
try:
    build_plan_dag("unknown", planner=None, tools="no_such_registry")
except ValueError as error:
    out["unknown"] = str(error)
dag = build_plan_dag("everything", planner=None, tools="*")
out["carried"] = [dag.get_task(PLAN_TASK).tools, dag.get_task(NODES_TASK).partial_kwargs["tools"]]
out["star"] = sorted(load_tools("*"))
out["by_name"] = sorted(load_tools("team"))
with open(sys.argv[1], "w") as handle:
    json.dump(out, handle)
"""


@pytest.mark.airflow
def test_installed_registries_are_offered_only_when_named(tmp_path: Path) -> None:
    site = tmp_path / "site"
    dist_info = site / "team_tools-1.0.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: team-tools\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nteam = team_tools:registry\n")
    (site / "team_tools.py").write_text(textwrap.dedent(TEAM_TOOLS))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)])}
    out = tmp_path / "out.json"
    result = subprocess.run(
        [sys.executable, "-c", CHECK, str(out)], capture_output=True, text=True, env=env, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(out.read_text())
    assert seen["unnamed"] == (
        "name the tools this DAG offers: a ToolRegistry, 'module:attribute' or an installed entry-point "
        "name ('*' offers every installed registry); installed: ['team']"
    )
    assert seen["unknown"] == "no tool registry named 'no_such_registry'; installed: ['team']"
    assert seen["carried"] == ["*", "*"]  # a spec string: loaded in the worker, serialized as is
    assert seen["star"] == seen["by_name"] == ["page_oncall"]  # the team's tools, and not the demo's


@pytest.mark.airflow
def test_example_dag_names_the_demo_registry() -> None:
    from airflow_plan_provider.airflow_features import dag_bag

    DagBag, _ = dag_bag()

    from plan_demo.tools import registry

    bag = DagBag(dag_folder=str(ROOT / "dags"))
    assert bag.import_errors == {}
    dag = bag.dags["plan_and_execute"]
    assert load_tools(dag.get_task(PLAN_TASK).tools) is registry
    assert load_tools(dag.get_task(NODES_TASK).partial_kwargs["tools"]) is registry
