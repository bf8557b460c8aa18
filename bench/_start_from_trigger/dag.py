"""``bench/start_from_trigger.py``'s DAG: an upstream task, then three mapped instances and one unmapped
instance of an operator that starts on the triggerer (``trigger_first.TriggerFirstOperator``)."""

from __future__ import annotations

import time

from airflow.sdk import DAG, task
from trigger_first import TriggerFirstOperator

DAG_ID = "bench_start_from_trigger"
UPSTREAM_SECONDS = 3.0
MAPPED = 3

with DAG(DAG_ID, schedule=None, catchup=False) as dag:

    @task
    def upstream() -> None:
        time.sleep(UPSTREAM_SECONDS)

    mapped = TriggerFirstOperator.partial(task_id="mapped").expand(x=list(range(MAPPED)))
    unmapped = TriggerFirstOperator(task_id="unmapped")
    upstream() >> [mapped, unmapped]
