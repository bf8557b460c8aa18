"""The benchmarks' reading of a static DAG's run: which of its tasks of equal weight the scheduler queued
first, when both waited for a slot (``_planbench.tie_order``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from _planbench import Run, tie_order

# a root r, then three children of equal weight, all ready when r ended at 10 s
PLAN = {
    "nodes": [{"id": n} for n in ("r", "b", "a", "c")],
    "edges": [{"from": "r", "to": child} for child in ("b", "a", "c")],
}


def _run(queued: dict[str, float], weights: dict[str, int] | None = None) -> Run:
    weights = weights or {"r": 4, "a": 1, "b": 1, "c": 1}
    ends = {"r": 10.0} | {n: at + 5.0 for n, at in queued.items() if n != "r"}
    tis: list[dict[str, Any]] = [
        {
            "task_id": f"n{node}",
            "priority_weight": weights[node],
            "queued": queued[node],
            "start": queued[node] + 0.1,
            "end": ends[node],
        }
        for node in queued
    ]
    return Run("static", "r1", "success", 0.0, 30.0, tis, {n: (0.0, 0.0) for n in queued})


def test_pairs_of_equal_weight_both_waiting_are_counted_in_the_dags_task_order() -> None:
    # queued b, a, c (the DAG's order: b before a before c), well after r ended: three pairs, all in order
    in_order = _run({"r": 0.0, "b": 12.0, "a": 13.0, "c": 14.0})
    assert tie_order(in_order, PLAN) == {"pairs": 3, "in task order": 3}
    # c first: two of the three pairs out of the DAG's order
    c_first = _run({"r": 0.0, "c": 12.0, "b": 13.0, "a": 14.0})
    assert tie_order(c_first, PLAN) == {"pairs": 3, "in task order": 1}


def test_a_task_not_yet_ready_or_of_another_weight_makes_no_pair() -> None:
    # a was queued right as r ended: c and b were not waiting for a slot yet, so no pair includes a
    early = _run({"r": 0.0, "a": 10.2, "b": 12.0, "c": 13.0})
    assert tie_order(early, PLAN) == {"pairs": 1, "in task order": 1}
    weighed = _run({"r": 0.0, "b": 12.0, "a": 13.0, "c": 14.0}, {"r": 4, "a": 1, "b": 2, "c": 1})
    assert tie_order(weighed, PLAN) == {"pairs": 1, "in task order": 1}
