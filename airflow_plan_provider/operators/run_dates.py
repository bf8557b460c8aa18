"""The date keys of a run's template context, for every run Airflow can make.

Airflow 3 lets a run have no logical date (a REST API trigger with ``"logical_date": null``, or the
UI's trigger form with the date left empty). Its template context then has no ``logical_date``,
``ds``, ``ts`` or data interval, and a frozen plan's ``{{ macros.ds_add(ds, -1) }}`` cannot render.
Such a run renders as if its logical date were its ``run_after`` (when Airflow made the run: the time
it was triggered): the keys Airflow derives from a logical date are derived, the same way, from it.
A run with a logical date keeps Airflow's own keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from airflow.sdk import Context

#: The keys Airflow's task context holds only for a run with a logical date.
DATE_KEYS = (
    "logical_date",
    "ds",
    "ds_nodash",
    "ts",
    "ts_nodash",
    "ts_nodash_with_tz",
    "data_interval_start",
    "data_interval_end",
)


def date_keys(moment: datetime) -> dict[str, Any]:
    """The keys Airflow derives from a logical date, derived from ``moment`` (as Airflow's task runner
    does: ``ds`` is the date, ``ts`` the ISO time; the data interval is the moment itself)."""
    ds = moment.strftime("%Y-%m-%d")
    ts = moment.isoformat()
    return {
        "logical_date": moment,
        "ds": ds,
        "ds_nodash": ds.replace("-", ""),
        "ts": ts,
        "ts_nodash": moment.strftime("%Y%m%dT%H%M%S"),
        "ts_nodash_with_tz": ts.replace("-", "").replace(":", ""),
        "data_interval_start": moment,
        "data_interval_end": moment,
    }


def with_run_dates(context: Mapping[str, Any]) -> Context:
    """``context`` to render templates with: a run without a logical date gets the date keys of its
    ``run_after``; any other context is returned as it is (as a new dict)."""
    rendered = dict(context)
    run_after = getattr(rendered.get("dag_run"), "run_after", None)
    if rendered.get("ds") is None and isinstance(run_after, datetime):
        filled = date_keys(run_after)
        rendered.update({key: value for key, value in filled.items() if rendered.get(key) is None})
    return cast("Context", rendered)
