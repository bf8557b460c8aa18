"""A waiting node gives its slot to a ready node only where that frees a slot the ready node can take."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_plan_provider.contract import NODES_TASK


@pytest.mark.parametrize(
    ("cap", "expected"),
    [(None, True), (8, True), (4, False), (3, False)],
    ids=["no task cap", "task cap not reached", "task cap full", "task cap over"],
)
def test_a_waiting_node_steps_aside_only_while_its_tasks_cap_has_room(
    cap: int | None, expected: bool
) -> None:
    from airflow_plan_provider.contract import NodeBrief, node_briefs
    from airflow_plan_provider.operators.node_wait import SlotWait
    from airflow_plan_provider.plan.session import RunContext
    from airflow_plan_provider.plan.validate import validate_plan
    from airflow_plan_provider.plan.waiting import Wait, WaitingPolicy

    # r → a → b; root x; z depends on x. x finished, z is ready and waits for a slot while r runs its
    # tool and a and b wait in theirs: b (a far waiter) is the node that gives z its slot. Airflow
    # counts a deferred instance under the task's max_active_tis_per_dagrun: with that cap full (r, a,
    # b and the queued y make 4), stepping aside would free no slot that z could take.
    plan = validate_plan(
        {
            "nodes": [{"id": n, "action": "work", "tool": "t"} for n in ("r", "x", "y", "a", "z", "b")],
            "edges": [{"from": "r", "to": "a"}, {"from": "a", "to": "b"}, {"from": "x", "to": "z"}],
        }
    )
    order = plan.run_order
    run = RunContext(execution_order=order)
    briefs = {
        b["node"]["id"]: NodeBrief.model_validate(b)
        for group in node_briefs(plan, run).values()
        for b in group
    }
    state = {"r": "running", "x": "success", "y": "queued", "a": "running", "z": "scheduled", "b": "running"}
    states = {f"{NODES_TASK}_{index}": state[node] for index, node in enumerate(order)}

    def steps_aside(node: str) -> bool:
        """What the node's wait in its slot makes of this read (the state keys, the task's cap)."""
        ti = SimpleNamespace(dag_id="d", run_id="r1", task_id=NODES_TASK, task=None, try_number=1)
        waiting = SlotWait(
            ti=ti,
            brief=briefs[node],
            whole=lambda: (plan, run),
            policy=WaitingPolicy(),
            log=logging.getLogger("t"),
            pick_up=lambda node_ids: {},
            task_cap=cap,
        )
        return waiting.policy.next_move(waiting._view(states, waited=0.0)).kind is Wait.STEP_ASIDE

    assert [n for n in order if steps_aside(n)] == (["b"] if expected else [])


def test_a_waiting_node_reads_the_whole_plan_only_when_the_policy_looks_beyond_its_brief() -> None:
    """A node whose parents finished starts on its brief alone; one whose parents run reads the plan
    and the run's layout once (stepping aside looks at the whole task), however many reads it makes;
    in a large plan (its nodes read their parents' instances one by one) it never does."""
    from airflow_plan_provider.contract import NodeBrief, node_briefs
    from airflow_plan_provider.operators.node_wait import SlotWait
    from airflow_plan_provider.plan.session import RunContext
    from airflow_plan_provider.plan.validate import validate_plan
    from airflow_plan_provider.plan.waiting import Wait, WaitingPolicy

    plan = validate_plan(
        {
            "nodes": [{"id": n, "action": "work", "tool": "t"} for n in ("a", "b", "c")],
            "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}],
        }
    )
    run = RunContext(execution_order=plan.run_order)
    briefs = {
        b["node"]["id"]: NodeBrief.model_validate(b)
        for group in node_briefs(plan, run).values()
        for b in group
    }
    index = {node: i for i, node in enumerate(plan.run_order)}

    def moves(node: str, state: dict[str, str], policy: WaitingPolicy, reads: int = 3) -> tuple[Wait, int]:
        wholes: list[int] = []

        def whole() -> tuple[Any, RunContext]:
            wholes.append(1)
            return plan, run

        ti = SimpleNamespace(dag_id="d", run_id="r1", task_id=NODES_TASK, task=None, try_number=1)
        waiting = SlotWait(
            ti=ti,
            brief=briefs[node],
            whole=whole,
            policy=policy,
            log=logging.getLogger("t"),
            pick_up=lambda node_ids: {},
        )
        states = {f"{NODES_TASK}_{index[n]}": s for n, s in state.items()}
        kinds = {waiting.policy.next_move(waiting._view(states, waited=0.0)).kind for _ in range(reads)}
        [kind] = kinds
        return kind, len(wholes)

    finished = {"a": "success", "b": "success", "c": "running"}
    running = {"a": "success", "b": "running", "c": "running"}
    assert moves("c", finished, WaitingPolicy()) == (Wait.READY, 0)
    assert moves("c", running, WaitingPolicy()) == (Wait.WAIT, 1)
    assert moves("c", running, WaitingPolicy(read_all_states_up_to=2)) == (Wait.WAIT, 0)


def test_a_node_whose_parents_saved_their_results_starts_on_them_without_reading_states() -> None:
    """The parents' checkpoints of this run are looked at before any read of the run's states: when
    every parent saved one, the node is ready on those records and reads nothing from the API server;
    when one has not, the node reads the states as before, keeping the records it picked up."""
    from airflow_plan_provider.contract import NodeBrief, node_briefs
    from airflow_plan_provider.operators.node_wait import SlotWait
    from airflow_plan_provider.plan.decisions import NodeStatus
    from airflow_plan_provider.plan.result import NodeRecord
    from airflow_plan_provider.plan.session import RunContext
    from airflow_plan_provider.plan.validate import validate_plan
    from airflow_plan_provider.plan.waiting import Wait, WaitingPolicy

    plan = validate_plan(
        {
            "nodes": [{"id": n, "action": "work", "tool": "t"} for n in ("a", "b", "c")],
            "edges": [{"from": "a", "to": "c"}, {"from": "b", "to": "c"}],
        }
    )
    run = RunContext(execution_order=plan.run_order)
    [brief] = [
        NodeBrief.model_validate(b)
        for group in node_briefs(plan, run).values()
        for b in group
        if b["node"]["id"] == "c"
    ]
    index = {node: i for i, node in enumerate(plan.run_order)}

    def wait(saved: set[str], checkpoints: bool = True) -> tuple[Wait, set[str], list[list[str]], int]:
        asked: list[list[str]] = []
        reads: list[int] = []

        def pick_up(node_ids: Any) -> dict[str, NodeRecord]:
            asked.append(sorted(node_ids))
            return {
                n: NodeRecord(node_id=n, status=NodeStatus.SUCCESS, output=f"{n}'s")
                for n in node_ids
                if n in saved
            }

        ti = SimpleNamespace(dag_id="d", run_id="r1", task_id=NODES_TASK, task=None, try_number=1)
        waiting = SlotWait(
            ti=ti,
            brief=brief,
            whole=lambda: (plan, run),
            policy=WaitingPolicy(),
            log=logging.getLogger("t"),
            pick_up=pick_up,
            checkpoints=checkpoints,
        )

        def read_states() -> dict[str, str]:
            reads.append(1)
            return {f"{NODES_TASK}_{index[n]}": "success" for n in ("a", "b")}

        waiting._read_states = read_states  # type: ignore[method-assign]
        move = waiting.wait()
        return move.kind, set(waiting.picked), asked, len(reads)

    assert wait({"a", "b"}) == (Wait.READY, {"a", "b"}, [["a", "b"]], 0)
    # b saved none (it failed, was skipped, or saves no checkpoints): the states tell, a's record is kept
    assert wait({"a"}) == (Wait.READY, {"a"}, [["a", "b"]], 1)
    # a node task that keeps no checkpoints never looks for them
    assert wait({"a", "b"}, checkpoints=False) == (Wait.READY, set(), [], 1)


def test_a_node_reading_one_by_one_reads_its_grandparents_while_its_parents_run() -> None:
    """A deferred node's trigger carries the grandparents' instances, so that it can have the node come
    back to wait near its parents; once it did (``came_back``), the next trigger carries none (once a
    try). In a large plan, whose nodes read their instances one by one, a node whose parents all run
    reads their parents too (each until it saw it finished), so it knows when it is near and looks for
    its parents' checkpoints between reads; a node that came back counts them finished at once (its
    trigger saw them so); a node with a parent still queued reads only its parents."""
    from airflow_plan_provider.contract import NodeBrief, node_briefs
    from airflow_plan_provider.operators.node_wait import SlotWait
    from airflow_plan_provider.plan.session import RunContext
    from airflow_plan_provider.plan.validate import validate_plan
    from airflow_plan_provider.plan.waiting import Move, Wait, WaitingPolicy

    plan = validate_plan(
        {
            "nodes": [{"id": n, "action": "work", "tool": "t"} for n in ("a", "b", "c", "d")],
            "edges": [{"from": "a", "to": "c"}, {"from": "b", "to": "c"}, {"from": "c", "to": "d"}],
        }
    )
    run = RunContext(execution_order=plan.run_order)
    briefs = {
        b["node"]["id"]: NodeBrief.model_validate(b)
        for group in node_briefs(plan, run).values()
        for b in group
    }
    key = {node: f"{NODES_TASK}_{i}" for i, node in enumerate(plan.run_order)}
    state: dict[str, str] = {}
    asked: list[str] = []

    def get_task_states(*, dag_id: str, task_ids: list[str], run_ids: list[str], map_index: int) -> Any:
        [task] = task_ids
        asked.append(f"{task}_{map_index}")
        node = plan.run_order[map_index]
        return {run_ids[0]: {asked[-1]: state[node]} if node in state else {}}

    def waiting(came_back: bool, policy: WaitingPolicy = WaitingPolicy()) -> SlotWait:  # noqa: B008
        ti = SimpleNamespace(
            dag_id="d",
            run_id="r1",
            task_id=NODES_TASK,
            task=None,
            try_number=1,
            get_task_states=get_task_states,
        )
        return SlotWait(
            ti=ti,
            brief=briefs["d"],
            whole=lambda: (plan, run),
            policy=policy,
            log=logging.getLogger("t"),
            pick_up=lambda node_ids: {},
            came_back=came_back,
        )

    assert waiting(False).trigger().grandparents == {key["c"]: sorted([key["a"], key["b"]])}
    assert waiting(True).trigger().grandparents is None
    one_by_one = WaitingPolicy(read_all_states_up_to=2)

    def reads(node: SlotWait) -> tuple[Move, list[str]]:
        asked.clear()
        return node.policy.next_move(node._view(node._read(), waited=0.0)), sorted(asked)

    node = waiting(False, one_by_one)
    state.update(a="success", b="running", c="running")
    far, near = Move(Wait.WAIT, one_by_one.poll_far), Move(Wait.WAIT, one_by_one.poll_far, near=True)
    assert reads(node) == (far, sorted(key[n] for n in "abc"))  # b still runs: c waits on it
    state.update(b="success")
    assert reads(node) == (near, [key["b"], key["c"]])  # a was seen finished: not read again
    assert reads(node) == (near, [key["c"]])
    state.update(c="queued")  # a parent not running yet: its parents are not read
    assert reads(waiting(False, one_by_one))[1] == [key["c"]]
    state.update(c="running")
    assert reads(waiting(True, one_by_one)) == (near, [key["c"]])  # came back: its trigger saw a, b end
