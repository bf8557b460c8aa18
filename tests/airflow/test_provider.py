"""The package as Airflow and users see it: provider registration, public names, example DAGs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import airflow_plan_provider

ROOT = Path(__file__).resolve().parents[2]


def test_public_surface_is_sorted_and_importable():
    assert airflow_plan_provider.__all__ == sorted(airflow_plan_provider.__all__)
    for name in airflow_plan_provider.__all__:
        assert getattr(airflow_plan_provider, name) is not None


def test_plan_json_schema_is_what_planners_are_asked_to_follow():
    schema = airflow_plan_provider.Plan.model_json_schema()
    node = schema["$defs"]["Node"]
    assert {"id", "action", "tool"} <= set(node["required"])
    assert schema["$defs"]["Edge"]["properties"].keys() >= {"from", "to", "optional"}


@pytest.mark.airflow
def test_airflow_lists_the_provider():
    airflow = Path(sys.executable).with_name("airflow")
    out = subprocess.run(
        [str(airflow), "providers", "list", "-o", "json"],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ},
    ).stdout
    providers = {p["package_name"]: p for p in json.loads(out[out.index("[") :])}
    assert "airflow-plan-provider" in providers


@pytest.mark.airflow
def test_example_dags_import_without_errors():
    from airflow_plan_provider.airflow_features import dag_bag

    DagBag, _ = dag_bag()

    bag = DagBag(dag_folder=str(ROOT / "dags"))
    assert bag.import_errors == {}
    assert {"plan_and_execute", "plan_and_execute_llm"} <= set(bag.dag_ids)
    dag = bag.dags["plan_and_execute"]
    assert set(dag.params.keys()) >= {"goal", "plan", "max_replans", "max_steps"}
    # each reads as one line in the DAG list
    described = {dag_id: bag.dags[dag_id].description or "" for dag_id in bag.dag_ids}
    assert all(20 <= len(text) <= 120 and "\n" not in text for text in described.values()), described


# Airflow's plugin import errors (what its UI lists under plugins), as a process that loads the plugins
# has them; get_import_errors since Airflow 3.2, the module's import_errors before
PLUGIN_IMPORT_ERRORS = """
import json
from airflow import plugins_manager
if hasattr(plugins_manager, "get_import_errors"):
    errors = plugins_manager.get_import_errors()
else:
    plugins_manager.ensure_plugins_loaded()
    errors = plugins_manager.import_errors
print(json.dumps({str(source): str(error) for source, error in errors.items()}))
"""


@pytest.mark.airflow
def test_airflow_loads_the_plan_view_plugin_with_no_error_with_the_checkout_on_its_path():
    """A process with the checkout on its path (the tests' clusters, the benchmarks') sees the installed
    package; a build's egg-info left in the checkout would show Airflow the plugin's entry point a second
    time, which Airflow logs and lists as a plugin import error ("Plugin 'plan_view' already
    registered"). ``make`` removes it after the editable install."""
    result = subprocess.run(
        [sys.executable, "-c", PLUGIN_IMPORT_ERRORS],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {}
