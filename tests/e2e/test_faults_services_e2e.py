"""The metadata database and the broker away in the middle of a session: PostgreSQL stopped for 20 s
(every connection dropped) while nodes wait in their slots and deferred, and Redis restarted while a run
queues its nodes. Each costs a delay only: the session completes, no node's tool is called twice for one
idempotency key, every side effect is done once, and the time from the fault to the recovery is printed
(tests/e2e/faults.py has the deployment and the checks).
"""

from __future__ import annotations

import time

import pytest

from tests.e2e.faults import (
    DATABASE_OUTAGE_SECONDS,
    OUTAGE_SECONDS,
    PLANNING_SECONDS,
    Deployment,
    deployment_fixture,
    planning,
    run_waits_through,
)

# slow tier: a Celery cluster of its own, on servers of its own, and sessions that wait out faults; the
# slow tier's longest modules
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.early]


deployment = deployment_fixture("database", "broker")


def test_metadata_database_away_20s_mid_session(deployment: Deployment) -> None:
    def outage() -> None:
        deployment.postgres.stop()  # every connection dropped
        time.sleep(DATABASE_OUTAGE_SECONDS)
        deployment.postgres.start()

    run_waits_through(deployment, "database", outage)


def test_broker_restarted_while_a_run_queues_its_nodes(deployment: Deployment) -> None:
    def outage() -> None:
        deployment.redis.stop()
        time.sleep(OUTAGE_SECONDS)
        deployment.redis.start()

    # the plan task runs for PLANNING_SECONDS: long enough to be seen running between two polls, so the
    # broker stops before the run's nodes are queued and the scheduler queues them while it is away
    run_waits_through(deployment, "broker", outage, position=planning, plan_seconds=PLANNING_SECONDS)
