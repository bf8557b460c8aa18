"""The deployment settings a cluster needs to ride out the faults of a shared deployment, read from
``docker-compose.yml`` (docs/deploy.md, Faults), so the fault tests and the soak run use what users get."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

COMPOSE_FILE = Path(__file__).resolve().parents[1] / "docker-compose.yml"

#: the heartbeat timeout, a task's retries of its calls to the API server, the scheduler's retries of a
#: publish to the broker, the connection pool's pre-ping
FAULT_SETTINGS = (
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT",
    "AIRFLOW__WORKERS__EXECUTION_API_RETRIES",
    "AIRFLOW__WORKERS__EXECUTION_API_RETRY_WAIT_MIN",
    "AIRFLOW__WORKERS__EXECUTION_API_RETRY_WAIT_MAX",
    "AIRFLOW__CELERY__EXTRA_CELERY_CONFIG",
    "AIRFLOW__CELERY__TASK_PUBLISH_MAX_RETRIES",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_POOL_PRE_PING",
)


def compose_environment(compose_file: Path = COMPOSE_FILE) -> dict[str, str]:
    """The environment ``docker-compose.yml`` gives every Airflow component."""
    return dict(yaml.safe_load(compose_file.read_text())["x-airflow-common"]["environment"])


def fault_settings(compose_file: Path = COMPOSE_FILE) -> dict[str, str]:
    """:data:`FAULT_SETTINGS` as ``docker-compose.yml`` sets them for every Airflow component."""
    environment = compose_environment(compose_file)
    return {key: str(environment[key]) for key in FAULT_SETTINGS}


def celery_imports(compose_file: Path = COMPOSE_FILE) -> dict[str, str]:
    """The Celery setting every Celery cluster gets: ``imports`` as ``docker-compose.yml``'s
    ``[celery] extra_celery_config`` lists them (a worker imports the provider's task modules before it
    forks its pool), without that file's fault settings."""
    extra = json.loads(compose_environment(compose_file)["AIRFLOW__CELERY__EXTRA_CELERY_CONFIG"])
    return {"AIRFLOW__CELERY__EXTRA_CELERY_CONFIG": json.dumps({"imports": extra["imports"]})}
