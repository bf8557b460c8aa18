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
# the supported releases CI runs beside the main suite (which runs on the newest stable release, in .venv),
# each in its own .venv-<version>: the newest release line (a pre-release until its .0 is out) runs
# NEWEST_AIRFLOW_TESTS, the older releases OLDER_AIRFLOW_TESTS
OLDER_AIRFLOW_VERSIONS ?= 3.1.8 3.2.2
NEWEST_AIRFLOW_VERSION ?= 3.4.0b2
# what test-inprocess runs: the tests that need no Airflow cluster
INPROCESS_TESTS ?= tests/unit tests/airflow
# the pure core's slowest unit tests, which import no Airflow and so prove nothing more on another release
# (slot simulator, property tests, the CLI's local runs, mypy)
PURE_CORE_SLOWEST := --deselect tests/unit/test_waiting_simulation.py --deselect tests/unit/test_core_properties.py \
	--deselect tests/unit/test_cli.py --deselect tests/unit/test_cli_run.py \
	--deselect tests/unit/test_public_surface.py::test_public_names_have_real_types_for_mypy
# on the newest release line: every in-process test that touches Airflow
NEWEST_AIRFLOW_TESTS ?= tests/unit tests/airflow $(PURE_CORE_SLOWEST)
# on each older release: the unit tests that touch Airflow, the seed story with its replan chain, approval,
# a frozen plan, the plan view's data, the private names of compat.py, and every test of a feature that
# differs between Airflow versions (retry policy, planning's kept plan, metrics, DAG serialization, the
# plan DAGs' weight rule, the HITL events)
OLDER_AIRFLOW_TESTS ?= tests/unit $(PURE_CORE_SLOWEST) \
	tests/airflow/test_replan.py::test_seed_story_replans_node_5_and_reuses_the_rest \
	tests/airflow/test_replan.py::test_two_replans_then_complete \
	tests/airflow/test_approval.py tests/airflow/test_plan_view.py tests/airflow/test_triggers.py \
	tests/airflow/test_freeze.py::test_only_the_dags_own_plan_is_rendered_and_a_bad_template_fails_planning \
	tests/airflow/test_control_retries.py::test_planning_lost_after_validating_reuses_its_plan \
	tests/airflow/test_dag_run.py::test_seed_plan_completes \
	tests/airflow/test_dag_run.py::test_transient_failure_is_retried_by_airflow \
	tests/airflow/test_dag_run.py::test_the_node_tasks_retry_backoff_is_the_multiplier_where_airflow_takes_one \
	tests/airflow/test_dag_run.py::test_a_rate_limited_node_waits_as_long_as_its_tool_asks_where_airflow_has_retry_policies \
	tests/airflow/test_events.py::test_node_outcomes_durations_and_tokens_reach_statsd \
	tests/airflow/test_dag_version.py::test_example_dags_serialize_the_same_in_two_processes \
	tests/airflow/test_sessions_in_turn.py tests/airflow/test_provider.py tests/airflow/test_compat.py
PY := $(VENV)/bin/python
PORT ?= 8080
# pytest-xdist workers for `make test` (tests/conftest.py says how modules are shared out)
TEST_WORKERS ?= 2

.PHONY: demo test test-slow lint bench airflow test-inprocess test-supported-airflow supported-airflow-venvs \
	supported-airflow-versions

$(VENV)/.installed: pyproject.toml $(AIRFLOW_CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]' $(AIRFLOW_PIN)
	@# setuptools leaves the build's egg-info in the checkout, where a process with the checkout on its
	@# path (the tests' clusters) would find the plugin's entry point twice: Airflow then records
	@# "Plugin 'plan_view' already registered" as a plugin import error. The install does not need it.
	rm -rf airflow_plan_provider.egg-info
	touch $@

demo: $(VENV)/.installed
	$(PY) scripts/demo.py

airflow: $(VENV)/.installed
	$(PY) scripts/airflow_local.py --port $(PORT)

test: $(VENV)/.installed
	$(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=10

test-slow: $(VENV)/.installed
	$(PY) -m pytest -q -m slow -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=10

test-inprocess: $(VENV)/.installed
	$(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadfile --durations=10 $(INPROCESS_TESTS)

test-supported-airflow: supported-airflow-venvs
	set -e; for version in $(SUPPORTED_AIRFLOW_VERSIONS); do $(MAKE) test-airflow-$$version; done

# one supported release's tests (`make test-airflow-3.2.2`): NEWEST_AIRFLOW_TESTS on the newest release
# line, OLDER_AIRFLOW_TESTS on an older release
test-airflow-%: .venv-%/.installed
	$(MAKE) test-inprocess AIRFLOW_VERSION=$* \
		INPROCESS_TESTS="$(if $(filter $*,$(NEWEST_AIRFLOW_VERSION)),$(NEWEST_AIRFLOW_TESTS),$(OLDER_AIRFLOW_TESTS))"

# the supported releases CI tests besides the main one, oldest first
supported-airflow-versions:
	@echo $(SUPPORTED_AIRFLOW_VERSIONS)

# the supported releases' virtual environments alone, one target each so that `make -j` builds them side by
# side (CI builds them with the main one and lint, before the main suite)
SUPPORTED_AIRFLOW_VERSIONS := $(OLDER_AIRFLOW_VERSIONS) $(NEWEST_AIRFLOW_VERSION)
SUPPORTED_AIRFLOW_VENVS := $(foreach version,$(SUPPORTED_AIRFLOW_VERSIONS),.venv-$(version)/.installed)
supported-airflow-venvs: $(SUPPORTED_AIRFLOW_VENVS)

ifeq ($(AIRFLOW_VERSION),)
.venv-%/.installed: pyproject.toml
	$(MAKE) $@ AIRFLOW_VERSION=$*
endif

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check airflow_plan_provider harness tests dags bench scripts
	$(VENV)/bin/ruff format --check airflow_plan_provider harness tests dags bench scripts
	$(VENV)/bin/mypy airflow_plan_provider harness

bench: $(VENV)/.installed
	$(PY) bench/validate.py
