"""Every test process gets its own AIRFLOW_HOME with a SQLite database, set before Airflow is imported."""

from __future__ import annotations

import os
import tempfile

_HOME = tempfile.mkdtemp(prefix="plan-provider-airflow-")
os.environ.setdefault("AIRFLOW_HOME", _HOME)
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "False")
os.environ.setdefault("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"sqlite:///{_HOME}/airflow.db")
os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", os.path.join(_HOME, "dags"))
os.environ.setdefault("PLAN_REPORT_DIR", os.path.join(_HOME, "reports"))
os.environ.setdefault("PLAN_DEMO_DB", os.path.join(_HOME, "demo.sqlite"))
