"""Per-tool pools: nodes whose tool declares an Airflow pool run in node tasks built with that pool.

In-process (dag.test on SQLite): a plan mixing pooled and unpooled nodes, with references across lanes,
runs to the same result as without pools, and each node's task instance has its tool's pool.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from airflow_plan_provider import NodeExecution
from airflow_plan_provider.contract import (
    FINALIZE_TASK,
    NODES_TASK,
    PLAN_KEY,
    PLAN_TASK,
    SESSION_KEY,
    dag_lanes,
    lane_of,
    lane_task_id,
    node_location,
    node_tasks,
    select_task_id,
)
from airflow_plan_provider.plan.session import RunContext, SessionState
from airflow_plan_provider.plan.validate import validate_plan
from airflow_plan_provider.testing import CallLog, ScriptedPlanner, ScriptedTool, scripted_registry
from airflow_plan_provider.testing.in_process import run_plan_dag, run_session
from airflow_plan_provider.tools.tool import Tool
from airflow_plan_provider.triggers.parents import ParentsFinishedTrigger, parent_states
from tests.airflow.support import xcom

API = "rate_limited_api"
HEAVY_LANE = f"{API}__x2"

# layer 0: a, c (pooled), d (pooled, two slots), b; layer 1: e (unpooled, reads a pooled parent) and
# f (pooled, reads an unpooled parent); layer 2: g reads nodes of every lane
MIXED_PLAN = {
    "goal": "mixed lanes",
    "nodes": [
        {"id": "a", "action": "fetch one", "tool": "fetch", "params": {"n": 1}},
        {"id": "b", "action": "compute locally", "tool": "local", "params": {"x": 3}},
        {"id": "c", "action": "fetch two", "tool": "fetch", "params": {"n": 2}},
        {"id": "d", "action": "heavy export", "tool": "heavy", "params": {"rows": 10}},
        {
            "id": "e",
            "action": "combine a and b",
            "tool": "combine",
            "params": {"left": "${a}", "right": "${b}"},
        },
        {"id": "f", "action": "fetch by b", "tool": "fetch", "params": {"n": "${b.x}"}},
        {
            "id": "g",
            "action": "combine everything",
            "tool": "combine",
            "params": {"left": "${e}", "right": ["${f}", "${c}", "${d}"]},
        },
    ],
}
EXPECTED_TASKS = {  # each lane's nodes in the plan's run order
    "nodes": ["b", "e", "g"],
    lane_task_id(API): ["a", "c", "f"],
    lane_task_id(HEAVY_LANE): ["d"],
}


def tools(log: CallLog, pooled: bool = True, **overrides: dict[str, Any]) -> list[ScriptedTool]:
    spec: dict[str, dict[str, Any]] = {
        "fetch": {"returns": lambda p: {"fetched": p["n"]}, "pool": API},
        "heavy": {"returns": lambda p: {"rows": p["rows"]}, "pool": API, "pool_slots": 2},
        "local": {"returns": lambda p: {"x": p["x"] * 2}},
        "combine": {"returns": lambda p: {"left": p["left"], "right": p["right"]}},
    }
    for name, change in overrides.items():
        spec[name] = {**spec[name], **change}
    if not pooled:
        spec = {
            name: {k: v for k, v in s.items() if k not in ("pool", "pool_slots")} for name, s in spec.items()
        }
    return [ScriptedTool(name, log=log, **kwargs) for name, kwargs in spec.items()]


def build(dag_id: str, log: CallLog, plan_: Any = MIXED_PLAN, pooled: bool = True, **options: Any) -> Any:
    from airflow_plan_provider.dag_factory import build_plan_dag

    overrides = options.pop("overrides", {})
    planner = options.pop("planner", None) or ScriptedPlanner(plan_)
    options.setdefault("execution", NodeExecution(retry_delay=timedelta(0)))
    options.setdefault("replan", False)
    registry = scripted_registry(*tools(log, pooled, **overrides))
    return build_plan_dag(dag_id, planner=planner, tools=registry, **options)


def node_tis(run: Any) -> dict[str, Any]:
    """Plan node id → its task instance (task id, map index, pool, pool slots, state)."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        tis = session.query(TaskInstance).filter_by(dag_id=run.dag_id, run_id=run.run_id).all()
        return {
            ti.rendered_map_index.split(" · ")[0]: {
                "task_id": ti.task_id,
                "map_index": ti.map_index,
                "pool": ti.pool,
                "pool_slots": ti.pool_slots,
                "state": str(ti.state),
                "label": ti.rendered_map_index,
            }
            for ti in tis
            if ti.map_index >= 0
        }


