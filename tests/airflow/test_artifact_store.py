"""Where the artifact store is (``PLAN_ARTIFACT_STORE``), the warning when workers may not share it, and how
its files are reached (local folders with the os module, other stores through ObjectStoragePath)."""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_plan_provider import ArtifactStore, artifacts
from airflow_plan_provider.contract import FINALIZE_TASK

CELERY_WARNING = "the plan artifact store is the local folder"


@pytest.fixture
def no_store_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(artifacts.STORE_ENV, raising=False)


def test_plan_artifact_store_names_the_default_store(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_store_env: None
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("AIRFLOW_HOME", str(home))
    assert artifacts.default_store_url() == f"file://{home}/plan_artifacts"

    shared = tmp_path / "shared"
    monkeypatch.setenv(artifacts.STORE_ENV, f"file://{shared}")
    assert artifacts.default_store_url() == f"file://{shared}"
    # large outputs and checkpoints written with no store named land in the configured one
    data = json.dumps({"rows": "x" * 100}).encode()
    ref = artifacts.store(data, key="dag/run/n/1", summary="rows", threshold=10)
    assert ref is not None and ref["uri"].startswith(f"file://{shared}/outputs/")
    artifacts.save_checkpoint("dag/run/n/1", {"output": 1})
    assert artifacts.load(ref, key="dag/run/n/1") == {"rows": "x" * 100}
    assert artifacts.load_checkpoint("dag/run/n/1") == {"output": 1}
    assert sorted(p.parent.name for p in shared.rglob("*.json")) == [
        "checkpoints",
        artifacts.key_name("dag/run/n/1"),
    ]
    assert not (home / "plan_artifacts").exists()
    # a DAG's own artifact_store still wins
    assert artifacts.checkpoint_uri("k", "s3://bucket/plans").startswith("s3://bucket/plans/checkpoints/")

    monkeypatch.setenv(artifacts.STORE_ENV, "  ")  # blank: as if unset
    assert artifacts.default_store_url() == f"file://{home}/plan_artifacts"


@pytest.mark.parametrize(
    ("executor", "distributed"),
    [
        ("LocalExecutor", []),
        ("SequentialExecutor", []),
        ("airflow.executors.local_executor.LocalExecutor", []),
        ("CeleryExecutor", ["CeleryExecutor"]),
        ("KubernetesExecutor", ["KubernetesExecutor"]),
        ("LocalExecutor, CeleryExecutor", ["CeleryExecutor"]),
        ("my_exec:my_company.executors.EdgeExecutor", ["my_exec:my_company.executors.EdgeExecutor"]),
        ("local:airflow.executors.local_executor.LocalExecutor", []),
        ("", []),
    ],
)
def test_distributed_executors_are_every_executor_but_local_and_sequential(
    executor: str, distributed: list[str]
) -> None:
    assert artifacts.distributed_executors(executor) == distributed


def test_a_distributed_executor_with_the_default_local_store_is_warned_about(no_store_env: None) -> None:
    warning = artifacts.local_store_warning(None, "CeleryExecutor")
    assert warning is not None
    assert warning.startswith(f"{CELERY_WARNING} {artifacts.default_store_url()}")
    assert "CeleryExecutor may run tasks on other machines" in warning
    assert "set PLAN_ARTIFACT_STORE" in warning
    assert artifacts.local_store_warning(None, "KubernetesExecutor") is not None
    # one machine: nothing to share
    assert artifacts.local_store_warning(None, "LocalExecutor") is None
    # a store chosen for the deployment (a shared volume, an object store) is not second-guessed
    assert artifacts.local_store_warning("s3://bucket/plans", "CeleryExecutor") is None
    assert artifacts.local_store_warning("file:///mnt/shared/plans", "CeleryExecutor") is None


def test_the_store_warning_reads_core_executor_and_honours_plan_artifact_store(
    monkeypatch: pytest.MonkeyPatch, no_store_env: None
) -> None:
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "CeleryExecutor")
    assert artifacts.local_store_warning() is not None
    monkeypatch.setenv(artifacts.STORE_ENV, "file:///opt/airflow/plan_artifacts")  # docker-compose.yml
    assert artifacts.local_store_warning() is None
    monkeypatch.delenv(artifacts.STORE_ENV)
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "LocalExecutor")
    assert artifacts.local_store_warning() is None


def _build(dag_id: str, tmp_path: Path, **options: Any) -> Any:
    from airflow_plan_provider.dag_factory import build_plan_dag
    from airflow_plan_provider.testing import CallLog, ScriptedPlanner, ScriptedTool, scripted_registry

    tools = scripted_registry(ScriptedTool("echo", log=CallLog(tmp_path / "calls"), returns="ok"))
    plan = {"goal": "g", "nodes": [{"id": "1", "action": "echo", "tool": "echo"}]}
    return build_plan_dag(dag_id, planner=ScriptedPlanner(plan), tools=tools, replan=False, **options)


