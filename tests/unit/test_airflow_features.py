"""Which Airflow the provider installs into: the supported range, the refusal of an older one, and that
version differences are decided in one module and private Airflow names are used in one other."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from airflow_plan_provider import airflow_features
from airflow_plan_provider.airflow_features import MINIMUM_AIRFLOW, require_supported_airflow

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "airflow_plan_provider"
#: the only files that may name a private Airflow module or name (see the module's docstring)
PRIVATE_ALLOWED = {"compat.py"}
#: the only file that looks at Airflow's version or at which names its modules hold
FEATURES = "airflow_features.py"


def airflow_requirement() -> Requirement:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    [found] = [
        req for req in map(Requirement, pyproject["project"]["dependencies"]) if req.name == "apache-airflow"
    ]
    return found


def test_the_supported_range_is_every_airflow_3_from_3_1() -> None:
    specifier = airflow_requirement().specifier
    assert MINIMUM_AIRFLOW == "3.1.0"
    for supported in ("3.1.0", "3.1.8", "3.2.2", "3.3.2", "3.4.0", "3.10.1"):
        assert specifier.contains(supported), supported
    for unsupported in ("3.0.6", "2.11.0", "4.0.0"):
        assert not specifier.contains(unsupported), unsupported


def test_an_older_airflow_is_refused_with_one_line_naming_the_minimum() -> None:
    for older in ("3.0.6", "2.11.2", "3.0.9rc1"):
        with pytest.raises(RuntimeError) as refused:
            require_supported_airflow(older)
        message = str(refused.value)
        assert "\n" not in message and "3.1.0+" in message and f"({older})" in message
    for supported in ("3.1.0", "3.1.0rc1", "3.2.2", "3.3.2", "3.4.0.dev0", "4.1.0"):
        require_supported_airflow(supported)


def test_the_installed_airflow_is_supported_and_its_features_are_known() -> None:
    installed = airflow_features.installed_airflow()
    assert installed is not None and airflow_requirement().specifier.contains(installed, prereleases=True)
    require_supported_airflow()
    offered = airflow_features.offered()
    names = {
        "retry_policies",
        "retry_backoff_multiplier",
        "task_state_store",
        "awaiting_input",
        "starts_mapped_on_triggerer",
    }
    assert set(offered) == names
    assert all(isinstance(value, bool) for value in offered.values())


def test_the_moved_names_resolve_on_this_airflow() -> None:
    for name in airflow_features.MOVED:
        assert isinstance(getattr(airflow_features, name), type), name
    with pytest.raises(AttributeError):
        _ = airflow_features.NoSuchName  # type: ignore[attr-defined]
    assert callable(airflow_features.sdk_conf().getint)
    assert callable(airflow_features.stats().incr)
    dag_bag, sync_bag_to_db = airflow_features.dag_bag()
    assert isinstance(dag_bag, type) and callable(sync_bag_to_db)


def private_airflow_names(source: str) -> list[str]:
    """Every Airflow module or name imported by ``source`` with a part that starts with an underscore."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "airflow" and any(part.startswith("_") for part in parts):
                found.append(name)
    return found


def test_no_private_airflow_name_is_imported_outside_compat() -> None:
    assert private_airflow_names("from airflow.sdk._shared.secrets_masker import redact") == [
        "airflow.sdk._shared.secrets_masker.redact"
    ]
    assert private_airflow_names("import airflow._shared.x") == ["airflow._shared.x"]
    assert private_airflow_names("from airflow.sdk.definitions.dag import _run_task")
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        text = path.read_text(encoding="utf-8")
        private = private_airflow_names(text)
        shared = "airflow._shared" in text or "sdk._shared" in text
        if relative not in PRIVATE_ALLOWED and (private or shared):
            offenders[relative] = private or ["_shared"]
    assert offenders == {}


def test_no_module_but_the_features_one_looks_at_airflows_version() -> None:
    looks = ("airflow.__version__", "import __version__", 'version("apache-airflow', "airflow.version")
    offenders = [
        path.relative_to(PACKAGE).as_posix()
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != FEATURES and any(look in path.read_text(encoding="utf-8") for look in looks)
    ]
    assert offenders == []


def test_mapped_instances_start_on_the_triggerer_from_airflow_3_3() -> None:
    """What ``bench/start_from_trigger.py`` measured (records ``start-from-trigger-mapped-*``): 3.1 and 3.2
    start a mapped ``start_from_trigger`` instance on a worker, 3.3 and later on the triggerer. The
    feature is detected, not read from the version: this holds the detection to the measurement."""
    installed = airflow_features.installed_airflow()
    assert installed is not None
    release = airflow_features._release(installed)
    assert airflow_features.starts_mapped_on_triggerer() is (release >= (3, 3))
