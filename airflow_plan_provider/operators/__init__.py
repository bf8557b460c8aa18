"""Airflow operators that run a plan: planning, one mapped task per layer, finalize, replan."""
