"""Whether Airflow starts a mapped task instance on the triggerer (an operator's ``start_from_trigger``).

One run of a DAG (``bench/_start_from_trigger/``): an upstream task sleeping 3 s, then three mapped
instances and one unmapped instance (the control) of an operator with ``start_from_trigger = True``,
whose trigger fires after 1 s. What ran decides where an instance started: ``execute`` (on a worker) or
only ``execute_complete`` (on the triggerer, then resumed on a worker with the trigger's event); each
method returns what it saw as the task's XCom, read back through the REST API with the task instances.
Printed per instance: started on the triggerer, the map index its trigger saw next to its own, the value
of a templated trigger kwarg (``{{ ti.map_index }}``, also a template field of the operator) as the
trigger got it, its state, and the upstream task's end → its queued time, start and end. A task instance
started on the triggerer has its start when the scheduler deferred it and its queued time when the
trigger fired.

It runs on the Airflow of the interpreter that runs it: ``.venv-<version>/bin/python`` probes that
version. ``--json FILE`` writes the measurement as a ``bench/results/`` record.

Run::

    .venv/bin/python bench/start_from_trigger.py [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _planbench import Bench, load_note, log, ts
from results import head_commit

from airflow_plan_provider.contract import RESULT_KEY
from harness.cluster import AirflowApiError

BENCH = Path(__file__).resolve().parent
COMPONENTS_PATH = BENCH / "_start_from_trigger"  # on every component's PYTHONPATH: trigger_first
DAG_FILE = COMPONENTS_PATH / "dag.py"
DAG_ID = "bench_start_from_trigger"  # dag.py's DAG_ID
UPSTREAM = "upstream"
QUESTION = "start-from-trigger-mapped"
TITLE = "mapped task instances started on the triggerer (start_from_trigger)"


def after(moment: str | None, origin: float | None) -> float | None:
    """An API timestamp as seconds after ``origin`` (epoch seconds)."""
    at = ts(moment)
    return None if at is None or origin is None else round(at - origin, 2)


def instances(bench: Bench, run_id: str) -> list[dict[str, Any]]:
    """One row per instance of the operator (mapped ones by map index, then the unmapped one): what its
    XCom says ran and saw, its state, and its times after the upstream task's end, s."""
    assert bench.cluster is not None
    tis = bench.cluster.task_instances(DAG_ID, run_id)
    upstream_end = next((ts(ti.get("end_date")) for ti in tis if ti["task_id"] == UPSTREAM), None)
    rows = []
    for ti in sorted(tis, key=lambda ti: (ti["task_id"] != "mapped", ti["map_index"])):
        if ti["task_id"] == UPSTREAM:
            continue
        try:
            seen = bench.cluster.xcom(DAG_ID, run_id, ti["task_id"], RESULT_KEY, ti["map_index"])
        except AirflowApiError:
            seen = None  # the instance pushed nothing (it did not end with a method of its own)
        seen = seen if isinstance(seen, dict) else {}
        rows.append(
            {
                "task_id": ti["task_id"],
                "map_index": ti["map_index"],
                "ran": seen.get("ran"),
                "on_triggerer": seen.get("ran") == "execute_complete",
                "trigger_map_index": seen.get("trigger_map_index"),
                "trigger_tag": seen.get("trigger_tag"),
                "tag_rendered": seen.get("trigger_tag") == str(ti["map_index"]),
                "state": ti["state"],
                "queued_s": after(ti.get("queued_when"), upstream_end),
                "start_s": after(ti.get("start_date"), upstream_end),
                "end_s": after(ti.get("end_date"), upstream_end),
            }
        )
    return rows


def name(row: dict[str, Any]) -> str:
    return f"mapped[{row['map_index']}]" if row["map_index"] >= 0 else row["task_id"]


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def print_table(rows: list[dict[str, Any]]) -> None:
    header = (
        "instance",
        "on triggerer",
        "ran",
        "trigger's map index / own",
        "templated kwarg",
        "state",
        "-> queued",
        "-> start",
        "-> end",
    )
    lines = [
        (
            name(row),
            cell(row["on_triggerer"]),
            cell(row["ran"]),
            f"{cell(row['trigger_map_index'])} / {row['map_index']}",
            cell(row["trigger_tag"]),
            cell(row["state"]),
            cell(row["queued_s"]),
            cell(row["start_s"]),
            cell(row["end_s"]),
        )
        for row in rows
    ]
    widths = [max(len(line[i]) for line in [header, *lines]) for i in range(len(header))]
    for line in [header, *lines]:
        print(
            ("  " + "  ".join(text.ljust(width) for text, width in zip(line, widths, strict=True))).rstrip()
        )


