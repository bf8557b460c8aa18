"""Nodes started on the triggerer (``NodeExecution(start_on_triggerer=True)``): the DAG's shape, what it
serializes, what planning publishes for them, and the trigger they start with, in-process. A real
scheduler and triggerer starting them: ``tests/e2e/test_barrier_free.py``.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import pytest

from airflow_plan_provider import NodeExecution, airflow_features
from airflow_plan_provider.contract import (
    FINALIZE_TASK,
    NODES_TASK,
    PLACES_KEY,
    PLAN_TASK,
    RUN_CONTEXT_KEY,
    SESSION_KEY,
    NodeBrief,
    after_lane,
    briefs_key,
    lane_task_id,
    node_briefs,
    node_tasks,
    select_task_id,
)
from airflow_plan_provider.operators.node import _started_because
from airflow_plan_provider.plan.session import RunContext, RunSlots
from airflow_plan_provider.plan.validate import validate_plan
from airflow_plan_provider.testing import CallLog
from airflow_plan_provider.testing.in_process import run_plan_dag
from airflow_plan_provider.triggers.parents import ParentsFinishedTrigger
from airflow_plan_provider.triggers.start import NodeStartTrigger
from tests.airflow.support import xcom
from tests.airflow.test_pools import API, HEAVY_LANE, MIXED_PLAN, build, outcome
from tests.airflow.test_pools import pools as pools  # the fixture: the pools the pooled tools name

AFTER = lane_task_id(after_lane(None))  # the default lane's task started on the triggerer
STARTED = NodeExecution(
    max_active_nodes=None, pools_count_deferred=False, start_on_triggerer=True, retry_delay=timedelta(0)
)
needs_feature = pytest.mark.skipif(
    not airflow_features.starts_mapped_on_triggerer(),
    reason="this Airflow starts no mapped task instance on the triggerer (3.3 and later do)",
)


@pytest.mark.parametrize(
    ("change", "needed"),
    [
        ({"max_active_nodes": 5}, "max_active_nodes=None"),
        ({"pools_count_deferred": True}, "pools_count_deferred=False"),
        ({"timeout": timedelta(minutes=5)}, "timeout=None"),
        ({"start_on_triggerer": "yes"}, "must be a bool"),
    ],
)
def test_a_start_on_the_triggerer_that_would_hold_a_cap_a_pool_or_a_timeout_is_refused(
    change: dict[str, Any], needed: str
) -> None:
    settings = {"max_active_nodes": None, "pools_count_deferred": False, "start_on_triggerer": True}
    with pytest.raises(ValueError, match="start_on_triggerer") as refused:
        NodeExecution(**{**settings, **change})
    assert needed in str(refused.value)


@needs_feature
def test_each_lane_gets_a_task_started_on_the_triggerer_and_the_dag_serializes_it_field_by_field(
    tmp_path: Any,
) -> None:
    from airflow.serialization import serialized_objects

    serialization = getattr(serialized_objects, "DagSerialization", serialized_objects.SerializedDAG)
    dag = build("started_shape", CallLog(tmp_path), execution=STARTED)
    firsts = [NODES_TASK, lane_task_id(API), lane_task_id(HEAVY_LANE)]
    afters = [lane_task_id(after_lane(lane)) for lane in (None, API, HEAVY_LANE)]
    selects = [select_task_id(task) for task in [*firsts[1:], *afters]]
    assert sorted(dag.task_ids) == sorted([PLAN_TASK, FINALIZE_TASK, *firsts, *afters, *selects])
    for task_id in firsts:
        assert not dag.get_task(task_id).start_from_trigger
    for first, task_id in zip(firsts, afters, strict=True):
        task = dag.get_task(task_id)
        assert task.start_from_trigger
        assert task.start_trigger_args.trigger_cls == "airflow_plan_provider.triggers.start.NodeStartTrigger"
        assert task.start_trigger_args.next_method == "resume_after_parents"
        assert task.upstream_task_ids == {PLAN_TASK, select_task_id(task_id)}
        # the same pool as its lane's first task
        assert task.partial_kwargs.get("pool") == dag.get_task(first).partial_kwargs.get("pool")
    data = serialization.to_dict(dag)
    text = json.dumps(data, sort_keys=True)
    assert "StartTriggerArgs(" not in text  # no object repr: the same on every parse
    assert text == json.dumps(
        serialization.to_dict(build("started_shape", CallLog(tmp_path), execution=STARTED)), sort_keys=True
    )
    loaded = serialization.from_dict(data)
    assert loaded.get_task(AFTER).start_from_trigger
    assert not loaded.get_task(NODES_TASK).start_from_trigger


@needs_feature
def test_a_pool_whose_lane_is_another_lanes_after_lane_is_refused_naming_it(tmp_path: Any) -> None:
    log = CallLog(tmp_path)
    with pytest.raises(ValueError, match="rename the pool") as refused:
        build(
            "started_clash",
            log,
            execution=STARTED,
            overrides={"local": {"pool": after_lane(None)}},
        )
    assert repr(after_lane(None)) in str(refused.value)


def test_where_airflow_starts_no_mapped_instance_on_the_triggerer_the_dag_is_built_as_without(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(airflow_features, "starts_mapped_on_triggerer", lambda: False)
    with caplog.at_level("WARNING"):
        dag = build("started_unoffered", CallLog(tmp_path), pooled=False, execution=STARTED)
    assert sorted(dag.task_ids) == [FINALIZE_TASK, NODES_TASK, PLAN_TASK]
    assert not dag.get_task(NODES_TASK).start_from_trigger
    assert "starts no mapped task instance on the triggerer" in caplog.text


@needs_feature
@pytest.mark.airflow
@pytest.mark.usefixtures("pools")
def test_a_plan_started_on_the_triggerer_ends_as_without_and_publishes_every_after_brief(
    tmp_path: Any,
) -> None:
    """dag.test() runs the instances in a slot (it starts none on a triggerer): the lanes, briefs and
    outcome are what the scheduler's start would find."""
    plain = run_plan_dag(build("started_plain", CallLog(tmp_path / "plain")))
    started = run_plan_dag(build("started_run", CallLog(tmp_path / "started"), execution=STARTED))
    assert str(started.state) == str(plain.state) == "success"
    assert outcome(started) == outcome(plain)
    lanes = xcom(started, PLAN_TASK, key=SESSION_KEY)["lanes"]
    assert lanes == {
        "a": API,
        "c": API,
        "d": HEAVY_LANE,
        "e": "after",
        "f": f"{API}__after",
        "g": "after",
    }
    # a task of a few instances maps over its briefs, and its trigger reads them from their group too
    group = xcom(started, PLAN_TASK, key=briefs_key(AFTER, 0))
    assert [NodeBrief.model_validate(brief).node_id for brief in group] == ["e", "g"]