@pytest.fixture(scope="module")
def pools() -> None:
    """The pools the pooled tools name (dag.test does not need them; a scheduler would)."""
    from tests.airflow.support import migrate_db

    migrate_db()
    from airflow.models.pool import Pool

    for name in (API, "plan_nodes"):
        Pool.create_or_update_pool(name, slots=3, description="test", include_deferred=False)


def outcome(run: Any) -> tuple[str, str, dict[str, Any], dict[str, str]]:
    result = xcom(run, FINALIZE_TASK)
    statuses = {r["node_id"]: r["status"] for r in result["history"]}
    return result["status"], result["reason"], result["outputs"], statuses


# ---------------------------------------------------------------------------------------------- pure


def session(plan: Any) -> RunContext:
    lanes = {"a": API, "c": API, "f": API, "d": HEAVY_LANE}
    return RunContext(lanes={n: lane for n, lane in lanes.items() if n in plan.node_ids})


def test_node_tasks_put_each_pooled_node_in_its_lane_and_every_reader_locates_it_there() -> None:
    plan = validate_plan(MIXED_PLAN)
    state = session(plan)
    assert node_tasks(plan, state) == EXPECTED_TASKS
    for task_id, nodes in EXPECTED_TASKS.items():
        for index, node in enumerate(nodes):
            assert node_location(plan, state, node) == (task_id, index)
    # without lanes, every node is in ``nodes``, in run order: a parent's map index is below its child's,
    # and in a layer the node with more descendants comes first (b: e, f and g; a: e and g)
    assert node_tasks(plan, RunContext()) == {"nodes": ["b", "a", "c", "d", "e", "f", "g"]}
    assert node_location(plan, RunContext(), "f") == (NODES_TASK, 5)


def test_lanes_come_from_each_tools_pool_and_slots(tmp_path: Any) -> None:
    log = CallLog(tmp_path)
    registry = scripted_registry(*tools(log))
    assert {name: lane_of(tool) for name, tool in registry.items()} == {
        "fetch": API,
        "heavy": HEAVY_LANE,
        "local": None,
        "combine": None,
    }
    assert list(dag_lanes(registry.values())) == [API, HEAVY_LANE]
    # two (pool, slots) pairs that would name the same tasks are refused, naming both tools
    clash = [
        ScriptedTool("x", log=log, pool="api", pool_slots=2).as_tool(),
        ScriptedTool("y", log=log, pool="api__x2").as_tool(),
    ]
    with pytest.raises(ValueError, match=r"'x' \(pool 'api', 2 slot\(s\)\) and 'y' \(pool 'api__x2'"):
        dag_lanes(clash)