def headline(airflow: str, rows: list[dict[str, Any]]) -> str:
    mapped = [row for row in rows if row["map_index"] >= 0]
    control = [row for row in rows if row["map_index"] < 0]
    on = [row for row in mapped if row["on_triggerer"]]
    right = [row for row in on if row["trigger_map_index"] == row["map_index"]]
    rendered = [row for row in on if row["tag_rendered"]]
    control_on = any(row["on_triggerer"] for row in control)
    if not on:
        where = "on the triggerer" if control_on else "on a worker, execute ran"
        return f"Airflow {airflow}: no mapped instance started on the triggerer (unmapped control: {where})"
    ends = [row["end_s"] for row in on if row["end_s"] is not None]
    return (
        f"Airflow {airflow}: {len(on)} of {len(mapped)} mapped instances started on the triggerer, their"
        f" trigger saw its own map index in {len(right)} and its templated kwarg rendered for it in"
        f" {len(rendered)}; unmapped control"
        f" {'too' if control_on else 'not'}; ended {statistics.median(ends):.1f} s after the upstream task"
        " (median)"
    )


def write_record(path: Path, airflow: str, rows: list[dict[str, Any]], run_state: str, machine: str) -> None:
    """The measurement in ``bench/results/``'s schema (``bench/results.py``'s SCHEMA): one yes/no as 1/0,
    seconds after the upstream task's end, per instance; the Airflow version as numbers."""
    release = [int("".join(c for c in part if c.isdigit()) or 0) for part in airflow.split(".")[:3]]
    figures: dict[str, float] = dict(
        zip(("airflow_major", "airflow_minor", "airflow_patch"), release, strict=False)
    )
    for row in rows:
        key = f"mapped_{row['map_index']}" if row["map_index"] >= 0 else row["task_id"]
        values = {
            "on_triggerer": int(row["on_triggerer"]),
            "success": int(row["state"] == "success"),
            "trigger_map_index": row["trigger_map_index"],
            "tag_rendered": int(row["tag_rendered"]) if row["on_triggerer"] else None,
            "queued_s": row["queued_s"],
            "start_s": row["start_s"],
            "end_s": row["end_s"],
        }
        figures |= {f"{key}_{k}": v for k, v in values.items() if isinstance(v, int | float)}
    figures["mapped_on_triggerer"] = sum(row["on_triggerer"] for row in rows if row["map_index"] >= 0)
    interpreter = Path(sys.executable)
    root = BENCH.parent
    python = str(interpreter.relative_to(root)) if interpreter.is_relative_to(root) else "python"
    record = {
        "question": QUESTION,
        "title": TITLE,
        "script": "start_from_trigger.py",
        "command": f"{python} bench/start_from_trigger.py",
        "date": time.strftime("%Y-%m-%dT%H:%M", time.gmtime()),
        "machine": machine,
        "commit": head_commit(),
        "headline": headline(airflow, rows),
        "figures": figures,
        "target": "-",
        "met": None,
        "note": f"Airflow {airflow}; run {run_state}; times in s after the upstream task's end",
    }
    path.write_text(json.dumps(record, indent=2) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the measurement as a bench/results/ record")
    args = parser.parse_args()
    airflow = version("apache-airflow")
    bench = Bench("bench-start-from-trigger")
    bench.write_dag(DAG_ID, DAG_FILE.read_text())
    load_before = load_note()
    try:
        bench.start(
            parallelism=4,
            dag_ids=[DAG_ID],
            env={
                "PYTHONPATH": os.pathsep.join(
                    p for p in (str(COMPONENTS_PATH), os.environ.get("PYTHONPATH")) if p
                )
            },
        )
        run = bench.run(DAG_ID, timeout=300)
        rows = instances(bench, run.run_id)
    finally:
        bench.stop()
    print(
        f"\nstart_from_trigger, mapped: Airflow {airflow}, LocalExecutor, SQLite; run {run.state};"
        f" {time.strftime('%Y-%m-%d %H:%M %Z')}; {load_before} before, {load_note()} after"
    )
    print("  times: s after the upstream task's end")
    print_table(rows)
    print(f"  {headline(airflow, rows)}")
    if args.json:
        write_record(
            args.json,
            airflow,
            rows,
            run.state,
            f"{os.cpu_count()} cores, LocalExecutor, SQLite, Airflow {airflow}",
        )
        log(f"record written to {args.json}")
    return 0 if run.state == "success" else 1


if __name__ == "__main__":
    sys.exit(main())
