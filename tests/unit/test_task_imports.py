"""What a task process pays to parse a plan DAG file: no import it does not need.

Every task of a plan DAG parses the DAG file, so what the file imports is paid once per node task: the
``openai`` client (hundreds of modules) only when a plan is asked for, and no pydantic model's
validator built before the model is used.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

from pydantic import BaseModel

import airflow_plan_provider
from airflow_plan_provider import airflow_features
from airflow_plan_provider.base_model import Model

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
import airflow_plan_provider.dag_factory, airflow_plan_provider.planners.llm
from airflow_plan_provider.plan.session import SessionState
print(json.dumps({"openai": sorted(m for m in sys.modules if m.split(".")[0] == "openai")[:5],
                  "session_built": SessionState.__pydantic_complete__}))
"""


def test_a_dag_file_naming_the_llm_planner_imports_no_openai_and_builds_no_unused_model() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT, check=True, timeout=120
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {"openai": [], "session_built": False}


#: modules imported only where the running Airflow offers their feature (airflow_features.py)
FEATURE_MODULES = {"airflow_plan_provider.operators.retry": airflow_features.retry_policies}


def test_every_model_of_the_package_builds_on_first_use() -> None:
    models = set()
    for info in pkgutil.walk_packages(airflow_plan_provider.__path__, "airflow_plan_provider."):
        if info.name.startswith(("airflow_plan_provider.plugins", "airflow_plan_provider.testing")):
            continue
        if info.name in FEATURE_MODULES and not FEATURE_MODULES[info.name]():
            continue
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, BaseModel)
                and value.__module__ == info.name
                and value is not Model
            ):
                models.add(value)
    assert len(models) > 15
    assert [m.__qualname__ for m in sorted(models, key=str) if not issubclass(m, Model)] == []
    assert all(m.model_config.get("defer_build") for m in models)
