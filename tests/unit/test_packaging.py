"""What the wheel ships: the provider package only. The demo of the example DAGs (tools, dataset,
planner, templates) lives beside them in dags/plan_demo, and no tool registry is installed as an entry
point.

The file list is setuptools' own: ``build_py`` writes what a wheel's purelib holds (packages and package
data) and ``egg_info`` the metadata, entry points included, from a copy of what the image's build copies.
"""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_plan_provider.tools.registry import ENTRY_POINT_GROUP

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Path], configparser.ConfigParser]:
    base = tmp_path_factory.mktemp("wheel")
    source = base / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source)
    shutil.copytree(
        ROOT / "airflow_plan_provider",
        source / "airflow_plan_provider",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    command = [sys.executable, "-c", "from setuptools import setup; setup()", "-q"]
    command += ["egg_info", "--egg-base", str(base), "build_py", "--build-lib", str(base / "lib")]
    done = subprocess.run(command, cwd=source, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    files = {
        path.relative_to(base / "lib").as_posix(): path
        for path in (base / "lib").rglob("*")
        if path.is_file()
    }
    entry_points = configparser.ConfigParser()
    [egg_info] = base.glob("*.egg-info")
    entry_points.read(egg_info / "entry_points.txt")
    return files, entry_points


def test_the_wheel_holds_the_provider_and_its_data(built: tuple[dict[str, Path], configparser.ConfigParser]):
    files, _ = built
    assert {"airflow_plan_provider/py.typed", "airflow_plan_provider/plugins/plan_view.html"} <= set(files)
    assert "airflow_plan_provider/planners/template.py" in files
    assert {name.split("/")[0] for name in files} == {"airflow_plan_provider"}


def test_no_demo_file_is_packaged(built: tuple[dict[str, Path], configparser.ConfigParser]) -> None:
    files, _ = built
    demo = [
        name
        for name in files
        if "example" in name or "plan_demo" in name or name.endswith((".json", ".sql", ".sqlite"))
    ]
    assert demo == []
    demo_code = re.compile(r"^\s*(from|import)\s+plan_demo\b|payment_latency", re.M)
    mentions = [
        name for name, path in files.items() if name.endswith(".py") and demo_code.search(path.read_text())
    ]
    assert mentions == []


def test_no_tool_registry_is_registered(built: tuple[dict[str, Path], configparser.ConfigParser]) -> None:
    _, entry_points = built
    assert "apache_airflow_provider" in entry_points.sections()  # the metadata was read
    assert ENTRY_POINT_GROUP not in entry_points.sections()