# a chain a -> c -> e beside two roots: the run order goes layer by layer (a, b, d, c, e), the descendant
# order down the chain first (a, c, b, d, e)
CHAIN_BESIDE_ROOTS = {
    "goal": "a chain beside two roots",
    "nodes": [
        {"id": "a", "action": "chain 1", "tool": "local", "params": {"x": 1}},
        {"id": "b", "action": "root", "tool": "local", "params": {"x": 2}},
        {"id": "d", "action": "root", "tool": "local", "params": {"x": 3}},
        {"id": "c", "action": "chain 2", "tool": "local", "params": {"x": 4}, "dependencies": ["a"]},
        {"id": "e", "action": "chain 3", "tool": "local", "params": {"x": 5}, "dependencies": ["c"]},
    ],
}


@needs_feature
@pytest.mark.airflow
@pytest.mark.parametrize(("slots", "places"), [(8, [[0, 2, 3], [1, 4]]), (2, [[0, 1, 2], [3, 4]])])
def test_with_four_slots_or_more_nodes_started_on_the_triggerer_are_weighed_by_their_descendants(
    tmp_path: Any, slots: int, places: list[list[int]]
) -> None:
    """The places the planning task publishes for the weight rule: by descendants (the chain first) in a
    run of at least four slots, in the run order (layer by layer) below that."""
    plan = validate_plan(CHAIN_BESIDE_ROOTS)
    assert (plan.run_order, plan.descendant_order) == (list("abdce"), list("acbde"))
    dag = build(
        f"started_places_{slots}",
        CallLog(tmp_path),
        plan_=CHAIN_BESIDE_ROOTS,
        pooled=False,
        execution=STARTED,
        max_active_tasks=slots,
    )
    run = run_plan_dag(dag)
    assert str(run.state) == "success"
    assert xcom(run, PLAN_TASK, key=PLACES_KEY) == {NODES_TASK: places[0], AFTER: places[1]}


