"""Where a task instance's slot time goes, phase by phase, from the task logs a benchmark left behind.

Run a benchmark with ``AIRFLOW_E2E_KEEP_HOME=1`` (the cluster's home, logs included, stays in the temporary
folder), then point this script at that home and the DAGs to compare. For every task log of those DAGs
(the plan DAG's ``plan`` and ``finalize`` tasks left out), the timestamps of the lines that bound each
phase are read, and the medians and means over all task logs printed:

- ``start``: ``::group::Pre Execute`` → ``DAG bundles loaded``;
- ``parse``: → ``Worker startup parse complete`` (the DAG file parse in the task);
- ``prepare``: → the first ``::endgroup::`` (Airflow's preparation before ``execute``: the mapped value
  resolved, the early ``map_index_template`` PATCH, rendered fields);
- ``node start``: → the node's first line (its brief read, its parents' states and records read);
- ``tool``: the node's ``calling`` line → its ``succeeded in`` line (a static task: ``::endgroup::`` →
  ``Done. Returned value``);
- ``after tool``: → ``::group::Post Execute`` (a node pushes its record here; a static task after it);
- ``post``: → the log's last line;
- ``all``: ``Pre Execute`` → the last line.

Run::

    AIRFLOW_E2E_KEEP_HOME=1 .venv/bin/python bench/concurrent_runs.py --db postgresql \
        --celery-workers 2 --runs 10
    .venv/bin/python bench/task_phases.py /tmp/airflow-e2e-XXXX \
        bench_concurrent_plan bench_concurrent_static
"""

from __future__ import annotations

import argparse
import json
import statistics
from datetime import datetime
from pathlib import Path

#: phase -> (the mark it starts at, the mark it ends at)
PHASES = {
    "start": ("pre", "bundles"),
    "parse": ("bundles", "parsed"),
    "prepare": ("parsed", "prepared"),
    "node start": ("prepared", "first"),
    "tool": ("called", "returned"),
    "after tool": ("returned", "post"),
    "post": ("post", "last"),
    "all": ("pre", "last"),
}
#: mark -> the start of the first log line that sets it
FIRST_LINE = {
    "pre": "::group::Pre Execute",
    "bundles": "DAG bundles loaded",
    "parsed": "Worker startup parse complete",
    "prepared": "::endgroup::",
    "post": "::group::Post Execute",
    "returned": "Done. Returned value",
}


def marks(log: Path) -> dict[str, float]:
    """Mark -> the time of the line that sets it, in one task log (one JSON object per line)."""
    found: dict[str, float] = {}
    last = None
    for line in log.read_text().splitlines():
        try:
            entry = json.loads(line)
            at = datetime.fromisoformat(str(entry["timestamp"]).replace("Z", "+00:00")).timestamp()
        except (ValueError, KeyError, TypeError):
            continue
        event, last = str(entry.get("event")), at
        for mark, start in FIRST_LINE.items():
            if event.startswith(start):
                found.setdefault(mark, at)
        if event.startswith("node "):
            found.setdefault("first", at)
            if ": calling " in event:
                found.setdefault("called", at)
            if " succeeded in " in event:
                found.setdefault("returned", at)
    if last is not None:
        found["last"] = last
    if "called" not in found and "prepared" in found:  # a static task calls its callable at once
        found["called"] = found["prepared"]
    return found


def phases(home: Path, dag_id: str) -> dict[str, list[float]]:
    """Phase -> its duration in every task log of ``dag_id`` under ``home`` that has both its marks."""
    durations: dict[str, list[float]] = {phase: [] for phase in PHASES}
    for log in sorted((home / "logs" / f"dag_id={dag_id}").rglob("attempt=*.log")):
        if any(part in ("task_id=plan", "task_id=finalize") for part in log.parts):
            continue
        found = marks(log)
        for phase, (begin, end) in PHASES.items():
            if begin in found and end in found:
                durations[phase].append(found[end] - found[begin])
    return durations


def _cell(values: list[float]) -> str:
    """``median / mean (count)`` of one phase's durations, or ``-`` when no log had both its marks."""
    if not values:
        return "-"
    return f"{statistics.median(values):.3f} / {statistics.mean(values):.3f} ({len(values)})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("home", type=Path, help="the cluster's home a benchmark kept")
    parser.add_argument("dag_ids", nargs="+", help="the DAGs whose task logs to read")
    args = parser.parse_args()
    table = {dag_id: phases(args.home, dag_id) for dag_id in args.dag_ids}
    print(f"{'phase (median / mean s, task logs)':<36}" + "".join(f"{d:>30}" for d in args.dag_ids))
    for phase in PHASES:
        cells = [_cell(table[dag_id][phase]) for dag_id in args.dag_ids]
        print(f"  {phase:<34}" + "".join(f"{c:>30}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