def test_building_a_dag_warns_once_per_process_on_a_distributed_executor(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture, no_store_env: None
) -> None:
    from airflow_plan_provider import dag_factory

    monkeypatch.setattr(dag_factory, "_checked_stores", set())  # a fresh process
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "CeleryExecutor")
    with caplog.at_level(logging.WARNING, logger=dag_factory.__name__):
        _build("store_warning_1", tmp_path)
        _build("store_warning_2", tmp_path)
        _build("store_warning_3", tmp_path, artifacts=ArtifactStore(url="s3://bucket/plans"))
    warnings = [r.getMessage() for r in caplog.records if r.name == dag_factory.__name__]
    assert len(warnings) == 1 and warnings[0].startswith(CELERY_WARNING), warnings

    # a task process parses the file for its task (Airflow's parsing context names it): no warning in
    # every node's log, the planning task warns in its own
    caplog.clear()
    monkeypatch.setattr(dag_factory, "_checked_stores", set())
    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", "store_warning_1")
    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_TASK_ID", "nodes")
    with caplog.at_level(logging.WARNING, logger=dag_factory.__name__):
        _build("store_warning_1", tmp_path)
    assert not [r for r in caplog.records if r.name == dag_factory.__name__]

    caplog.clear()
    monkeypatch.setattr(dag_factory, "_checked_stores", set())
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "LocalExecutor")
    with caplog.at_level(logging.WARNING, logger=dag_factory.__name__):
        _build("store_warning_4", tmp_path)
    assert not [r for r in caplog.records if r.name == dag_factory.__name__]


@pytest.mark.airflow
def test_the_planning_task_log_warns_on_a_distributed_executor(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str], no_store_env: None
) -> None:
    from airflow_plan_provider.testing.in_process import run_plan_dag
    from tests.airflow.support import xcom

    dag = _build("store_warning_task", tmp_path)
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "CeleryExecutor")
    capsys.readouterr()
    run = run_plan_dag(dag)
    assert str(run.state) == "success"
    assert xcom(run, FINALIZE_TASK)["outputs"] == {"1": "ok"}
    # the task log (printed by dag.test): one warning line, from the planning task
    lines = [line for line in capsys.readouterr().out.splitlines() if CELERY_WARNING in line]
    assert len(lines) == 1, lines
    assert "[warning" in lines[0] and "operators.plan_task.PlanOperator" in lines[0]
    assert "CeleryExecutor may run tasks on other machines" in lines[0]


@pytest.mark.parametrize("scheme", ["file", "local"])
def test_a_local_store_is_the_file_objectstoragepath_names(tmp_path: Path, scheme: str) -> None:
    """Checkpoints and outputs of a local store are read and written with the os module; they are the
    files ObjectStoragePath names for the same URIs, so either reads what the other wrote."""
    from airflow.sdk import ObjectStoragePath

    base = f"{scheme}://{tmp_path}"
    artifacts.save_checkpoint("d/r/n/k", {"output": 1}, base)
    uri = artifacts.checkpoint_uri("d/r/n/k", base)
    assert artifacts._local_file(uri) == ObjectStoragePath(uri).path
    assert json.loads(ObjectStoragePath(uri).read_bytes())["record"] == {"output": 1}
    data = json.dumps({"rows": "x" * 100}).encode()
    ref = artifacts.store(data, key="d/r/n/k", summary="rows", base_url=base, threshold=10)
    assert ref is not None and ObjectStoragePath(ref["uri"]).read_bytes() == data
    assert artifacts.load(ref, key="d/r/n/k", base_url=base) == {"rows": "x" * 100}
    for not_local in ("s3://bucket/plans/x.json", "memory://plans/x.json", "file://relative/x.json"):
        assert artifacts._local_file(not_local) is None


def test_an_object_store_keeps_checkpoints_and_outputs_through_objectstoragepath() -> None:
    """Any other store (here fsspec's memory file system, attached as Airflow attaches a provider's)
    goes through ObjectStoragePath: a checkpoint and a large output read back, a missing checkpoint is
    None, a missing output an ArtifactError."""
    from airflow.sdk.io import attach
    from fsspec.implementations.memory import MemoryFileSystem

    attach("memory", fs=MemoryFileSystem())
    base = f"memory://plans-{uuid.uuid4().hex}"
    assert artifacts.load_checkpoint("d/r/n/k", base) is None
    artifacts.save_checkpoint("d/r/n/k", {"run_id": "r", "output": [1]}, base)
    assert artifacts.load_checkpoint("d/r/n/k", base) == {"run_id": "r", "output": [1]}
    assert artifacts.checkpoint_of_run("d/r/n/k", "r", base) == {"run_id": "r", "output": [1]}
    assert artifacts.checkpoint_of_run("d/r/n/k", "another run", base) is None
    data = json.dumps(list(range(100))).encode()
    ref = artifacts.store(data, key="d/r/n/k", summary="numbers", base_url=base, threshold=10)
    assert ref is not None and ref["uri"].startswith(f"{base}/outputs/")
    assert artifacts.load(ref, key="d/r/n/k", base_url=base) == list(range(100))
    gone = {**ref, "sha256": "0" * 64}
    gone["uri"] = artifacts.output_uri("d/r/n/k", gone["sha256"], base)
    with pytest.raises(artifacts.ArtifactError, match="missing from the store"):
        artifacts.load(gone, key="d/r/n/k", base_url=base)
