"""What the wheel ships: the provider package only, with the testing kit and without this repository's
test harness. The demo of the example DAGs (tools, dataset, planner, templates) lives beside them in
dags/plan_demo, the multi-process Airflow cluster in ``harness/``, and no tool registry is installed as
an entry point.

The wheel is pip's own (``pip wheel . --no-deps``), built from a copy of the repository's sources, so a
packaging rule that picked up ``harness/``, ``tests/`` or the demo would show here.
"""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from airflow_plan_provider.tools.registry import ENTRY_POINT_GROUP

ROOT = Path(__file__).resolve().parents[2]
SOURCES = (
    "pyproject.toml",
    "README.md",
    "airflow_plan_provider",
    "harness",
    "tests",
    "bench",
    "scripts",
    "dags",
)
#: what a user needs to test their own plan DAGs
KIT = {
    "airflow_plan_provider/testing/__init__.py",
    "airflow_plan_provider/testing/scripted.py",
    "airflow_plan_provider/testing/openai_server.py",
    "airflow_plan_provider/testing/in_process.py",
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("wheel")
    source = base / "source"
    source.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "output", "*.egg-info")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=ignore)
        else:
            shutil.copy(ROOT / name, source)
    command = [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "-w", str(base / "dist"), "-q"]
    done = subprocess.run(command, cwd=source, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    [built] = (base / "dist").glob("airflow_plan_provider-*.whl")
    return built


@pytest.fixture(scope="module")
def files(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as archive:
        return {name: archive.read(name) for name in archive.namelist() if not name.endswith("/")}


def _packaged(files: dict[str, bytes]) -> dict[str, bytes]:
    """The wheel's files but its metadata (``*.dist-info``)."""
    return {name: data for name, data in files.items() if ".dist-info/" not in name}


def test_the_wheel_holds_the_provider_and_its_data(files: dict[str, bytes]) -> None:
    packaged = _packaged(files)
    assert {"airflow_plan_provider/py.typed", "airflow_plan_provider/plugins/plan_view.html"} <= set(packaged)
    assert "airflow_plan_provider/planners/template.py" in packaged
    assert {name.split("/")[0] for name in packaged} == {"airflow_plan_provider"}


def test_the_wheel_holds_the_testing_kit_and_no_cluster(files: dict[str, bytes]) -> None:
    testing = {name for name in files if name.startswith("airflow_plan_provider/testing/")}
    assert testing == KIT
    assert [name for name in files if name.endswith("/cluster.py")] == []
    launcher = re.compile(rb"^\s*(from|import)\s+harness\b|\bAirflowCluster\b", re.M)
    mentions = [name for name, data in _packaged(files).items() if launcher.search(data)]
    assert mentions == []


def test_the_testing_kit_imports_from_the_wheel_alone(wheel: Path, tmp_path: Path) -> None:
    """Installed from the wheel, without this repository on ``sys.path``, every module of the kit imports."""
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    code = (
        "import importlib.util, airflow_plan_provider.testing, airflow_plan_provider.testing.in_process, "
        "airflow_plan_provider.testing.openai_server; "
        "print(airflow_plan_provider.testing.__file__); print(importlib.util.find_spec('harness'))"
    )
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"} | {"PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    kit, harness = done.stdout.split()
    assert Path(kit) == site / "airflow_plan_provider" / "testing" / "__init__.py"
    assert harness == "None"


def test_no_demo_file_is_packaged(files: dict[str, bytes]) -> None:
    packaged = _packaged(files)
    demo = [
        name
        for name in packaged
        if "example" in name or "plan_demo" in name or name.endswith((".json", ".sql", ".sqlite"))
    ]
    assert demo == []
    demo_code = re.compile(rb"^\s*(from|import)\s+plan_demo\b|payment_latency", re.M)
    mentions = [name for name, data in packaged.items() if name.endswith(".py") and demo_code.search(data)]
    assert mentions == []


def test_no_tool_registry_is_registered(files: dict[str, bytes]) -> None:
    [name] = [name for name in files if name.endswith(".dist-info/entry_points.txt")]
    entry_points = configparser.ConfigParser()
    entry_points.read_string(files[name].decode())
    assert "apache_airflow_provider" in entry_points.sections()  # the metadata was read
    assert ENTRY_POINT_GROUP not in entry_points.sections()
