# Entry points: `make demo` runs the example plan DAG end to end; `make test` runs every test but the slow
# tier, `make test-slow` the slow tier (tests marked `slow`: load tests, lost workers, two of the scheduler
# crash points, the cluster launcher's own tests; CI runs both); `make airflow` starts a local Airflow with the example DAGs (UI on http://127.0.0.1:$(PORT),
# Ctrl-C stops it).
# Each creates the virtual environment (.venv) on first use.
PYTHON ?= python3
VENV ?= .venv
# Another supported Airflow release: `make test-inprocess AIRFLOW_VERSION=3.2.2` (or `make demo ...`) builds
# .venv-3.2.2 with that Airflow, pinned by constraints/airflow-3.2.txt where that file exists, and runs there.
AIRFLOW_VERSION ?=
ifneq ($(AIRFLOW_VERSION),)
VENV := .venv-$(AIRFLOW_VERSION)
AIRFLOW_CONSTRAINTS := $(wildcard constraints/airflow-$(word 1,$(subst ., ,$(AIRFLOW_VERSION))).$(word 2,$(subst ., ,$(AIRFLOW_VERSION))).txt)
AIRFLOW_PIN := 'apache-airflow==$(AIRFLOW_VERSION)' $(addprefix -c ,$(AIRFLOW_CONSTRAINTS))
endif
# the older releases CI runs the in-process suite on (the main suite runs on the newest, in .venv)
OLDER_AIRFLOW_VERSIONS ?= 3.1.8 3.2.2
# what test-inprocess runs: the tests that need no Airflow cluster
INPROCESS_TESTS ?= tests/unit tests/airflow
PY := $(VENV)/bin/python
PORT ?= 8080

.PHONY: demo test test-slow lint bench airflow test-inprocess test-older-airflow

$(VENV)/.installed: pyproject.toml $(AIRFLOW_CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]' $(AIRFLOW_PIN)
	touch $@

demo: $(VENV)/.installed
	$(PY) scripts/demo.py

airflow: $(VENV)/.installed
	$(PY) scripts/airflow_local.py --port $(PORT)

test: $(VENV)/.installed
	$(PY) -m pytest -q -m "not slow" --durations=10

test-slow: $(VENV)/.installed
	$(PY) -m pytest -q -m slow --durations=10

test-inprocess: $(VENV)/.installed
	$(PY) -m pytest -q -m "not slow" --durations=10 $(INPROCESS_TESTS)

test-older-airflow:
	set -e; for version in $(OLDER_AIRFLOW_VERSIONS); do $(MAKE) test-inprocess AIRFLOW_VERSION=$$version; done

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check airflow_plan_provider harness tests dags bench scripts
	$(VENV)/bin/ruff format --check airflow_plan_provider harness tests dags bench scripts
	$(VENV)/bin/mypy airflow_plan_provider harness

bench: $(VENV)/.installed
	$(PY) bench/validate.py
