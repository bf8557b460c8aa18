"""This repository's test harness: real Airflow deployments for its end-to-end tests, its benchmarks
(``bench/``), ``make demo`` and ``make airflow``. Not part of the wheel: what a user needs to test their
own plan DAGs is :mod:`airflow_plan_provider.testing`.

- :mod:`.cluster`: ``AirflowCluster``, the scheduler, dag-processor, api-server, triggerer (and Celery
  workers) as separate processes on a throw-away home, driven through the REST API;
- :mod:`.sqlite`: what such a cluster sets on a SQLite metadata database (lock waits, API timeouts);
- :mod:`.postgres`: a throw-away PostgreSQL database for a cluster;
- :mod:`.deploy`: the deployment settings of ``docker-compose.yml`` the fault tests and the soak run use;
- :mod:`.servers`: a PostgreSQL server and a Redis server of one's own, on free ports, that a test may
  stop and start again (the fault tests);
- :mod:`.processes` and :mod:`.watchdog`: finding and stopping every process a cluster started, also
  when the process that started it is killed;
- :mod:`.logs`: the error lines of a cluster's logs;
- :mod:`.seed`: the seed scenario (payment API latency) as a scripted plan, planner and tools.

Importable from the repository's root: pytest puts it on ``sys.path`` (``pythonpath`` in
``pyproject.toml``), and the scripts of ``bench/`` and ``scripts/`` add it themselves.
"""
