"""Markdown rendering of the demo's investigation report (used by the ``write_report`` tool), with an
inline SVG chart of the day's p99 latency: the service's and the correlated dependency's."""

from __future__ import annotations

from html import escape
from typing import Any

from airflow_plan_provider.tools.tool import ToolContext


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def hour_spans(hours: list[int]) -> str:
    """Hours as spans: [14, 15, 20] -> '14:00-16:00, 20:00-21:00'."""
    spans: list[list[int]] = []
    for hour in sorted(hours):
        if spans and hour == spans[-1][1]:
            spans[-1][1] = hour + 1
        else:
            spans.append([hour, hour + 1])
    return ", ".join(f"{a:02d}:00-{b:02d}:00" for a, b in spans) or "none"


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return lines


def _latency_section(metrics: dict, peak_hours: list[int]) -> list[str]:
    p99 = metrics.get("p99") or []
    if not p99:
        return ["No latency series was available."]
    # The slow hours with one hour either side show where the rise starts and ends.
    shown = sorted({h + d for h in peak_hours for d in (-1, 0, 1) if 0 <= h + d < len(p99)}) or list(
        range(len(p99))
    )
    rows = [
        [f"{h:02d}:00", metrics["p50"][h], metrics["p95"][h], p99[h], "slow" if h in peak_hours else ""]
        for h in shown
    ]
    lines = [
        f"Baseline p99 (median of the previous days): {metrics.get('baseline_p99', '?')} ms; "
        f"requests that day: {metrics.get('requests', '?')}.",
        "",
    ]
    return lines + _table(["hour (UTC)", "p50 ms", "p95 ms", "p99 ms", ""], rows)


CHART_WIDTH, CHART_HEIGHT = 640, 280
PLOT = {"left": 56, "right": 16, "top": 36, "bottom": 36}
SERIES_COLOURS = ("#1f6feb", "#d1242f")


def _scale(values: list[float], top: float, size: int, lower: int) -> list[float]:
    return [lower - size * v / top for v in values]


def p99_chart(
    series: list[tuple[str, list[float]]], slow_hours: list[int], baseline: float | None = None
) -> str:
    """An inline SVG line chart of hourly p99 series (ms) over one day, the slow hours shaded.

    ``series`` is ``[(label, 24 values), ...]``; every series shares one millisecond axis. Each line
    is a ``<polyline data-series="label">`` so the chart can be read back by a test or a script.
    """
    shown = [(label, [float(v) for v in values]) for label, values in series if values]
    width, height = CHART_WIDTH, CHART_HEIGHT
    left, right, top_margin, bottom = PLOT["left"], PLOT["right"], PLOT["top"], PLOT["bottom"]
    plot_w, plot_h = width - left - right, height - top_margin - bottom
    lower = height - bottom
    hours = max((len(values) for _, values in shown), default=24)
    peak = max([v for _, values in shown for v in values] + [baseline or 0.0, 1.0])
    axis_top = _nice_ceiling(peak)
    step = plot_w / max(hours - 1, 1)

    def x(hour: float) -> float:
        return left + step * hour

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" font-family="sans-serif" font-size="11">',
        "<title>p99 latency by hour (UTC), ms</title>",
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
    ]
    for hour in slow_hours:
        parts.append(
            f'<rect class="slow" x="{x(hour) - step / 2:.1f}" y="{top_margin}" width="{step:.1f}" '
            f'height="{plot_h}" fill="#fff1c2"/>'
        )
    for tick in range(5):
        value = axis_top * tick / 4
        y = lower - plot_h * tick / 4
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" stroke="#e5e7eb"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{value:g}</text>')
    parts.append(f'<text x="{left - 6}" y="{top_margin - 10}" text-anchor="end">ms</text>')
    for hour in range(0, hours, 3):
        parts.append(f'<text x="{x(hour):.1f}" y="{lower + 16}" text-anchor="middle">{hour:02d}:00</text>')
    if baseline:
        y = _scale([baseline], axis_top, plot_h, lower)[0]
        parts.append(
            f'<line class="baseline" x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" '
            'stroke="#6b7280" stroke-dasharray="4 3"/>'
        )
    for index, (label, values) in enumerate(shown):
        colour = SERIES_COLOURS[index % len(SERIES_COLOURS)]
        ys = _scale(values, axis_top, plot_h, lower)
        points = " ".join(f"{x(h):.1f},{y:.1f}" for h, y in enumerate(ys))
        parts.append(
            f'<polyline data-series="{escape(label)}" points="{points}" fill="none" '
            f'stroke="{colour}" stroke-width="2"/>'
        )
        legend_x = left + 190 * index
        parts.append(f'<rect x="{legend_x}" y="12" width="12" height="3" fill="{colour}"/>')
        parts.append(f'<text x="{legend_x + 16}" y="17">{escape(label)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def _nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5 or 5 times a power of ten at or above ``value``: a readable axis top."""
    magnitude = 1.0
    while magnitude * 10 <= value:
        magnitude *= 10
    return next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= value)


