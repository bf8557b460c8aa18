"""The demo's tools: latency, dependency health, deploys and error logs of a service, a correlation
step and a report writer, all over the SQLite data of :mod:`plan_demo.dataset`.

Hourly series are lists of 24 values indexed by hour (UTC). ``day`` is ``"yesterday"``, ``"today"``
or an ISO date; outputs name the ISO date.
"""

from __future__ import annotations

import contextlib
import os
import re
import statistics
import tempfile
from collections import Counter
from datetime import date, timedelta
from pathlib import Path
from typing import Any

from airflow_plan_provider.exceptions import PermanentToolError, ReplanRequested
from airflow_plan_provider.plan.references import MissingInput
from airflow_plan_provider.tools.mcp import McpServer
from airflow_plan_provider.tools.registry import ToolRegistry
from airflow_plan_provider.tools.tool import ToolContext
from plan_demo import dataset
from plan_demo.report import hour_spans, render_report

registry = ToolRegistry()

SLOW_FACTOR = 1.5  # an hour is slow when its p99 exceeds the baseline by this factor
DEGRADED_FACTOR = 2.0  # a dependency hour is degraded above this p99 factor ...
DEGRADED_ERROR_RATE = 0.02  # ... or above this error rate


def _service(service: str) -> str:
    # Goals say "Payment API"; the data says "payment-api".
    return re.sub(r"\s+", "-", service.strip().lower())


def _day(day: str) -> date:
    today = dataset.today_utc()
    text = day.strip().lower()
    if text == "today":
        return today
    if text == "yesterday":
        return today - timedelta(days=1)
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise PermanentToolError(f"day must be 'yesterday', 'today' or an ISO date, got {day!r}") from None


def _rows(sql: str, *args: Any) -> list[Any]:
    with contextlib.closing(dataset.connect()) as conn:
        return conn.execute(sql, args).fetchall()


def _require_coverage(service: str, day: date) -> None:
    first, last = _rows("SELECT min(day), max(day) FROM latency WHERE service = ?", service)[0]
    if first is None:
        raise PermanentToolError(f"unknown service {service!r}; the data covers {dataset.SERVICE!r}")
    if not first <= day.isoformat() <= last:
        raise PermanentToolError(f"no data for {service} on {day}; the data covers {first} to {last}")


def _baseline(service: str, day: date, table: str = "latency", dependency: str | None = None) -> float:
    """Median hourly p99 of the days before ``day`` (of ``day`` itself when there are none)."""
    where = "service = ?" + (" AND dependency = ?" if dependency else "")
    args = (service, dependency) if dependency else (service,)
    values = [
        r[0] for r in _rows(f"SELECT p99_ms FROM {table} WHERE {where} AND day < ?", *args, day.isoformat())
    ]
    if not values:
        values = [
            r[0]
            for r in _rows(f"SELECT p99_ms FROM {table} WHERE {where} AND day = ?", *args, day.isoformat())
        ]
    return round(statistics.median(values), 1)


@registry.tool(description="Hourly p50/p95/p99 latency (ms) of a service for one day, with its baseline.")
def query_metrics(service: str, day: str = "yesterday") -> dict:
    """Hourly latency percentiles, the previous days' median p99 and the hours well above it."""
    name, when = _service(service), _day(day)
    _require_coverage(name, when)
    rows = _rows("SELECT * FROM latency WHERE service = ? AND day = ? ORDER BY hour", name, when.isoformat())
    p99 = [r["p99_ms"] for r in rows]
    baseline = _baseline(name, when)
    peak = max(range(len(p99)), key=p99.__getitem__)
    return {
        "service": name,
        "day": when.isoformat(),
        "unit": "ms",
        "p50": [r["p50_ms"] for r in rows],
        "p95": [r["p95_ms"] for r in rows],
        "p99": p99,
        "requests": sum(r["requests"] for r in rows),
        "baseline_p99": baseline,
        "peak": {"hour": peak, "p99": p99[peak]},
        "slow_hours": [h for h, v in enumerate(p99) if v > SLOW_FACTOR * baseline],
    }


