"""Triggers that wait for a plan node's asynchronous job on Airflow's triggerer."""
