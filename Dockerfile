# The official Airflow image with this provider installed from the repository (docker-compose.yml builds
# it for every Airflow service). Same Airflow version as the one the project is tested with.
FROM apache/airflow:3.3.2

COPY --chown=airflow:0 pyproject.toml README.md /opt/airflow-plan-provider/
COPY --chown=airflow:0 airflow_plan_provider /opt/airflow-plan-provider/airflow_plan_provider

# Airflow pinned to the image's own version so pip cannot replace it; Celery kept below 5.7, whose 5.7.0
# breaks the CeleryExecutor import with Airflow 3.3.2.
RUN pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" "celery<5.7" /opt/airflow-plan-provider
