"""The date keys of a run's template context, for a run without a logical date."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

from airflow_plan_provider.operators.run_dates import DATE_KEYS, with_run_dates


def test_a_run_without_a_logical_date_gets_the_dates_of_its_run_after() -> None:
    run_after = datetime(2026, 12, 4, 18, 47, 31, tzinfo=UTC)
    context = with_run_dates({"dag_run": SimpleNamespace(run_after=run_after), "run_id": "r"})
    assert set(DATE_KEYS) <= set(context)
    assert (context["ds"], context["ds_nodash"]) == ("2026-12-04", "20261204")
    assert (context["ts"], context["ts_nodash"]) == ("2026-12-04T18:47:31+00:00", "20261204T184731")
    assert context["ts_nodash_with_tz"] == "20261204T184731+0000"
    assert context["logical_date"] == context["data_interval_end"] == run_after
    assert context["run_id"] == "r"


def test_a_run_with_a_logical_date_keeps_airflows_own_keys() -> None:
    given = {"ds": "2024-01-01", "dag_run": SimpleNamespace(run_after=datetime(2026, 1, 1, tzinfo=UTC))}
    assert with_run_dates(given) == given
    assert "ds" not in with_run_dates({"dag_run": SimpleNamespace(run_after=None)})