@registry.tool(description="Hourly p99 latency and error rate of each downstream dependency of a service.")
def query_service_health(service: str, day: str = "yesterday") -> dict:
    """Per dependency: hourly p99 and error rate, total timeouts, baseline and degraded hours."""
    name, when = _service(service), _day(day)
    _require_coverage(name, when)
    rows = _rows(
        "SELECT * FROM dependency_health WHERE service = ? AND day = ? ORDER BY dependency, hour",
        name,
        when.isoformat(),
    )
    dependencies: dict[str, dict[str, Any]] = {}
    for dep in sorted({r["dependency"] for r in rows}):
        own = [r for r in rows if r["dependency"] == dep]
        baseline = _baseline(name, when, "dependency_health", dep)
        dependencies[dep] = {
            "p99": [r["p99_ms"] for r in own],
            "error_rate": [r["error_rate"] for r in own],
            "timeouts": sum(r["timeouts"] for r in own),
            "baseline_p99": baseline,
            "degraded_hours": [
                r["hour"]
                for r in own
                if r["p99_ms"] > DEGRADED_FACTOR * baseline or r["error_rate"] > DEGRADED_ERROR_RATE
            ],
        }
    return {
        "service": name,
        "day": when.isoformat(),
        "unit": "ms",
        "dependencies": dependencies,
        "degraded": [dep for dep, health in dependencies.items() if health["degraded_hours"]],
    }


@registry.tool(description="Deploys of a service on one day. Requests a replan when there were none.")
def query_deploys(service: str, day: str = "yesterday", replan_if_empty: bool = True) -> list:
    """The day's deploys, oldest first. With none and ``replan_if_empty``, a plan that blames a deploy
    is moot, so the tool asks for a replan (its output, the empty list, is kept)."""
    name, when = _service(service), _day(day)
    _require_coverage(name, when)
    rows = _rows(
        "SELECT service, deployed_at, version, author, description FROM deploys "
        "WHERE service = ? AND substr(deployed_at, 1, 10) = ? ORDER BY deployed_at",
        name,
        when.isoformat(),
    )
    deploys = [dict(r) for r in rows]
    if not deploys and replan_if_empty:
        raise ReplanRequested(f"no deploys of {name} on {when.isoformat()}", output=[])
    return deploys


@registry.tool(description="Error and warning log lines of a service for one day, grouped by message.")
def query_error_logs(service: str, day: str = "yesterday") -> dict:
    """Counts per hour and the most frequent messages (request ids stripped), with a few samples."""
    name, when = _service(service), _day(day)
    _require_coverage(name, when)
    rows = _rows(
        "SELECT ts, level, message FROM error_logs WHERE service = ? AND substr(ts, 1, 10) = ? ORDER BY ts",
        name,
        when.isoformat(),
    )
    by_hour = [0] * 24
    groups: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        by_hour[int(row["ts"][11:13])] += 1
        text = re.sub(r"\s*request_id=\w+$", "", row["message"])
        groups.setdefault((row["level"], text), []).append(row["ts"])
    counts = Counter({key: len(stamps) for key, stamps in groups.items()})
    top = [
        {
            "level": level,
            "message": text,
            "count": n,
            "first": groups[level, text][0],
            "last": groups[level, text][-1],
        }
        for (level, text), n in counts.most_common(5)
    ]
    return {
        "service": name,
        "day": when.isoformat(),
        "total": len(rows),
        "by_hour": by_hour,
        "top": top,
        "samples": [f"{r['ts']} {r['level']} {r['message']}" for r in rows[:3]],
    }


def _pearson(xs: list[float], ys: list[float]) -> float | None:
    try:
        return round(statistics.correlation(xs, ys), 3)
    except statistics.StatisticsError:  # a constant series has no correlation
        return None


def _candidates(p99: list[float], against: Any) -> tuple[list[dict[str, Any]], str | None]:
    """Series to correlate with, from dependency health or deploys; or why there are none."""
    if isinstance(against, dict) and isinstance(against.get("dependencies"), dict):
        found = []
        for dep, health in against["dependencies"].items():
            for series in ("p99", "error_rate"):
                found.append(
                    {
                        "name": f"{dep} {series.replace('_', ' ')}",
                        "dependency": dep,
                        "coefficient": _pearson(p99, health[series]),
                        "hours": health.get("degraded_hours", []),
                    }
                )
        return found, None if found else "the dependency health lists no dependencies"
    if isinstance(against, list):
        if not against:
            return [], "there were no deploys that day, so a deploy cannot explain the latency"
        deploy_hours = [int(d["deployed_at"][11:13]) for d in against]
        # Deploy effects persist: after a deploy its code serves every later hour.
        step = [float(sum(h <= hour for h in deploy_hours)) for hour in range(len(p99))]
        versions = ", ".join(d.get("version", "?") for d in against)
        return [
            {"name": f"deploys ({versions})", "coefficient": _pearson(p99, step), "hours": deploy_hours}
        ], None
    return [], f"cannot correlate with input of type {type(against).__name__}"


