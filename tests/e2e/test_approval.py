"""Approval and scheduled reports on a real Airflow, driven through the REST API.

One cluster serves the module, with the simple auth manager's real users (``admin``, ``alice`` who
may approve, ``mallory`` who may not). Every scenario is started when the cluster is up, so their
waits overlap: a rejected plan (its risky tool is never called, no node runs), an approved one, an
approval that times out, an approval answered within a second of the request appearing, a replan that
asks again for its new risky node only, the example session frozen through the REST API (compared with
the committed ``dags/daily_payment_report.py``), a three-day backfill of that frozen DAG, and a run of
it triggered with a plan in its conf (refused, as its docstring says).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_plan_provider.contract import APPROVE_TASK, NODES_TASK, PLAN_TASK
from airflow_plan_provider.testing.scripted import CallLog
from harness.cluster import AirflowApiError, AirflowCluster
from harness.sqlite import API_TIMEOUT, locked
from tests.e2e.conftest import EXAMPLE_FILES, demo_env, plan_cluster

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
APPROVAL_DAGS = Path(__file__).resolve().parent / "dags" / "approval_dags.py"
DAILY = ROOT / "dags" / "daily_payment_report.py"
EXAMPLE, FROZEN = "plan_and_execute", "daily_payment_report"
GOAL = "find why the payment API got slow yesterday and write a report"
SECRET = "sk-e2e-approval-secret-0042"  # as in dags/approval_dags.py
DAG_IDS = ("e2e_approval", "e2e_approval_timeout", "e2e_approval_replan", EXAMPLE, FROZEN)
FREEZE_ARGS = [  # as the committed dags/daily_payment_report.py was written (see its docstring)
    "--tools=plan_demo.tools:registry",
    "--dag-id=daily_payment_report",
    "--schedule=@daily",
    "--start-date=2024-01-01",
    "--param=day={{ macros.ds_add(ds, -1) }}",
]
RUN_TIMEOUT = 300.0
#: a plan a user gives a frozen DAG's run in its conf (the DAG's docstring: refused)
FOREIGN_PLAN = {
    "goal": "something else",
    "nodes": [
        {"id": "1", "action": "metrics", "tool": "query_metrics", "params": {"service": "payment-api"}}
    ],
}


@dataclass
class Env:
    cluster: AirflowCluster
    passwords: dict[str, str]
    calls: Path
    reports: Path
    runs: dict[str, str] = field(default_factory=dict)
    backfill_days: list[str] = field(default_factory=list)

    def log(self, dag_id: str) -> CallLog:
        return CallLog(self.calls / dag_id)

    def calls_of(self, dag_id: str, run_id: str, tool: str | None = None) -> list[dict[str, Any]]:
        """Tool calls made by the session whose root run is ``run_id`` (its idempotency keys name it)."""
        return [c for c in self.log(dag_id).calls(tool) if c["key"].startswith(f"{dag_id}/{run_id}/")]

    def as_user(self, user: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """Call the API as ``user`` (a token from ``/auth/token``); returns the status and parsed body."""
        token = self._request("POST", "/auth/token", {"username": user, "password": self.passwords[user]})
        return self._request(method, path, body, token=token[1]["access_token"])

    def _request(self, method: str, path: str, body: Any = None, token: str | None = None) -> Any:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.cluster.base_url + path, data, headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=API_TIMEOUT) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode("utf-8", "replace")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    base = tmp_path_factory.mktemp("approval")
    home = base / "home"
    home.mkdir()
    passwords = {user: secrets.token_urlsafe(12) for user in ("admin", "alice", "mallory")}
    # the simple auth manager keeps (and would generate) its users' passwords in this file
    (home / "simple_auth_manager_passwords.json.generated").write_text(json.dumps(passwords))
    extra = {
        **demo_env(base),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,alice:admin,mallory:admin",
        # how often the scheduler resolves approvals whose response timeout has passed
        "AIRFLOW__SCHEDULER__TRIGGER_TIMEOUT_CHECK_INTERVAL": "1",
    }
    dag_files = (APPROVAL_DAGS, DAILY, *EXAMPLE_FILES)
    # unpaused after the backfill below is created
    with plan_cluster(base, dag_files, DAG_IDS, env=extra, home=home, unpause=False) as cluster:
        state = Env(cluster, passwords, base / "calls", base / "reports")
        # First, while the database is quiet (SQLite refuses a backfill under concurrent writes): three
        # daily runs at 00:00 UTC of the last three days, each reporting on the day before it.
        today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        first, last = today - timedelta(days=3), today - timedelta(days=1)
        create_backfill(cluster, FROZEN, first, last)
        state.backfill_days = [(first + timedelta(days=i - 1)).date().isoformat() for i in range(3)]
        for dag_id in DAG_IDS:
            cluster.unpause(dag_id)
        state.runs = {
            "reject": cluster.trigger("e2e_approval", {"goal": "purge"}),
            "approve": cluster.trigger("e2e_approval", {"goal": "purge"}),
            "timeout": cluster.trigger("e2e_approval_timeout", {"goal": "purge"}),
            "replan": cluster.trigger("e2e_approval_replan", {"goal": "purge"}),
            "example": cluster.trigger(EXAMPLE, {"goal": GOAL}),
            "fast": cluster.trigger("e2e_approval", {"goal": "purge"}),
            "frozen_conf": cluster.trigger(FROZEN, {"plan": FOREIGN_PLAN}),
        }
        yield state


# --------------------------------------------------------------------------------------------- helpers


def create_backfill(cluster: AirflowCluster, dag_id: str, first: datetime, last: datetime) -> None:
    """``POST /api/v2/backfills`` for runs from ``first`` to ``last``, tried again while SQLite is busy."""
    body = {
        "dag_id": dag_id,
        "from_date": first.isoformat(),
        "to_date": last.isoformat(),
        "max_active_runs": 3,
    }
    for _ in range(20):
        try:
            cluster.api("POST", "/backfills", body)
            return
        except AirflowApiError as error:
            if error.status != 503:
                raise
            time.sleep(1)
    cluster.api("POST", "/backfills", body)


def hitl_path(dag_id: str, run_id: str) -> str:
    return f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/approve/-1/hitlDetails"


def wait_for_request(env: Env, dag_id: str, run_id: str, timeout: float = RUN_TIMEOUT) -> dict[str, Any]:
    """The approval request of a run, once its approve task waits for an answer."""
    deadline = time.monotonic() + timeout
    parked = f"TaskInstance Finished: dag_id={dag_id}, task_id=approve, run_id={run_id},"
    while time.monotonic() < deadline:
        try:
            states = {t["task_id"]: t["state"] for t in env.cluster.task_instances(dag_id, run_id)}
        except AirflowApiError as error:  # a replan run the parent has not started yet, or a busy server
            if error.status != 404 and not error.busy:
                raise
            states = {}
        # Airflow 3.3 fails a task resumed (same try) before the scheduler has processed the executor's
        # "success" for the process that parked it (scheduler_job_runner: "state changed externally"),
        # so answer only once the scheduler has logged that event: a person never answers that fast.
        if (
            states.get(APPROVE_TASK) == "awaiting_input"
            and parked in env.cluster.log_path("scheduler").read_text()
        ):
            return env.cluster.request("GET", hitl_path(dag_id, run_id))
        assert states.get(APPROVE_TASK) not in ("success", "failed", "skipped", "upstream_failed"), states
        time.sleep(0.5)
    raise AssertionError(f"{dag_id}/{run_id} never asked for approval: {env.cluster.diagnostics()}")


def answer(env: Env, user: str, dag_id: str, run_id: str, option: str) -> tuple[int, Any]:
    """Answer a run's approval request as ``user``. SQLite allows one writer: under this module's load
    the API may answer 500 "database is locked" (the answer rolled back); that is tried again, and a
    409 after it means an earlier try was stored after all."""
    for attempt in range(10):
        status, body = env.as_user(user, "PATCH", hitl_path(dag_id, run_id), {"chosen_options": [option]})
        if status == 409 and attempt:
            return 200, body
        if not locked(status, str(body)):
            return status, body
        time.sleep(1)
    return status, body


def finish(env: Env, dag_id: str, run_id: str) -> tuple[str, dict[str, Any]]:
    state = env.cluster.wait_for_run(dag_id, run_id, timeout=RUN_TIMEOUT)
    result = env.cluster.session_result(dag_id, run_id)
    assert result is not None, env.cluster.diagnostics()
    return state, result.model_dump(mode="json")


# ----------------------------------------------------------------------------------------------- tests


def test_rejected_plan_runs_no_node_and_fails_rejected(env: Env) -> None:
    dag_id, run_id = "e2e_approval", env.runs["reject"]
    request = wait_for_request(env, dag_id, run_id)
    assert request["options"] == ["Approve", "Reject"]
    assert [user["id"] for user in request["assigned_users"]] == ["alice"]
    assert "purge stale rows" in request["body"] and "payments_stale" in request["body"]
    assert SECRET not in json.dumps(request) and '"api_token": "***"' in request["body"]
    assert env.calls_of(dag_id, run_id) == []  # nothing ran while waiting

    status, _ = answer(env, "mallory", dag_id, run_id, "Approve")
    assert status == 403  # not an approver
    status, body = answer(env, "alice", dag_id, run_id, "Reject")
    assert status == 200, body

    state, result = finish(env, dag_id, run_id)
    assert state == "failed"
    assert (result["status"], result["reason"]) == ("failed", "rejected")
    [approval] = result["approvals"]
    assert (approval["status"], approval["responded_by"], approval["nodes"]) == ("rejected", "alice", ["2"])
    assert approval["approvers"] == ["alice"] and not approval["timed_out"]
    assert [e["type"] for e in result["events"] if e["type"].startswith("approval.")] == ["approval.rejected"]
    assert env.calls_of(dag_id, run_id, "purge") == [] and env.calls_of(dag_id, run_id) == []
    tis = env.cluster.task_instances(dag_id, run_id)
    # the approval task's state says what happened: it ends failed, and the node tasks after it do not run
    assert {t["task_id"]: t["state"] for t in tis if t["map_index"] == -1}[APPROVE_TASK] == "failed"
    assert not [t for t in tis if t["task_id"].startswith(NODES_TASK) and t["state"] == "success"]


def test_approved_plan_completes(env: Env) -> None:
    dag_id, run_id = "e2e_approval", env.runs["approve"]
    wait_for_request(env, dag_id, run_id)
    status, body = answer(env, "alice", dag_id, run_id, "Approve")
    assert status == 200, body

    state, result = finish(env, dag_id, run_id)
    assert state == "success", env.cluster.diagnostics()
    assert (result["status"], result["reason"]) == ("completed", "goal_met")
    [approval] = result["approvals"]
    assert (approval["status"], approval["responded_by"], approval["nodes"]) == ("granted", "alice", ["2"])
    assert any(e["type"] == "approval.granted" for e in result["events"])
    assert len(env.calls_of(dag_id, run_id, "purge")) == 1 and result["outputs"]["2"] == {"purged": 3}


def test_an_approval_answered_as_soon_as_the_request_appears_completes(env: Env) -> None:
    """Answered as soon as the request appears (no wait for the scheduler), as a quick user or a script
    would: the session completes. Airflow 3.3 may fail the try that took so quick an answer (the
    scheduler had not processed the end of the process that parked it: "state changed externally");
    the approve task then retries and asks again, and the answer to that request lets the session go
    on. Each request is answered as soon as the test sees it; how long the answer took to go through
    (the API server's own time included) is printed, not asserted: the machine sets it."""
    dag_id, run_id = "e2e_approval", env.runs["fast"]
    answered: list[tuple[int, float]] = []  # (try of the approve task, seconds from seen to answered)
    deadline = time.monotonic() + RUN_TIMEOUT
    while time.monotonic() < deadline:
        try:
            [approve] = [
                t for t in env.cluster.task_instances(dag_id, run_id) if t["task_id"] == APPROVE_TASK
            ]
            run_state = env.cluster.get_run(dag_id, run_id)["state"]
        except (AirflowApiError, ValueError) as error:
            if isinstance(error, AirflowApiError) and not error.busy:
                raise
            time.sleep(0.05)
            continue
        if run_state in ("success", "failed"):
            break
        asked = approve["state"] == "awaiting_input" and approve["try_number"] not in dict(answered)
        if asked:
            appeared = time.monotonic()
            status, body = answer(env, "alice", dag_id, run_id, "Approve")
            assert status == 200, body
            answered.append((approve["try_number"], time.monotonic() - appeared))
        time.sleep(0.05)
    print(f"\n[e2e] approvals answered (try, seconds from seen to answered): {answered}")
    assert answered and [t for t, _seconds in answered] == sorted({t for t, _seconds in answered}), answered

    state, result = finish(env, dag_id, run_id)
    assert state == "success", env.cluster.diagnostics()
    assert (result["status"], result["reason"]) == ("completed", "goal_met")
    [approval] = result["approvals"]
    assert (approval["status"], approval["responded_by"]) == ("granted", "alice")
    assert len(env.calls_of(dag_id, run_id, "purge")) == 1


def test_a_frozen_dag_refuses_a_plan_given_in_the_conf(env: Env) -> None:
    """``daily_payment_report``'s docstring: each run executes exactly its own nodes, a conf plan is
    refused. The trigger form has only the step budget (no "Ready plan" field), and a run given a plan
    runs no tool."""
    details = env.cluster.api("GET", f"/dags/{FROZEN}/details")
    assert sorted(details["params"]) == ["max_steps"]
    assert "a conf that gives a plan is refused" in details["doc_md"]
    run_id = env.runs["frozen_conf"]
    state, result = finish(env, FROZEN, run_id)
    assert state == "failed"
    assert (result["status"], result["reason"]) == ("failed", "invalid_plan")
    assert "runs its own frozen plan" in result["message"]
    states = {(t["task_id"], t["map_index"]): t["state"] for t in env.cluster.task_instances(FROZEN, run_id)}
    assert states[(PLAN_TASK, -1)] == "failed"
    assert not [key for key, state in states.items() if key[0] == NODES_TASK and state == "success"], states


def test_approval_timeout_is_a_rejection(env: Env) -> None:
    dag_id, run_id = "e2e_approval_timeout", env.runs["timeout"]
    state, result = finish(env, dag_id, run_id)
    assert state == "failed"
    assert (result["status"], result["reason"]) == ("failed", "rejected")
    [approval] = result["approvals"]
    assert approval["status"] == "rejected" and approval["timed_out"] and approval["responded_by"] is None
    assert "no answer within" in result["message"]
    assert env.calls_of(dag_id, run_id) == []


def test_replan_asks_again_for_its_new_risky_node_only(env: Env) -> None:
    dag_id, root = "e2e_approval_replan", env.runs["replan"]
    first = wait_for_request(env, dag_id, root)
    assert "Node 2: purge stale rows" in first["body"] and "Node 3" not in first["body"]
    assert answer(env, "alice", dag_id, root, "Approve")[0] == 200
    child = f"{root}__replan_1"
    second = wait_for_request(env, dag_id, child)
    assert "Node 3: tell the owners" in second["body"] and "### Node 2" not in second["body"]
    assert answer(env, "alice", dag_id, child, "Approve")[0] == 200

    state, result = finish(env, dag_id, root)
    assert state == "success", env.cluster.diagnostics()
    assert [(a["revision"], a["nodes"], a["status"]) for a in result["approvals"]] == [
        (0, ["2"], "granted"),
        (1, ["3"], "granted"),
    ]
    assert result["revisions"][0]["diff"]["added"] == ["3"]
    assert len(env.calls_of(dag_id, root, "purge")) == 1 and len(env.calls_of(dag_id, root, "notify")) == 1


def test_freeze_through_the_rest_api_writes_the_committed_example(env: Env, tmp_path: Path) -> None:
    root = env.runs["example"]
    state, result = finish(env, EXAMPLE, root)
    assert state == "success" and result["usage"]["replans"] == 1
    output = tmp_path / "daily_payment_report.py"
    command = [sys.executable, "-m", "airflow_plan_provider.cli", "freeze", f"--api={env.cluster.base_url}"]
    command += [
        f"--source-dag={EXAMPLE}",
        f"--source-run={root}",
        "--user=alice",
        *FREEZE_ARGS,
        "-o",
        str(output),
    ]
    # the dags folder on the path, as in Airflow: --tools plan_demo.tools:registry is imported
    tools_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "dags")])}
    child_env = {**tools_env, "AIRFLOW_PLAN_API_PASSWORD": env.passwords["alice"]}
    done = subprocess.run(command, capture_output=True, text=True, env=child_env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr

    text = output.read_text()
    assert env.passwords["alice"] not in text and "- **Revision:** 1, after 1 replan(s); it ran as" in text
    made = env.cluster.get_run(EXAMPLE, root)["run_after"][:10]
    assert f"- **Frozen from:** run {root} of DAG {EXAMPLE}, made on\n  {made} (a run of" in text
    assert f"it ran as {root}__replan_1\n" in text

    def without_run_ids(dag_file: str) -> str:
        return re.sub(r"manual__[0-9T:.+\-]+|made on\n  \d{4}-\d{2}-\d{2}", "<run>", dag_file)

    assert without_run_ids(text) == without_run_ids(DAILY.read_text())

    # a session that did not complete is not frozen; nor is one read without credentials
    rejected = env.runs["reject"]
    env.cluster.wait_for_run("e2e_approval", rejected, timeout=RUN_TIMEOUT)
    refused = [
        *command[:5],
        "--source-dag=e2e_approval",
        f"--source-run={rejected}",
        "--user=alice",
        *FREEZE_ARGS,
    ]
    done = subprocess.run(refused, capture_output=True, text=True, env=child_env, timeout=120, check=False)
    assert done.returncode == 1 and "ended failed (rejected)" in done.stderr, done.stderr
    anonymous = [*command[:5], f"--source-dag={EXAMPLE}", f"--source-run={root}", *FREEZE_ARGS]
    done = subprocess.run(anonymous, capture_output=True, text=True, env=tools_env, timeout=120, check=False)
    assert done.returncode == 1 and "HTTP 401 (give --token or --user)" in done.stderr, done.stderr


def test_backfill_of_three_days_writes_three_reports(env: Env) -> None:
    cluster = env.cluster
    deadline = time.monotonic() + RUN_TIMEOUT
    runs: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        runs = [r for r in cluster.list_runs(FROZEN) if r["run_type"] == "backfill"]
        if len(runs) == 3 and all(r["state"] in ("success", "failed") for r in runs):
            break
        time.sleep(1)
    assert sorted(r["state"] for r in runs) == ["success"] * 3, (runs, cluster.diagnostics())
    for run in runs:
        result = cluster.session_result(FROZEN, run["dag_run_id"])
        assert result is not None and result.status == "completed"
    reports = {day: sorted(env.reports.glob(f"{day}_{FROZEN}_*.md")) for day in env.backfill_days}
    assert {day: len(files) for day, files in reports.items()} == dict.fromkeys(env.backfill_days, 1)
    for day, [report] in reports.items():
        assert f"payment-api latency on {day}" in report.read_text()
