"""``SessionApi.session`` reads a session's outcome by the contract's rule and freezes only a completed
session's final plan (the REST API answered from a dict of XCom entries)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_plan_provider.contract import (
    FINALIZE_TASK,
    PLAN_KEY,
    PLAN_TASK,
    REPLAN_TASK,
    RESULT_KEY,
    SESSION_KEY,
)
from airflow_plan_provider.exceptions import FreezeError
from airflow_plan_provider.freeze import SessionApi
from airflow_plan_provider.plan.validate import validate_plan

PLAN = {"goal": "g", "nodes": [{"id": "1", "action": "a", "tool": "t", "params": {}}], "edges": []}
ROOT, CHILD = "manual__1", "manual__1__replan_1"


class FakeApi(SessionApi):
    def __init__(self, xcoms: dict[tuple[str, str, str], Any]) -> None:
        super().__init__("http://airflow.invalid")
        self.xcoms = xcoms

    def _send(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        for (run_id, task_id, key), value in self.xcoms.items():
            if f"/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/{key}?" in path:
                return 200, json.dumps({"value": value}).encode()
        return 404, b"{}"


def result(status: str, reason: str, **fields: Any) -> dict[str, Any]:
    return {"status": status, "reason": reason, **fields}


def replanned_session(chain_result: dict[str, Any] | None) -> FakeApi:
    plan = validate_plan(PLAN).model_dump(mode="json")
    xcoms = {
        (ROOT, PLAN_TASK, SESSION_KEY): {"root_run_id": ROOT, "revision": 0},
        (ROOT, FINALIZE_TASK, RESULT_KEY): result("replanned", "replan_requested"),
        (CHILD, PLAN_TASK, SESSION_KEY): {"root_run_id": ROOT, "revision": 1},
        (CHILD, PLAN_TASK, PLAN_KEY): plan,
    }
    if chain_result is not None:
        xcoms[(ROOT, REPLAN_TASK, RESULT_KEY)] = chain_result
    return FakeApi(xcoms)


def test_a_completed_session_that_replanned_freezes_its_last_runs_plan() -> None:
    completed = result("completed", "goal_met", run_ids=[ROOT, CHILD], usage={"replans": 1})
    source = replanned_session(completed).session("d", CHILD)
    assert (source.final_run, source.revision, source.replans) == (CHILD, 1, 1)
    assert [node["id"] for node in source.plan["nodes"]] == ["1"]


@pytest.mark.parametrize(
    ("chain_result", "error"),
    [
        (None, "has no result \\(is it still running\\?\\)"),  # the root's replan task has not reported
        (result("failed", "node_failed"), "ended failed \\(node_failed\\): only a completed session"),
    ],
)
def test_a_session_without_a_completed_outcome_is_not_frozen(chain_result: Any, error: str) -> None:
    with pytest.raises(FreezeError, match=error):
        replanned_session(chain_result).session("d", ROOT)
