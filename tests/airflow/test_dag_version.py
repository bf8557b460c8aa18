"""A parse of an unchanged DAG file must serialize to the same DAG: otherwise every parse makes a new
DAG version (the dag-processor compares the serialized DAG's hash with the latest version's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_plan_provider.testing import CallLog, ScriptedTool, scripted_registry
from airflow_plan_provider.tools.registry import ToolRegistry

ROOT = Path(__file__).resolve().parents[2]

# Parses a DAG folder the way the dag-processor does (DagBag) and writes, per DAG, Airflow's own
# serialization and the hash that decides whether a new DAG version is written.
PARSE_AND_SERIALIZE = """
import json, sys
from airflow_plan_provider.airflow_features import dag_bag
from airflow.serialization import serialized_objects
from airflow.serialization.serialized_objects import LazyDeserializedDAG

DagBag, _ = dag_bag()
# DagSerialization since Airflow 3.2, SerializedDAG before
DagSerialization = getattr(serialized_objects, "DagSerialization", serialized_objects.SerializedDAG)
bag = DagBag(dag_folder=sys.argv[1])
if bag.import_errors:
    raise SystemExit(f"import errors: {bag.import_errors}")
out = {}
for dag_id, dag in sorted(bag.dags.items()):
    data = DagSerialization.to_dict(dag)
    out[dag_id] = {"hash": LazyDeserializedDAG(data=data).hash, "json": json.dumps(data, sort_keys=True)}
with open(sys.argv[2], "w") as handle:
    json.dump(out, handle)
"""


def parse_in_new_process(dag_folder: Path, out: Path) -> dict[str, Any]:
    env = {
        **os.environ,
        # the dags folder too, as Airflow puts it on sys.path: the example DAGs import plan_demo
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(ROOT), str(ROOT / "dags"), os.environ.get("PYTHONPATH")])
        ),
    }
    result = subprocess.run(
        [sys.executable, "-c", PARSE_AND_SERIALIZE, str(dag_folder), str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.airflow
def test_example_dags_serialize_the_same_in_two_processes(tmp_path: Path) -> None:
    first = parse_in_new_process(ROOT / "dags", tmp_path / "first.json")
    second = parse_in_new_process(ROOT / "dags", tmp_path / "second.json")
    assert set(first) >= {"plan_and_execute", "plan_and_execute_llm"}
    assert first.keys() == second.keys()
    for dag_id in first:
        assert first[dag_id]["hash"] == second[dag_id]["hash"], dag_id  # same hash: no new version
        assert first[dag_id]["json"] == second[dag_id]["json"], dag_id
        assert " at 0x" not in first[dag_id]["json"], dag_id  # no object repr at all


# every option that puts an object on a task: planners, registries (as object and as spec), timedeltas
EVERY_OPTION_DAGS = """
from datetime import timedelta

from airflow.sdk import DAG

from airflow_plan_provider import (
    ApprovalPolicy, ArtifactStore, Budgets, ControlRetries, Limits, NodeExecution, build_plan_dag,
    plan_task_group,
)
from airflow_plan_provider.planners.llm import LLMPlanner
from airflow_plan_provider.testing import CallLog, ScriptedPlanner, ScriptedTool, scripted_registry

log = CallLog({log!r})
tools = scripted_registry(ScriptedTool("a", log=log), ScriptedTool("b", log=log, job_seconds=1))
execution = dict(
    pool="plan_nodes", timeout=timedelta(minutes=3), retry_delay=timedelta(seconds=7),
    max_retry_delay=timedelta(minutes=1),
)
options = dict(
    limits=Limits(max_nodes=50),
    budgets=Budgets(max_steps=9, max_replans=1),
    artifacts=ArtifactStore(url="file:///tmp/plan-artifacts", threshold=1024, checkpoints=False),
    control_retries=ControlRetries(retries=1, delay=timedelta(seconds=3)),
    approval=ApprovalPolicy("always", timeout=timedelta(hours=2), approvers=["alice"]),
    operator_args={{"owner": "data-team", "queue": "plans", "on_failure_callback": print}},
)
llm = LLMPlanner(conn_id="x")
llm_dag = build_plan_dag(
    "every_option_llm", planner=llm, tools=tools,
    execution=NodeExecution(slot_wait=timedelta(seconds=9), **execution), **options,
)
scripted = build_plan_dag(
    "every_option_script", planner=ScriptedPlanner(None), tools=dict(tools),
    execution=NodeExecution(**execution), **options,
)
by_spec = build_plan_dag("by_spec", planner=None, tools="plan_demo.tools:registry")
with DAG("in_a_group", schedule=None) as in_a_group:
    plan_task_group("triage", planner=llm, tools=tools, goal="triage {{{{ ds }}}}", **options)
"""


@pytest.mark.airflow
def test_every_option_serializes_the_same_in_two_processes(tmp_path: Path) -> None:
    folder = tmp_path / "dags"
    folder.mkdir()
    (folder / "every_option.py").write_text(EVERY_OPTION_DAGS.format(log=str(tmp_path / "calls")))
    first = parse_in_new_process(folder, tmp_path / "first.json")
    second = parse_in_new_process(folder, tmp_path / "second.json")
    assert set(first) == {"every_option_llm", "every_option_script", "by_spec", "in_a_group"}
    for dag_id in first:
        assert first[dag_id]["hash"] == second[dag_id]["hash"], dag_id
        assert " at 0x" not in first[dag_id]["json"], dag_id


def test_registry_repr_is_its_content_not_its_address(tmp_path: Path) -> None:
    log = CallLog(tmp_path)
    one = scripted_registry(ScriptedTool("b", log=log), ScriptedTool("a", log=log))
    two = scripted_registry(ScriptedTool("a", log=log), ScriptedTool("b", log=log))
    assert one is not two
    assert repr(one) == repr(two)
    assert " at 0x" not in repr(one)
    assert repr(one).startswith("ToolRegistry(tools=['a', 'b'], catalog_sha256=")
    assert all(" at 0x" not in repr(tool) for tool in one.values())

    changed = ToolRegistry()

    @changed.tool(description="a different tool under a known name")
    def a(text: str) -> str:
        return text

    changed.add(one["b"])
    assert repr(changed) != repr(one)  # a different catalog is a different DAG