@registry.tool(description="Correlate a latency p99 series with dependency health or with deploys.")
def analyze_correlation(latency: dict, against: Any, label: str) -> dict:
    """Pearson correlation of the hourly p99 with each candidate series in ``against``, strongest first,
    with the latency peak hours and a one-sentence finding. A missing ``against`` is reported, not fatal."""
    p99 = [float(v) for v in latency["p99"]]
    baseline = float(latency.get("baseline_p99") or statistics.median(p99))
    peak_hours = [h for h, v in enumerate(p99) if v > SLOW_FACTOR * baseline]
    service, day = latency.get("service", "the service"), latency.get("day", "the day")
    opening = (
        f"{service} p99 peaked at {max(p99):.0f} ms on {day} (baseline {baseline:.0f} ms), "
        f"slow hours {hour_spans(peak_hours)} UTC."
    )
    missing = against is None or isinstance(against, MissingInput)
    candidates: list[dict[str, Any]]
    reason: str | None
    if missing:
        candidates, reason = [], f"the {label} input was missing, so nothing could be correlated"
    else:
        candidates, reason = _candidates(p99, against)
    ranked = sorted(
        (c for c in candidates if c["coefficient"] is not None), key=lambda c: c["coefficient"], reverse=True
    )
    top = ranked[0] if ranked else None
    if top is not None:
        overlap = sorted(set(top["hours"]) & set(peak_hours))
        top = {**top, "overlap_hours": overlap}
        if top.get("dependency") and isinstance(against, dict):
            # the report charts the dependency's p99 beside the service's, whichever series correlated
            top["dependency_p99"] = list(against["dependencies"][top["dependency"]]["p99"])
        same = f", unusual in the same hours ({hour_spans(overlap)})" if overlap else ""
        sentence = f"{opening} It correlates most with {top['name']} (r = {top['coefficient']:.3f}){same}."
    else:
        sentence = f"{opening} No correlation with {label}: {reason or 'no series could be correlated'}."
    return {
        "label": label,
        "service": service,
        "day": day,
        "peak_hours": peak_hours,
        "peak_p99": max(p99),
        "baseline_p99": baseline,
        "top": top,
        "coefficient": top["coefficient"] if top else None,
        "candidates": ranked[:6],
        "missing_input": missing,
        "sentence": sentence,
    }


def report_dir() -> Path:
    """``$PLAN_REPORT_DIR``, else ``<AIRFLOW_HOME or ~/airflow>/plan_reports``."""
    if os.environ.get("PLAN_REPORT_DIR"):
        return Path(os.environ["PLAN_REPORT_DIR"]).expanduser()
    return Path(os.environ.get("AIRFLOW_HOME") or Path.home() / "airflow").expanduser() / "plan_reports"


@registry.tool(description="Write the Markdown report of a finding; returns it, its path, title and summary.")
def write_report(goal: str, finding: dict, metrics: dict, errors: Any = None, *, ctx: ToolContext) -> dict:
    """Render the report and write it to a file named after the day it covers and the call's
    idempotency key (``<day>_<key>.md``): one file per day, and every try of the same node writes the
    same file. The output carries the report's text too (``markdown``): the Plan view opens it from the
    node's details."""
    if isinstance(errors, MissingInput):
        errors = None
    title, text = render_report(goal, finding, metrics, errors, ctx)
    directory = report_dir()
    directory.mkdir(parents=True, exist_ok=True)
    day = re.sub(r"[^0-9-]+", "", str(finding.get("day") or metrics.get("day") or ""))[:10] or "undated"
    safe_key = re.sub(r"[^A-Za-z0-9_.-]+", "_", ctx.idempotency_key).strip("._")[:120] or "report"
    path = directory / f"{day}_{safe_key}.md"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, path)  # a reader sees the old report or the new one, never half of one
    return {"path": str(path), "title": title, "summary": finding.get("sentence", ""), "markdown": text}


#: The Airflow connection (conn type ``mcp``) of the demo's MCP server (:mod:`plan_demo.mcp_server`).
MCP_CONN_ID = "plan_demo_mcp"
#: The tools of the example DAG ``plan_over_mcp``: the read-only queries come from the demo's MCP server
#: (listed when a run plans, under their own names), the deploy query, the correlation and the report
#: writer are the Python functions above.
mcp_registry = ToolRegistry(
    [registry["query_deploys"], registry["analyze_correlation"], registry["write_report"]],
    sources=[McpServer(MCP_CONN_ID, prefix="")],
)
