# Two entry points: `make demo` runs the example plan DAG end to end; `make test` runs every test.
# Each creates the virtual environment (.venv) on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint bench

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

demo: $(VENV)/.installed
	$(PY) scripts/demo.py

test: $(VENV)/.installed
	$(PY) -m pytest -q

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check airflow_plan_provider tests dags bench scripts
	$(VENV)/bin/mypy airflow_plan_provider

bench: $(VENV)/.installed
	$(PY) bench/validate.py
