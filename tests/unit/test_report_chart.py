"""The example's report shows the day's p99 latency as a chart: the service's and the correlated
dependency's, as inline SVG in the Markdown report (built from the demo dataset)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from airflow_plan_provider.tools.tool import ToolContext
from plan_demo import dataset
from plan_demo.tools import (
    analyze_correlation,
    query_metrics,
    query_service_health,
    write_report,
)

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture
def demo_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PLAN_DEMO_DB", str(tmp_path / "demo.sqlite"))
    monkeypatch.setenv("PLAN_REPORT_DIR", str(tmp_path / "reports"))
    return tmp_path


def chart_of(text: str) -> ET.Element:
    """The one inline SVG of a Markdown report, parsed (it must be well-formed XML)."""
    found = re.findall(r"^<svg .*?^</svg>$", text, re.S | re.M)
    assert len(found) == 1, f"{len(found)} SVG charts in the report"
    assert "\n\n" not in found[0]  # a blank line would end the HTML block in Markdown
    return ET.fromstring(found[0])


def test_report_charts_service_and_dependency_p99_over_the_day(demo_env: Path) -> None:
    metrics, health = query_metrics("payment-api"), query_service_health("payment-api")
    finding = analyze_correlation(metrics, health, "dependency health")
    ctx = ToolContext(node_id="6", idempotency_key="chart/6", attempt=1, run_id="r", revision=1)
    text = Path(write_report("why slow", finding, metrics, None, ctx=ctx)["path"]).read_text()

    chart = chart_of(text)
    lines = {line.get("data-series"): line.get("points") for line in chart.iter(f"{SVG}polyline")}
    assert set(lines) == {"payment-api p99", "fraud-check p99"}
    points = {label: [tuple(map(float, p.split(","))) for p in pts.split()] for label, pts in lines.items()}
    assert all(len(series) == 24 for series in points.values())
    # SVG y grows downwards: each line is highest (smallest y) in the incident hours, 14:00-16:00 UTC
    for series in points.values():
        highest = min(range(24), key=lambda hour: series[hour][1])
        assert highest in dataset.INCIDENT_HOURS
    # both lines share one millisecond axis: fraud-check's 14:00 value sits where its ms value says
    dependency_p99 = health["dependencies"]["fraud-check"]["p99"]
    service_p99 = metrics["p99"]
    ratio = (280 - 36 - points["fraud-check p99"][14][1]) / (280 - 36 - points["payment-api p99"][14][1])
    assert ratio == pytest.approx(dependency_p99[14] / service_p99[14], rel=0.01)
    assert len(list(chart.iter(f"{SVG}rect"))) >= 1 + len(finding["peak_hours"])  # slow hours shaded
    assert text.index("<svg") < text.index("| hour (UTC) |")  # the picture before the table


def test_a_report_without_a_dependency_charts_the_service_alone(demo_env: Path) -> None:
    metrics = query_metrics("payment-api")
    finding = analyze_correlation(metrics, [], "deploys")
    ctx = ToolContext(node_id="6", idempotency_key="chart/6b", attempt=1, run_id="r", revision=0)
    text = Path(write_report("why slow", finding, metrics, None, ctx=ctx)["path"]).read_text()
    series = [line.get("data-series") for line in chart_of(text).iter(f"{SVG}polyline")]
    assert series == ["payment-api p99"]
