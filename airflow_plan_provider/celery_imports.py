"""Listed in Celery's ``imports`` setting, this module makes a Celery worker import what a plan DAG's
tasks need once, before it forks its pool, so that every task process it starts has it already
(:mod:`airflow_plan_provider.preload`)::

    AIRFLOW__CELERY__EXTRA_CELERY_CONFIG='{"imports": ["airflow_plan_provider.celery_imports"]}'

Celery imports the modules named there when a worker starts; nothing else imports this module.
"""

from __future__ import annotations

from airflow_plan_provider.preload import import_task_modules

import_task_modules("the task processes this Celery worker starts")
