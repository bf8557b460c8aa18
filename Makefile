# Entry points: `make demo` runs the example plan DAG end to end; `make test` runs every test but the slow
# tier, `make test-slow` the slow tier (tests marked `slow`: load tests, lost workers, two of the scheduler
# crash points, the cluster launcher's own tests; CI runs both); `make airflow` starts a local Airflow with the example DAGs (UI on http://127.0.0.1:$(PORT),
# Ctrl-C stops it).
# Each creates the virtual environment (.venv) on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8080
# pytest-xdist workers for `make test` (tests/conftest.py says how modules are shared out)
TEST_WORKERS ?= 2

.PHONY: demo test test-slow lint bench airflow

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

demo: $(VENV)/.installed
	$(PY) scripts/demo.py

airflow: $(VENV)/.installed
	$(PY) scripts/airflow_local.py --port $(PORT)

test: $(VENV)/.installed
	$(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=10

test-slow: $(VENV)/.installed
	$(PY) -m pytest -q -m slow --durations=10

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check airflow_plan_provider harness tests dags bench scripts
	$(VENV)/bin/ruff format --check airflow_plan_provider harness tests dags bench scripts
	$(VENV)/bin/mypy airflow_plan_provider harness

bench: $(VENV)/.installed
	$(PY) bench/validate.py
