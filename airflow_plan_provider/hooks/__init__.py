"""Airflow hooks of the plan provider."""
