"""The pure core (plan, tools, planners/base.py), the local runner and the CLI import no Airflow."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "airflow_plan_provider"
CORE_DIRS = ("plan", "tools")
CORE_FILES = ("planners/base.py", "cli.py", "local_runner.py")

# Imports each module in turn and reports the first one after which Airflow is loaded.
PROBE = """
import importlib, json, sys

def airflow_loaded():
    return sorted(name for name in sys.modules if name == "airflow" or name.startswith("airflow."))

report = {"culprit": None, "airflow_modules": []}
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
    loaded = airflow_loaded()
    if loaded:
        report = {"culprit": name, "airflow_modules": loaded[:10]}
        break
print(json.dumps(report))
"""


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def core_modules() -> list[str]:
    files = [path for folder in CORE_DIRS for path in sorted((PACKAGE / folder).rglob("*.py"))]
    files += [PACKAGE / name for name in CORE_FILES]
    return [module_name(path) for path in files]


def test_core_modules_are_found() -> None:
    modules = core_modules()
    for expected in (
        "airflow_plan_provider.plan",
        "airflow_plan_provider.plan.validate",
        "airflow_plan_provider.plan.references",
        "airflow_plan_provider.tools.registry",
        "airflow_plan_provider.planners.base",
        "airflow_plan_provider.cli",
    ):
        assert expected in modules


def test_core_does_not_import_airflow() -> None:
    modules = core_modules()
    result = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(modules)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["culprit"] is None, f"importing {report['culprit']} loaded {report['airflow_modules']}"