def _chart_section(metrics: dict, finding: dict) -> list[str]:
    service = metrics.get("service", "service")
    series = [(f"{service} p99", metrics.get("p99") or [])]
    top = finding.get("top") or {}
    if top.get("dependency_p99"):
        series.append((f"{top['dependency']} p99", top["dependency_p99"]))
    if not series[0][1]:
        return []
    chart = p99_chart(series, finding.get("peak_hours", []), metrics.get("baseline_p99"))
    shaded = "slow hours shaded, previous days' median p99 dashed"
    return [chart, "", f"*p99 latency by hour (UTC), ms: {', '.join(s[0] for s in series)}; {shaded}.*", ""]


def _errors_section(errors: Any) -> list[str]:
    if not isinstance(errors, dict):
        return ["No error-log data was available for this report."]
    lines = [f"{errors.get('total', 0)} error and warning lines that day.", ""]
    top = errors.get("top") or []
    if top:
        lines += _table(
            ["count", "level", "message", "first", "last"],
            [[t["count"], t["level"], t["message"], t["first"], t["last"]] for t in top],
        )
    return lines


def render_report(goal: str, finding: dict, metrics: dict, errors: Any, ctx: ToolContext) -> tuple[str, str]:
    """The report's title and Markdown text."""
    service = finding.get("service") or metrics.get("service", "service")
    day = finding.get("day") or metrics.get("day", "")
    title = f"{service} latency on {day}: investigation report"
    top = finding.get("top")
    lines = [f"# {title}", "", f"**Goal:** {goal}", "", "## Finding", "", finding.get("sentence", ""), ""]
    if top:
        lines += [
            f"- Strongest correlation: **{top.get('dependency') or top['name']}** "
            f"({top['name']}, r = {top['coefficient']:.3f})",
            f"- Unusual in the same hours: {hour_spans(top.get('overlap_hours', []))} UTC",
            "",
        ]
    if finding.get("candidates"):
        lines += [f"## Correlation with {finding.get('label', 'candidates')}", ""]
        lines += _table(
            ["series", "r", "its unusual hours"],
            [[c["name"], c["coefficient"], hour_spans(c.get("hours", []))] for c in finding["candidates"]],
        )
        lines.append("")
    lines += ["## Latency", "", *_chart_section(metrics, finding)]
    lines += [*_latency_section(metrics, finding.get("peak_hours", [])), ""]
    lines += ["## Error logs", "", *_errors_section(errors), ""]
    if ctx.missing_inputs:
        names = ", ".join(f"node {n}" for n in ctx.missing_inputs)
        lines += [
            "## Missing inputs",
            "",
            f"This report was written without the output of {names}: an optional step before it did not "
            "succeed, so the sections that depend on it are incomplete.",
            "",
        ]
    lines += [
        "---",
        f"Written by node {ctx.node_id} of run {ctx.run_id} of DAG {ctx.dag_id or '(none)'} "
        f"(revision {ctx.revision}, try {ctx.attempt}).",
    ]
    return title, "\n".join(lines) + "\n"