@needs_feature
@pytest.mark.airflow
def test_a_run_without_slots_to_spare_has_its_nodes_started_on_the_triggerer_come_near_only_to_idle_slots(
    tmp_path: Any,
) -> None:
    """Five nodes in three layers on one slot: more nodes than slots times layers, so the run's context
    and the after task's briefs carry the run's slots and node tasks (``near_while_idle``: its nodes come
    near their parents only while the run leaves a slot idle), and the instances are weighed by
    descendants below four slots too. The same plan on two slots comes near freely (the places test
    above)."""
    dag = build(
        "started_no_slot_to_spare",
        CallLog(tmp_path),
        plan_=CHAIN_BESIDE_ROOTS,
        pooled=False,
        execution=STARTED,
        max_active_tasks=1,
    )
    run = run_plan_dag(dag)
    assert str(run.state) == "success"
    counted = {"slots": 1, "tasks": [NODES_TASK, AFTER]}
    assert xcom(run, PLAN_TASK, key=RUN_CONTEXT_KEY)["near_while_idle"] == counted
    assert xcom(run, PLAN_TASK, key=PLACES_KEY) == {NODES_TASK: [0, 2, 3], AFTER: [1, 4]}
    group = xcom(run, PLAN_TASK, key=briefs_key(AFTER, 0))
    briefs = [NodeBrief.model_validate(b) for b in group]
    assert [b.run.near_while_idle.model_dump() for b in briefs if b.run.near_while_idle] == [counted, counted]


def test_the_start_trigger_of_a_run_without_slots_to_spare_counts_the_runs_slots() -> None:
    """``near_while_idle``: the trigger is given the run's slots and its node tasks with the group's
    prefix, so it has the node come back near its running parents only while the run leaves a slot
    idle; a run with slots to spare gives none."""
    plan = validate_plan(MIXED_PLAN)
    lanes = {"e": "after", "f": f"{API}__after", "g": "after"}
    tasks = [NODES_TASK, lane_task_id(API), AFTER, lane_task_id(after_lane(API))]
    counted = RunContext(lanes=lanes, near_while_idle=RunSlots(slots=3, tasks=tasks))
    trigger = NodeStartTrigger()
    for run, expected in [
        (counted, {"slots": 3, "tasks": [f"grp.{task}" for task in tasks]}),
        (RunContext(lanes=lanes), None),
    ]:
        ti = _TriggerTi(f"grp.{AFTER}", 1, {briefs_key(AFTER, 0): node_briefs(plan, run)[AFTER]})
        brief = asyncio.run(trigger._brief(ti))
        assert brief is not None
        kwargs = trigger.waiting(ti, brief).serialize()[1]
        assert kwargs["run_slots"] == expected and kwargs["grandparents"] is not None


def test_the_start_trigger_reads_its_nodes_brief_and_waits_as_a_deferred_node_does() -> None:
    """The trigger of instance 1 of ``nodes__after`` in a task group reads its brief from its group and
    waits on its parents' instances, with their checkpoints' keys, coming back near them at once."""
    plan = validate_plan(MIXED_PLAN)
    run = RunContext(lanes={"e": "after", "f": f"{API}__after", "g": "after", "a": API, "c": API})
    tasks = node_tasks(plan, run)
    assert tasks[AFTER] == ["e", "g"]
    groups = {briefs_key(AFTER, 0): node_briefs(plan, run)[AFTER]}
    ti = _TriggerTi(f"grp.{AFTER}", 1, groups)
    trigger = NodeStartTrigger(poll_interval=0.25, checkpoints=True, artifact_store="file:///tmp/store")
    brief = asyncio.run(trigger._brief(ti))
    assert brief is not None and brief.node_id == "g"
    assert ti.pulled == [("grp.plan", briefs_key(AFTER, 0), -1)]
    waiting = trigger.waiting(ti, brief)
    assert isinstance(waiting, ParentsFinishedTrigger)
    kwargs = waiting.serialize()[1]
    where = {node: f"grp.{task}_{index}" for task, nodes in tasks.items() for index, node in enumerate(nodes)}
    assert kwargs["parents"] == _parents_of("g", plan, where)
    assert set(kwargs["checkpoints"]) == {where[p] for p in plan.parents["g"]}
    assert kwargs["seen_far"] is True and kwargs["free_deferral"] is True
    assert kwargs["poll_interval"] == 0.25 and kwargs["artifact_store"] == "file:///tmp/store"
    assert kwargs["grandparents"] == {
        where[p]: [where[g] for g in plan.parents[p]] for p in plan.parents["g"]
    }


