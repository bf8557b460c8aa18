"""Every test process gets its own AIRFLOW_HOME with a SQLite database, set before Airflow is imported.

Under pytest-xdist the workers inherit the controller's environment: a home this file made in another
process (named by ``PLAN_TESTS_HOME``) is replaced, so no two workers share a database. A home the user
set stays theirs.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import pytest
from xdist.scheduler import LoadFileScheduling


def _settings(home: str) -> dict[str, str]:
    return {
        "AIRFLOW_HOME": home,
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__CORE__DAGS_FOLDER": os.path.join(home, "dags"),
        "PLAN_REPORT_DIR": os.path.join(home, "reports"),
        "PLAN_DEMO_DB": os.path.join(home, "demo.sqlite"),
    }


_inherited = os.environ.get("PLAN_TESTS_HOME")
_HOME = tempfile.mkdtemp(prefix=f"plan-provider-airflow-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-")
_stale = _settings(_inherited) if _inherited else {}
for _name, _value in _settings(_HOME).items():
    if _name not in os.environ or os.environ[_name] == _stale.get(_name):
        os.environ[_name] = _value
os.environ["PLAN_TESTS_HOME"] = _HOME


#: The modules that run on the session's shared cluster (``example_cluster`` in tests/e2e/conftest.py,
#: which refuses a module not listed here): one pytest-xdist work unit, so one worker starts that cluster
#: and runs them back to back, and stops it after their last test.
SHARED_CLUSTER_MODULES = ("tests/e2e/test_llm_plan.py", "tests/e2e/test_plan_runs.py")


class _SharedClusterScheduling(LoadFileScheduling):
    """``--dist loadfile``, but the modules of :data:`SHARED_CLUSTER_MODULES` are one unit of work."""

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        return "example_cluster" if module in SHARED_CLUSTER_MODULES else module


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadFileScheduling | None:
    return _SharedClusterScheduling(config, log) if config.getvalue("dist") == "loadfile" else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``make test``: ``-n 2 --dist loadfile --no-loadscope-reorder``) a worker runs
    a whole module, so a module's fixtures (an Airflow cluster, a seed session) are set up once, and the
    modules that start Airflow processes go first (those marked ``early`` before the others): they are
    the longest, and the in-process tests fill the other worker meanwhile. (The modules on the
    session-wide example cluster are one unit of work; each worker's Celery clusters have a broker
    database of their own.)"""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # stable: modules stay whole; the longest (marked ``early``) first of all
        items.sort(
            key=lambda item: (
                0 if item.get_closest_marker("early") else 1 if item.get_closest_marker("e2e") else 2
            )
        )
