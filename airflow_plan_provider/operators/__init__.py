"""Airflow operators that run a plan: planning, the mapped node tasks (one per lane), finalize, replan."""