@pytest.mark.parametrize(
    ("pool", "slots", "message"),
    [
        ("has space", 1, r"tool 't': pool 'has space' must be 1 to 100 letters"),
        ("", 1, r"tool 't': pool '' must be"),
        ("a/b", 1, r"pool 'a/b' must be"),
        ("api", 0, r"tool 't': pool_slots must be an integer >= 1, got 0"),
        ("api", True, r"pool_slots must be an integer >= 1, got True"),
        (None, 2, r"tool 't': pool_slots needs a pool"),
    ],
)
def test_a_tool_pool_must_be_usable_in_task_ids(pool: Any, slots: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Tool(name="t", description="", func=lambda: None, args_schema={}, pool=pool, pool_slots=slots)


def test_registry_decorator_declares_the_pool_and_the_digest_changes_only_with_one() -> None:
    from airflow_plan_provider.tools.registry import ToolRegistry

    plain, pooled = ToolRegistry(), ToolRegistry()

    def search(query: str) -> list[str]:
        return [query]

    plain.tool(search)
    pooled.tool(search, pool="ticket_api", pool_slots=2)
    assert (pooled["search"].pool, pooled["search"].pool_slots) == ("ticket_api", 2)
    assert plain.digest() != pooled.digest()  # a pool changes the DAG's tasks: a new DAG version
    # a tool without a pool fingerprints as before pools existed (no new version for existing DAGs)
    assert "pool" not in plain["search"].fingerprint()
    assert plain.catalog() == pooled.catalog()  # planners are not shown pools


def test_parents_trigger_waits_on_several_tasks() -> None:
    trigger = ParentsFinishedTrigger(
        dag_id="d", run_id="r", parents={NODES_TASK: [0], lane_task_id(API): [1]}
    )
    assert trigger.serialize()[1] == {
        "dag_id": "d",
        "run_id": "r",
        "parents": {NODES_TASK: [0], lane_task_id(API): [1]},
        "poll_interval": 0.5,
        "checkpoints": {},
        "artifact_store": None,
        "free_deferral": False,
        "grandparents": None,
        "run_slots": None,
        "seen_far": False,
    }
    states = {
        "r": {f"{NODES_TASK}_0": "success", f"{lane_task_id(API)}_1": "running", f"{NODES_TASK}_1": "failed"}
    }
    assert parent_states(states, "r", trigger.parents) == ["success", "running"]
    assert parent_states(states, "other run", trigger.parents) == [None, None]


# ------------------------------------------------------------------------------------ DAG structure


def test_without_pooled_tools_the_dag_has_the_same_tasks_as_ever(tmp_path: Any) -> None:
    dag = build("no_pools_shape", CallLog(tmp_path), pooled=False, execution=NodeExecution(pool="plan_nodes"))
    assert sorted(dag.task_ids) == [FINALIZE_TASK, NODES_TASK, PLAN_TASK]


def test_pooled_tools_add_one_lane_task_with_the_tools_pool(tmp_path: Any) -> None:
    dag = build(
        "pools_shape", CallLog(tmp_path), execution=NodeExecution(pool="plan_nodes", max_active_nodes=4)
    )
    lanes = [NODES_TASK, lane_task_id(API), lane_task_id(HEAVY_LANE)]
    selects = [select_task_id(task) for task in lanes[1:]]
    assert sorted(dag.task_ids) == sorted([PLAN_TASK, FINALIZE_TASK, *lanes, *selects])
    default, api, heavy = (dag.get_task(task_id) for task_id in lanes)
    # the DAG's pool covers the nodes whose tool has none; a tool's own pool wins for its nodes
    assert (default.partial_kwargs["pool"], default.partial_kwargs["pool_slots"]) == ("plan_nodes", 1)
    assert (api.partial_kwargs["pool"], api.partial_kwargs["pool_slots"]) == (API, 1)
    assert (heavy.partial_kwargs["pool"], heavy.partial_kwargs["pool_slots"]) == (API, 2)
    for task in (default, api, heavy):
        assert task.partial_kwargs["max_active_tis_per_dagrun"] == 4
    assert default.upstream_task_ids == {PLAN_TASK}
    # each pool lane maps over its own select task, which runs beside the default lane
    for task_id in lanes[1:]:
        select = dag.get_task(select_task_id(task_id))
        assert select.node_task == task_id
        assert dag.get_task(task_id).upstream_task_ids == {PLAN_TASK, select.task_id}
        assert select.upstream_task_ids == {PLAN_TASK}
    assert dag.get_task(FINALIZE_TASK).upstream_task_ids == {PLAN_TASK, *lanes}


# ------------------------------------------------------------------------------------ runs in-process


@pytest.mark.airflow
def test_pooled_nodes_run_in_their_pools_with_the_same_result_as_without(tmp_path: Any, pools: None) -> None:
    """dag.test runs one task instance at a time, in any order: a node whose parent (in its lane or
    another) has not run yet makes way (reschedules itself) and runs after it."""
    plain_log, pooled_log = CallLog(tmp_path / "plain"), CallLog(tmp_path / "pooled")
    plain = run_plan_dag(
        build("lanes_plain", plain_log, pooled=False, execution=NodeExecution(pool="plan_nodes"))
    )
    pooled = run_plan_dag(build("lanes_pooled", pooled_log, execution=NodeExecution(pool="plan_nodes")))

    assert str(pooled.state) == str(plain.state) == "success"
    assert outcome(pooled) == outcome(plain)
    status, reason, outputs, statuses = outcome(pooled)
    assert (status, reason) == ("completed", "goal_met")
    assert statuses == dict.fromkeys("abcdefg", "success")
    assert outputs["g"] == {
        "left": {"left": {"fetched": 1}, "right": {"x": 6}},
        "right": [{"fetched": 6}, {"fetched": 2}, {"rows": 10}],
    }
    assert {n: pooled_log.count(node=n) for n in "abcdefg"} == dict.fromkeys("abcdefg", 1)

    tis = node_tis(pooled)
    assert {n: (ti["task_id"], ti["map_index"]) for n, ti in tis.items()} == {
        node: (task_id, index)
        for task_id, nodes in EXPECTED_TASKS.items()
        for index, node in enumerate(nodes)
    }
    assert {n: (ti["pool"], ti["pool_slots"]) for n, ti in tis.items()} == {
        "a": (API, 1),
        "c": (API, 1),
        "f": (API, 1),
        "d": (API, 2),
        "b": ("plan_nodes", 1),
        "e": ("plan_nodes", 1),
        "g": ("plan_nodes", 1),
    }
    plan_ = validate_plan(MIXED_PLAN)
    assert {n: ti["label"] for n, ti in tis.items()} == {
        n: f"{n} · {plan_.node(n).action}" for n in "abcdefg"
    }
    assert {ti["pool"] for ti in node_tis(plain).values()} == {"plan_nodes"}
    # the planning task recorded the lanes in the session it published
    assert xcom(pooled, PLAN_TASK, key=SESSION_KEY)["lanes"] == {
        "a": API,
        "c": API,
        "f": API,
        "d": HEAVY_LANE,
    }


@pytest.mark.airflow
def test_a_failed_pooled_node_skips_its_dependents_in_other_lanes_and_a_replan_reuses_pooled_outputs(
    tmp_path: Any, pools: None
) -> None:
    log = CallLog(tmp_path)
    revision = {  # c is replaced by c2 (a new id: the tool fails for node c), g reads c2
        "nodes": [
            {"id": "c2", "action": "fetch two again", "tool": "fetch", "params": {"n": 22}},
            {**MIXED_PLAN["nodes"][6], "params": {"left": "${e}", "right": ["${f}", "${c2}", "${d}"]}},
        ],
    }
    planner = ScriptedPlanner(MIXED_PLAN, on_error=[("404", revision)])
    dag = build(
        "lanes_replan",
        log,
        planner=planner,
        replan=True,
        execution=NodeExecution(retries=0),
        overrides={"fetch": {"permanent": "404", "fail_nodes": ["c"]}},
    )
    first, second = run_session(dag, {"goal": "mixed lanes"}).runs
    states = {n: ti["state"] for n, ti in node_tis(first).items()}
    assert states == {
        "a": "success",
        "b": "success",
        "c": "failed",
        "d": "success",
        "e": "success",
        "f": "success",
        "g": "skipped",
    }

    result = xcom(second, FINALIZE_TASK)
    assert (result["status"], result["reason"]) == ("completed", "goal_met")
    again = node_tis(second)
    assert {n: ti["pool"] for n, ti in again.items()} == {
        "a": API,
        "c2": API,
        "d": API,
        "f": API,
        "b": "default_pool",
        "e": "default_pool",
        "g": "default_pool",
    }
    assert xcom(second, PLAN_TASK, key=SESSION_KEY)["lanes"] == {
        "a": API,
        "c2": API,
        "d": HEAVY_LANE,
        "f": API,
    }
    records = {r["node_id"]: r for r in result["history"] if r["revision"] == 1}
    assert {n for n, r in records.items() if r.get("reused")} == set("abdef")
    assert log.count(node="a") == 1 and log.count(node="f") == 1  # locked pooled nodes were not called again
    assert result["outputs"]["c2"] == {"fetched": 22}
    assert result["revisions"][0]["diff"] == {"removed": ["c"], "added": ["c2"], "revised": ["g"]}
    assert result["outputs"]["g"]["right"] == [{"fetched": 6}, {"fetched": 22}, {"rows": 10}]


@pytest.mark.airflow
def test_a_pool_the_dag_has_no_lane_for_fails_planning_naming_node_tool_and_pool(
    tmp_path: Any, pools: None
) -> None:
    """The registry changed since the DAG was parsed: a pooled node must not run unprotected."""
    dag = build("lanes_missing", CallLog(tmp_path))
    dag.get_task(PLAN_TASK).lanes = [API]  # as if parsed before `heavy` took two slots
    run = run_plan_dag(dag)
    assert str(run.state) == "failed"
    result = xcom(run, FINALIZE_TASK)
    assert result["reason"] == "no_plan"
    assert "node d: tool 'heavy' declares pool 'rate_limited_api' (2 slot(s))" in result["message"]
    assert "this DAG has no node tasks for it" in result["message"]
    assert node_tis(run) == {}


def test_the_plan_view_finds_pooled_nodes_in_their_lane_tasks() -> None:
    from airflow_plan_provider.plugins.data import RunData, plan_view

    plan_ = validate_plan(MIXED_PLAN)
    state = SessionState(goal="mixed lanes", root_run_id="r", run_ids=["r"], lanes=session(plan_).lanes)
    run = RunData(run_id="r", state="running")
    run.xcoms[(PLAN_TASK, -1, PLAN_KEY)] = plan_.model_dump(mode="json", by_alias=True, exclude_none=True)
    run.xcoms[(PLAN_TASK, -1, SESSION_KEY)] = state.model_dump(mode="json")
    for task_id, nodes in EXPECTED_TASKS.items():
        for index, node in enumerate(nodes):
            run.tis[(task_id, index)] = {"state": f"state of {node}", "try_number": 1}
    shown = {node["id"]: node for node in plan_view("d", "r", [run])["runs"][0]["nodes"]}
    assert {n: (v["task_id"], v["map_index"], v["state"]) for n, v in shown.items()} == {
        node: (task_id, index, f"state of {node}")
        for task_id, nodes in EXPECTED_TASKS.items()
        for index, node in enumerate(nodes)
    }