def test_the_start_triggers_of_one_brief_group_read_it_once_per_run_and_try() -> None:
    """Airflow starts a run's start triggers together: the triggers of one group of briefs share one
    read of it, while a trigger of another run, or of another try of the run's nodes (a cleared run
    planned again), reads its own. A shared read that fails is tried again by each trigger alone."""
    plan = validate_plan(MIXED_PLAN)
    run = RunContext(lanes={"e": "after", "f": f"{API}__after", "g": "after"})
    groups = {briefs_key(AFTER, 0): node_briefs(plan, run)[AFTER]}
    pulls: list[tuple[str, int]] = []

    class Counted(_TriggerTi):
        async def axcom_pull(self, *, task_ids: str, key: str, map_indexes: int) -> Any:
            pulls.append((self.run_id, self.try_number))
            await asyncio.sleep(0.01)
            return await super().axcom_pull(task_ids=task_ids, key=key, map_indexes=map_indexes)

    def instance(index: int, run_id: str = "run", try_number: int = 1) -> Counted:
        ti = Counted(AFTER, index, groups)
        ti.run_id, ti.try_number = run_id, try_number
        return ti

    async def read_all(tis: list[Any]) -> list[str | None]:
        briefs = await asyncio.gather(*(NodeStartTrigger._brief(ti) for ti in tis))
        return [None if brief is None else brief.node_id for brief in briefs]

    tis = [instance(0), instance(1), instance(0, "other run"), instance(1, try_number=2)]
    assert asyncio.run(read_all(tis)) == ["e", "g", "e", "g"]
    assert sorted(pulls) == [("other run", 1), ("run", 1), ("run", 2)]

    class FailsOnce(_TriggerTi):
        failed = False

        async def axcom_pull(self, *, task_ids: str, key: str, map_indexes: int) -> Any:
            if not FailsOnce.failed:
                FailsOnce.failed = True
                raise ConnectionError("the API server is away")
            return await super().axcom_pull(task_ids=task_ids, key=key, map_indexes=map_indexes)

    failing = [FailsOnce(AFTER, index, groups) for index in (0, 1)]
    for ti in failing:
        ti.run_id = "a third run"
    assert asyncio.run(read_all(failing)) == ["e", "g"]


def test_a_start_trigger_that_cannot_read_its_brief_lets_the_node_start_in_its_slot() -> None:
    trigger = NodeStartTrigger()
    trigger.task_instance = _TriggerTi(AFTER, 3, {})

    async def first() -> Any:
        async for event in trigger.run():
            return event.payload

    event = asyncio.run(first())
    assert event == {"status": "ready", "parents_read": False}
    # the node's log then says its parents are read in the slot, not that they finished
    assert "did not read its parents" in _started_because(event)
    assert _started_because({"status": "ready"}) == "its parents finished or saved their results"
    assert _started_because({"status": "wait"}) == "its parents run their tools"


def _parents_of(node: str, plan: Any, where: dict[str, str]) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for parent in plan.parents[node]:
        task, _, index = where[parent].rpartition("_")
        found.setdefault(task, []).append(int(index))
    return found


class _TriggerTi:
    """What a trigger gets as its task instance on the triggerer, reading XCom from ``groups``."""

    def __init__(self, task_id: str, map_index: int, groups: dict[str, Any]) -> None:
        self.dag_id, self.run_id, self.task_id, self.map_index = "dag", "run", task_id, map_index
        self.try_number = 1
        self.groups, self.pulled = groups, []

    async def axcom_pull(self, *, task_ids: str, key: str, map_indexes: int) -> Any:
        self.pulled.append((task_ids, key, map_indexes))
        return self.groups[key]
