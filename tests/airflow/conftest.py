"""The Airflow tests run DAGs with ``dag.test()`` on the test process's SQLite database: migrate it once."""

from __future__ import annotations

import pytest

from tests.airflow.support import migrate_db


@pytest.fixture(autouse=True, scope="session")
def metadata_db() -> None:
    migrate_db()
