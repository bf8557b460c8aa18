"""The flagship demo: find why payment-api got slow yesterday and write a report.

``dataset`` builds the SQLite data, ``tools`` holds the tool registry, ``templates`` the plans the
template planner fills (see :func:`airflow_plan_provider.planners.rules.payment_latency_planner`).
"""
