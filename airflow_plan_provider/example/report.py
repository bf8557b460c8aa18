"""Markdown rendering of the demo's investigation report (used by the ``write_report`` tool)."""

from __future__ import annotations

from typing import Any

from airflow_plan_provider.tools.registry import ToolContext


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
    lines += ["## Latency", "", *_latency_section(metrics, finding.get("peak_hours", [])), ""]
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
    lines += ["---", f"Written by node {ctx.node_id} (revision {ctx.revision}, try {ctx.attempt})."]
    return title, "\n".join(lines) + "\n"
