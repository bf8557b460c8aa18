"""The example DAGs' demo: find why payment-api got slow yesterday and write a report.

``dataset`` builds the SQLite data, ``tools`` holds the tool registry, ``planner`` the template planner
that fills the plans of ``templates``, ``report`` renders the report. It lives beside the example DAGs
(Airflow puts the DAGs folder on ``sys.path``), not in the provider package.
"""
