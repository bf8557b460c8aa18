"""A run's conf is decoded once per task instance whenever Airflow loads the run's instances: the planning
task warns when a conf times the plan's nodes comes to more than ``CONF_DECODE_WARNING_BYTES``."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from airflow_plan_provider import NodeExecution
from airflow_plan_provider.testing import CallLog, ScriptedTool, scripted_registry
from airflow_plan_provider.testing.in_process import run_plan_dag

pytestmark = pytest.mark.airflow

PLAN = {
    "nodes": [
        {"id": "a", "action": "emit one", "tool": "emit", "params": {"value": 1}},
        {"id": "b", "action": "emit two", "tool": "emit", "params": {"value": 2}},
    ]
}


def test_the_warning_names_the_conf_size_the_nodes_and_the_cost_per_load() -> None:
    from airflow_plan_provider.operators.plan_task import CONF_DECODE_WARNING_BYTES, heavy_conf_warning

    small = {"goal": "g", "plan": PLAN}
    assert heavy_conf_warning(small, 500) is None
    big = {"goal": "g", "notes": "x" * 100_000}  # about 100 kB
    assert heavy_conf_warning(big, CONF_DECODE_WARNING_BYTES // 100_000 - 1) is None
    warning = heavy_conf_warning(big, 500)
    assert warning is not None
    assert "conf is 100 kB" in warning and "plan has 500 nodes" in warning and "(50 MB each time" in warning


def test_a_run_whose_conf_is_heavy_for_its_plan_logs_the_warning_and_still_runs(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from airflow_plan_provider.dag_factory import build_plan_dag

    log = CallLog(tmp_path)
    tools = scripted_registry(ScriptedTool("emit", log=log, returns=lambda params: params["value"]))
    dag = build_plan_dag(
        "heavy_conf", planner=None, tools=tools, execution=NodeExecution(retries=0, retry_delay=timedelta(0))
    )
    capfd.readouterr()
    run = run_plan_dag(dag, {"goal": "emit", "plan": PLAN, "notes": "x" * 2_100_000})
    out, err = capfd.readouterr()
    assert str(run.state) == "success" and log.count("emit") == 2
    assert "plan has 2 nodes: Airflow decodes a run's conf once for each of its task instances" in out + err

    capfd.readouterr()
    quiet = run_plan_dag(dag, {"goal": "emit", "plan": PLAN})
    out, err = capfd.readouterr()
    assert str(quiet.state) == "success"
    assert "Airflow decodes a run's conf" not in out + err
