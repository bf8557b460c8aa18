"""Benchmarks of the plan DAGs on a real Airflow, and a simulator of Airflow's slot hand-out (not part
of the wheel)."""
