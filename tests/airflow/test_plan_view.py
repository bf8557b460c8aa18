"""The plan view's data: a session's runs read from Airflow's database and assembled for the page, and the
routes' auth. The end-to-end browser test (tests/e2e/test_plan_view_browser.py) draws the same data."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from airflow_plan_provider import NodeExecution
from airflow_plan_provider.contract import (
    FINALIZE_TASK,
    NODE_KEY,
    NODES_TASK,
    PLAN_KEY,
    PLAN_TASK,
    REPLAN_CONF_KEY,
    SESSION_KEY,
)
from airflow_plan_provider.plan.events import EventSource, make_event
from airflow_plan_provider.plan.result import Revision
from airflow_plan_provider.plan.session import SessionState, replan_run_id
from airflow_plan_provider.plan.validate import validate_plan
from airflow_plan_provider.plugins.data import RunData, plan_view, session_chain
from airflow_plan_provider.testing import CallLog, scripted_registry
from airflow_plan_provider.testing.in_process import run_session
from harness.seed import seed_replan_story
from tests.airflow.support import task_states

SEED_DAG = "view_seed_replan"


def seed_dag(dag_id: str, log: CallLog):
    from airflow_plan_provider.dag_factory import build_plan_dag

    planner, tools = seed_replan_story(log, optional_4_to_5=True)
    return build_plan_dag(
        dag_id,
        planner=planner,
        tools=scripted_registry(*tools),
        execution=NodeExecution(retries=0, retry_delay=timedelta(seconds=0)),
    )


@pytest.fixture(scope="module")
def seed_session(tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    log = CallLog(tmp_path_factory.mktemp("calls"))
    return run_session(seed_dag(SEED_DAG, log), {"goal": "find why the payment API got slow"}).runs


def load(dag_id: str, run_id: str) -> list[RunData] | None:
    from airflow.utils.session import create_session

    from airflow_plan_provider.plugins.store import load_chain

    with create_session() as session:
        return load_chain(session, dag_id, run_id)


def by_id(run_view: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {node["id"]: node for node in run_view["nodes"]}


# ---------------------------------------------------------------------- from Airflow's database


@pytest.mark.airflow
def test_seed_session_from_the_database(seed_session):
    root, child = seed_session
    chain = load(SEED_DAG, root.run_id)
    assert chain is not None and [run.run_id for run in chain] == [root.run_id, child.run_id]
    view = plan_view(SEED_DAG, root.run_id, chain, ui_base="/ui", view_base="/pv")
    assert view["root_run_id"] == root.run_id and view["finished"] is True
    assert view["goal"] == "find why the payment API got slow"
    assert view["outcome"]["status"] == "completed" and view["outcome"]["reason"] == "goal_met"

    first, second = view["runs"]
    assert (first["revision"], second["revision"]) == (0, 1)
    assert first["parent_run_id"] is None and first["child_run_id"] == child.run_id
    assert second["parent_run_id"] == root.run_id and second["child_run_id"] is None
    assert (
        first["view_url"] == f"/pv/dags/{SEED_DAG}/runs/{root.run_id.replace(':', '%3A').replace('+', '%2B')}"
    )
    assert second["ui_url"].startswith(f"/ui/dags/{SEED_DAG}/runs/")

    # the node states are the task instances' states, read through the plan's layers
    states = task_states(root)
    nodes = by_id(first)
    assert first["layers"] == [["1", "2", "3", "4"], ["5"], ["6"]]
    for node in nodes.values():
        assert node["state"] == states[f"{node['task_id']}[{node['map_index']}]"], node["id"]
    assert {n: nodes[n]["state"] for n in nodes} == dict.fromkeys("1234", "success") | {
        "5": "skipped",
        "6": "skipped",
    }
    assert nodes["3"]["replan_requested"] and "no deploys" in nodes["3"]["error"]
    assert nodes["1"]["output_summary"] == '{"p99": 870}' and nodes["1"]["attempts"] == 1
    assert nodes["1"]["hostname"] and nodes["1"]["task_seconds"] is not None
    # one duration per node, the tool call's: the record's, its outcome event's and the view's
    record = chain[0].records["1"]
    [succeeded] = [e for e in record["events"] if e["type"] == "node.succeeded"]
    assert nodes["1"]["duration_s"] == record["duration_s"] == succeeded["data"]["duration_s"] is not None
    assert 0 <= nodes["1"]["waited_s"] <= nodes["1"]["task_seconds"]
    assert nodes["1"]["duration_s"] <= nodes["1"]["task_seconds"]
    assert {(e["from"], e["to"], e["optional"]) for e in first["edges"]} >= {
        ("4", "5", True),
        ("1", "5", False),
    }
    assert first["replanned"] and first["result"]["status"] == "replanned"
    assert first["diff"] is None and first["reason"] is None

    revised = by_id(second)
    assert second["diff"] == {"removed": [], "added": [], "revised": ["5"]}
    assert "no deploys" in second["reason"] and second["trigger_node"] == "3"
    assert {n: revised[n]["state"] for n in revised} == dict.fromkeys("123456", "success")
    assert [n for n in revised if revised[n]["reused"]] == ["1", "2", "3", "4"]
    assert revised["5"]["diff"] == "revised" and revised["6"]["diff"] is None
    assert revised["5"]["params"] == {"latency": "${1}", "health": "${2}"}
    [change] = second["changes"]  # what the revision changed in node 5, before -> after
    assert change["id"] == "5" and change["changed"]["params"]["after"] == {
        "latency": "${1}",
        "health": "${2}",
    }
    assert change["changed"]["params"]["before"] != change["changed"]["params"]["after"]
    assert revised["5"]["resolved_params"] == {"latency": {"p99": 870}, "health": {"fraud-check": "degraded"}}
    assert second["result"]["status"] == "completed"


@pytest.mark.airflow
def test_every_run_of_the_session_opens_the_same_chain(seed_session):
    root, child = seed_session
    chain = load(SEED_DAG, child.run_id)
    assert chain is not None and [run.run_id for run in chain] == [root.run_id, child.run_id]
    assert plan_view(SEED_DAG, child.run_id, chain)["run_id"] == child.run_id
    assert load(SEED_DAG, "no_such_run") is None


# ---------------------------------------------------------------------- assembled from plain data


def planned(run_id: str, plan: dict[str, Any], session: SessionState, **xcoms: Any) -> RunData:
    """A run as the planning task leaves it: its plan and session XComs."""
    validated = validate_plan(plan)
    session.current_plan = validated.as_plan().to_json_dict()
    data = RunData(run_id=run_id, state="success")
    data.xcoms[(PLAN_TASK, -1, PLAN_KEY)] = validated.model_dump(
        mode="json", by_alias=True, exclude_none=True
    )
    data.xcoms[(PLAN_TASK, -1, SESSION_KEY)] = session.model_dump(mode="json")
    for key, value in xcoms.items():
        task_id, xcom_key = key.split("__")
        data.xcoms[(task_id, -1, xcom_key)] = value
    return data


def two_revisions() -> dict[str, RunData]:
    first_plan = {
        "goal": "g",
        "nodes": [
            {"id": "a", "action": "fetch", "tool": "fetch", "params": {"api_key": "sk-live-123456", "n": 1}},
            {"id": "b", "action": "old step", "tool": "old", "params": {"x": "${a}"}},
        ],
    }
    second_plan = {
        "goal": "g",
        "nodes": [
            first_plan["nodes"][0],
            {"id": "c", "action": "new step", "tool": "new", "params": {"x": "${a.n}"}},
        ],
    }
    first, second = EventSource("d", "r", "r", 0), EventSource("d", "r__replan_1", "r", 1)
    root = SessionState(goal="g", root_run_id="r", run_ids=["r"])
    root.events = [
        make_event("planner.usage", first, prompt_tokens=100, completion_tokens=20),
        make_event("plan.created", first, attempts=1),
    ]
    child = SessionState(
        goal="g", root_run_id="r", parent_run_id="r", run_ids=["r", "r__replan_1"], revision=1
    )
    child.events = [
        *root.events,
        make_event("planner.usage", second, prompt_tokens=300, completion_tokens=50),
        make_event("planner.usage", second, prompt_tokens=310, completion_tokens=40),
        make_event("plan.diff", second, attempts=2),
    ]
    child.revisions.append(
        Revision.model_validate(
            {
                "revision": 1,
                "run_id": "r__replan_1",
                "reason": "node b failed: boom",
                "trigger_node": "b",
                "diff": {"removed": ["b"], "added": ["c"], "revised": []},
            }
        )
    )
    replan_conf = {"goal": "g", "session": {"revision": 1, "root_run_id": "r"}}
    runs = {
        "r": planned("r", first_plan, root, finalize__replan_conf=replan_conf),
        "r__replan_1": planned("r__replan_1", second_plan, child),
    }
    runs["r"].xcoms[(NODES_TASK, 0, NODE_KEY)] = {"node_id": "a", "status": "success", "output": {"n": 7}}
    runs["r__replan_1"].xcoms[(NODES_TASK, 0, NODE_KEY)] = {
        "node_id": "a",
        "status": "success",
        "reused": True,
        "output": {"n": 7},
    }
    return runs


def test_a_revision_shows_removed_added_and_why():
    from airflow_plan_provider.compat import redact

    runs = two_revisions()
    view = plan_view("d", "r__replan_1", session_chain("r__replan_1", runs), redact=redact)
    first, second = view["runs"]
    assert [n["id"] for n in first["nodes"]] == ["a", "b"]
    nodes = by_id(second)
    assert nodes["c"]["diff"] == "added" and nodes["b"]["diff"] == "removed" and nodes["a"]["diff"] is None
    assert nodes["b"]["state"] is None and nodes["b"]["layer"] == 1  # drawn where it was
    assert second["reason"] == "node b failed: boom" and second["trigger_node"] == "b"
    assert nodes["c"]["resolved_params"] == {"x": 7}
    assert nodes["a"]["params"] == {"api_key": "***", "n": 1}  # Airflow's secrets masker
    assert first["planner_calls"] == [
        {"prompt_tokens": 100, "completion_tokens": 20, "at": first["planner_calls"][0]["at"]}
    ]
    assert [(c["prompt_tokens"], c["completion_tokens"]) for c in second["planner_calls"]] == [
        (300, 50),
        (310, 40),
    ]
    assert (first["planner_attempts"], second["planner_attempts"]) == (1, 2)


def test_a_run_joins_the_chain_only_when_its_own_session_says_so():
    runs = two_revisions()
    # a run someone triggered with a replan run's id: its planning rejected the conf and started afresh
    forged = SessionState(goal="g", root_run_id="r__replan_1", run_ids=["r__replan_1"])
    runs["r__replan_1"].xcoms[(PLAN_TASK, -1, SESSION_KEY)] = forged.model_dump(mode="json")
    assert [run.run_id for run in session_chain("r", runs)] == ["r"]
    assert [run.run_id for run in session_chain("r__replan_1", runs)] == ["r__replan_1"]


def test_a_replan_run_not_planned_yet_joins_when_its_parent_prepared_it():
    runs = two_revisions()
    del runs["r__replan_1"].xcoms[(PLAN_TASK, -1, SESSION_KEY)]
    del runs["r__replan_1"].xcoms[(PLAN_TASK, -1, PLAN_KEY)]
    runs["r__replan_1"].state = "queued"
    chain = session_chain("r", runs)
    assert [run.run_id for run in chain] == ["r", "r__replan_1"]
    view = plan_view("d", "r", chain)
    assert view["finished"] is False and view["runs"][1]["plan_state"] == "pending"
    assert view["runs"][1]["revision"] == 1 and view["runs"][1]["nodes"] == []
    runs["r"].xcoms.pop((FINALIZE_TASK, -1, REPLAN_CONF_KEY))
    assert [run.run_id for run in session_chain("r", runs)] == ["r"]
    assert replan_run_id("r", 1) == "r__replan_1"


# ---------------------------------------------------------------------- the routes and their auth


@pytest.fixture(scope="module")
def api():
    """The plan view's app mounted in a FastAPI app with Airflow's auth manager, as the API server does."""
    from airflow.api_fastapi.app import init_auth_manager
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from airflow_plan_provider.plugins.app import URL_PREFIX, create_app

    app = FastAPI()
    app.mount(URL_PREFIX, create_app())
    manager = init_auth_manager(app)
    return TestClient(app), manager


def token(manager: Any) -> str:
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    return manager.generate_jwt(SimpleAuthManagerUser(username="viewer", role="viewer"))


@pytest.mark.airflow
def test_routes_refuse_requests_without_a_token(api, seed_session):
    client, _manager = api
    root = seed_session[0].run_id
    for path in (f"/plan-view/dags/{SEED_DAG}/runs/{root}", f"/plan-view/data/dags/{SEED_DAG}/runs/{root}"):
        assert client.get(path).status_code == 401, path
        bad = client.get(path, headers={"Authorization": "Bearer not-a-token"})
        assert bad.status_code in (401, 403), path
    assert client.get("/plan-view/docs").status_code == 404  # no unauthenticated extras
    assert client.get("/plan-view/openapi.json").status_code == 404


@pytest.mark.airflow
def test_routes_answer_a_signed_in_user(api, seed_session):
    client, manager = api
    root, child = seed_session
    headers = {"Authorization": f"Bearer {token(manager)}"}
    data = client.get(f"/plan-view/data/dags/{SEED_DAG}/runs/{child.run_id}", headers=headers)
    assert data.status_code == 200, data.text
    assert [run["run_id"] for run in data.json()["runs"]] == [root.run_id, child.run_id]
    assert data.json()["runs"][0]["view_url"].startswith(f"/plan-view/dags/{SEED_DAG}/runs/")
    # the Plan tab's links lead to the run's own page in the UI, with the tab open
    tab_url = data.json()["runs"][1]["tab_url"]
    assert tab_url.startswith(f"/dags/{SEED_DAG}/runs/") and tab_url.endswith("__replan_1/plugin/plan")

    page = client.get(f"/plan-view/dags/{SEED_DAG}/runs/{child.run_id}", headers=headers)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "frame-ancestors 'self'" in page.headers["content-security-policy"]
    assert f'"data_url": "/plan-view/data/dags/{SEED_DAG}/runs/' in page.text
    missing = client.get(f"/plan-view/data/dags/{SEED_DAG}/runs/nope", headers=headers)
    assert missing.status_code == 404


def test_page_config_cannot_close_its_script_element():
    from airflow_plan_provider.plugins.app import _script_json

    assert "</script>" not in _script_json({"run_id": "</script><script>alert(1)</script>"})


def test_nodes_take_their_state_from_the_nodes_task_in_layer_order():
    runs = two_revisions()
    root = runs["r"]
    root.tis[(NODES_TASK, 0)] = {"state": "success", "try_number": 1, "hostname": "worker-a"}
    root.tis[(NODES_TASK, 1)] = {"state": "deferred", "try_number": 1}
    nodes = by_id(plan_view("d", "r", [root])["runs"][0])
    assert (nodes["a"]["task_id"], nodes["a"]["map_index"], nodes["a"]["state"]) == (NODES_TASK, 0, "success")
    assert (nodes["b"]["state"], nodes["a"]["hostname"]) == ("deferred", "worker-a")


def test_a_node_waiting_for_its_parents_is_told_from_one_whose_tool_runs():
    """Both are "running" in Airflow: the view gives each node the provider's phase, naming the parents
    a waiting node waits for; a deferred node waits for its parents or polls its job."""
    root = two_revisions()["r"]
    root.state = "running"

    def phases(a: dict[str, Any], b: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
        root.tis[(NODES_TASK, 0)], root.tis[(NODES_TASK, 1)] = a, b
        nodes = by_id(plan_view("d", "r", [root])["runs"][0])
        return {n: (v["phase"], v["waiting_for"], v["waiting_where"], v["state"]) for n, v in nodes.items()}

    running = {"state": "running", "try_number": 1}
    assert phases(running, running) == {
        "a": ("running", [], None, "running"),
        "b": ("waiting", ["a"], "in its slot", "running"),
    }
    done = {"state": "success", "try_number": 1}
    assert phases(done, running)["b"] == ("running", [], None, "running")
    parked = {"state": "deferred", "try_number": 1, "next_method": "resume_after_parents"}
    assert phases(running, parked)["b"] == ("waiting", ["a"], "deferred", "deferred")
    polling = {"state": "deferred", "try_number": 1, "next_method": "resume_after_job"}
    assert phases(done, polling)["b"][0] == "polling"
    assert phases(done, {"state": "up_for_retry", "try_number": 1})["b"][0] == "retrying"


def test_the_plugin_is_registered_for_the_api_server():
    """Installed through the ``airflow.plugins`` entry point: Airflow loads it whatever
    ``[core] lazy_discover_providers`` says; the API server mounts its app and the UI shows its tab."""
    from importlib.metadata import entry_points

    from airflow_plan_provider.plugins.plugin import PlanViewPlugin

    found = [ep for ep in entry_points(group="airflow.plugins") if ep.name == "plan_view"]
    assert found and all(ep.load() is PlanViewPlugin for ep in found)
    plugin = PlanViewPlugin()
    [view] = plugin.external_views
    assert view["destination"] == "dag_run" and view["url_route"] == "plan"
    assert view["href"] == "/plan-view/dags/{DAG_ID}/runs/{RUN_ID}"
    [app] = plugin.fastapi_apps
    assert app["url_prefix"] == "/plan-view"
    assert {route.path for route in app["app"].routes} >= {
        "/dags/{dag_id}/runs/{run_id}",
        "/data/dags/{dag_id}/runs/{run_id}",
    }


def test_nodes_that_never_ran_are_shown_not_run_not_pending():
    root = two_revisions()["r"]
    root.state = "running"
    assert {n["state"] for n in plan_view("d", "r", [root])["runs"][0]["nodes"]} == {None}  # still to come
    root.tis[(NODES_TASK, -1)] = {"state": "upstream_failed"}  # ended before it expanded: a rejected approval
    assert {n["state"] for n in plan_view("d", "r", [root])["runs"][0]["nodes"]} == {"not_run"}
    del root.tis[(NODES_TASK, -1)]
    root.state = "failed"  # the run is over: a node without a state of its own never ran
    root.tis[(NODES_TASK, 0)] = {"state": "success", "try_number": 1}
    nodes = by_id(plan_view("d", "r", [root])["runs"][0])
    assert (nodes["a"]["state"], nodes["b"]["state"]) == ("success", "not_run")


def test_the_planner_is_named_only_for_a_plan_a_planner_was_asked_for():
    runs = two_revisions()
    first, second = plan_view("d", "r__replan_1", session_chain("r__replan_1", runs))["runs"]
    assert (first["plan_source"], second["plan_source"]) == ("planner", "planner")  # a replan asks too
    for source in ("conf", "dag"):
        root = two_revisions()["r"]
        session = root.xcoms[(PLAN_TASK, -1, SESSION_KEY)]
        session["events"] = [
            make_event("plan.created", EventSource("d", "r", "r", 0), attempts=1, source=source).model_dump(
                mode="json"
            )
        ]
        [view] = plan_view("d", "r", [root])["runs"]
        assert (view["plan_source"], view["planner_calls"]) == (source, [])
    root = two_revisions()["r"]
    root.xcoms[(PLAN_TASK, -1, SESSION_KEY)]["events"] = []  # not planned yet
    assert plan_view("d", "r", [root])["runs"][0]["plan_source"] is None


def test_a_revised_node_shows_what_changed_with_secrets_masked():
    from airflow_plan_provider.compat import redact

    runs = two_revisions()
    child = runs["r__replan_1"]
    plan = child.xcoms[(PLAN_TASK, -1, PLAN_KEY)]
    changed = next(n for n in plan["nodes"] if n["id"] == "a")
    changed["params"] = {"api_key": "sk-very-secret", "n": 2}
    changed["tool"] = "better"
    child.xcoms[(PLAN_TASK, -1, SESSION_KEY)]["revisions"][0]["diff"]["revised"] = ["a"]
    second = plan_view("d", "r__replan_1", session_chain("r__replan_1", runs), redact=redact)["runs"][1]
    assert second["changes"] == [
        {
            "id": "a",
            "changed": {
                "tool": {"before": "fetch", "after": "better"},
                "params": {"before": {"api_key": "***", "n": 1}, "after": {"api_key": "***", "n": 2}},
            },
        }
    ]


@pytest.mark.airflow
def test_a_document_a_node_wrote_opens_from_its_details_rendered_and_sandboxed(api, tmp_path):
    """A node whose output carries ``markdown`` (the demo's report): the view links to it, and the route
    renders it on a page that names the node, run and DAG, runs no script, and answers only a user."""
    from airflow_plan_provider.dag_factory import build_plan_dag
    from airflow_plan_provider.testing import ScriptedTool
    from airflow_plan_provider.testing.in_process import run_plan_dag

    text = "# Latency report\n\n| hour | p99 |\n| --- | --- |\n| 13 | 870 |\n\n<script>alert(1)</script>\n"
    log = CallLog(tmp_path)
    tools = scripted_registry(
        ScriptedTool("write", log=log, returns={"title": "t", "markdown": text}),
        ScriptedTool("read", log=log, returns={"rows": 3}),
    )
    plan = {
        "goal": "report",
        "nodes": [
            {"id": "1", "action": "read", "tool": "read"},
            {"id": "2", "action": "write", "tool": "write", "params": {}},
        ],
        "edges": [{"from": "1", "to": "2"}],
    }
    run = run_plan_dag(build_plan_dag("view_document", planner=None, tools=tools), {"plan": plan})
    client, manager = api
    headers = {"Authorization": f"Bearer {token(manager)}"}
    data = client.get(f"/plan-view/data/dags/view_document/runs/{run.run_id}", headers=headers).json()
    nodes = by_id(data["runs"][0])
    assert nodes["1"]["document_url"] is None
    url = nodes["2"]["document_url"]
    assert url.startswith("/plan-view/dags/view_document/runs/") and url.endswith("/nodes/2/markdown")

    assert client.get(url).status_code == 401
    page = client.get(url, headers=headers)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert policy.startswith("sandbox ") and "script-src" not in policy and "default-src 'none'" in policy
    assert "<h1>Latency report</h1>" in page.text and "<td>870</td>" in page.text
    assert f"Written by node 2 of run {run.run_id} of DAG view_document" in page.text
    assert client.get(url.replace("/nodes/2/", "/nodes/1/"), headers=headers).status_code == 404
