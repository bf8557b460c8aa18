"""Listed in Celery's ``imports`` setting, this module makes a Celery worker import what a plan DAG's
tasks need once, before it forks its pool, so that every task process it starts has it already
(:mod:`airflow_plan_provider.preload`)::

    AIRFLOW__CELERY__EXTRA_CELERY_CONFIG='{"imports": ["airflow_plan_provider.celery_imports"]}'

Celery imports the modules named there when a worker starts; nothing else imports this module.

Airflow's Celery worker freezes its garbage collector's objects (``gc.freeze``) when it imports its own
modules ahead of the pool, and unfreezes them once the pool is up, so that the pool's processes and the
task processes they fork share those pages instead of copying them, and never traverse those objects in a
full collection. Celery imports the modules of ``imports`` after that freeze: what this module imported is
frozen here too, or each task process would traverse it (and copy its pages) in its first full collection.
"""

from __future__ import annotations

import gc

from airflow_plan_provider.preload import import_task_modules

import_task_modules("the task processes this Celery worker starts")
gc.freeze()
