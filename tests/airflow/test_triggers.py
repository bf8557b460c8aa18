"""The triggers and the events a deferred task resumes with.

Each trigger's ``serialize()`` survives the trip through the metadata database (the triggerer builds
the trigger again from it), its ``run()`` yields the one event the resuming method reads, and that
method rejects an event its trigger cannot have sent with an error naming what is wrong.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_plan_provider.contract import (
    APPROVE_TASK,
    NODE_KEY,
    NODES_TASK,
    REPLAN_TASK,
    after_lane,
    lane_task_id,
)
from airflow_plan_provider.exceptions import TriggerEventError
from airflow_plan_provider.plan.session import RunSlots
from airflow_plan_provider.tools.jobs import JobStatus, callable_path
from airflow_plan_provider.triggers.job import ToolJobTrigger
from airflow_plan_provider.triggers.parents import ParentsFinishedTrigger, RunStates
from airflow_plan_provider.triggers.payloads import (
    JobOutcome,
    validate_approval_event,
    validate_dag_state_event,
    validate_job_event,
    validate_parents_event,
)

# --------------------------------------------------------------------- poll functions the triggers import


def poll_counted(handle: Mapping[str, Any]) -> JobStatus:
    """Done with ``handle["result"]`` at the ``handle["polls"]``-th poll (polls counted in a file)."""
    counter = Path(handle["counter"])
    polls = int(counter.read_text() or 0) + 1 if counter.exists() else 1
    counter.write_text(str(polls))
    return JobStatus.done(handle["result"]) if polls >= handle["polls"] else JobStatus.pending()


def poll_failed(handle: Mapping[str, Any]) -> JobStatus:
    return JobStatus.failed(f"export {handle['job']} was cancelled")


def poll_failed_without_reason(handle: Mapping[str, Any]) -> JobStatus:
    return JobStatus("failed")


def poll_pending(handle: Mapping[str, Any]) -> JobStatus:
    return JobStatus.pending()


API_DOWN = "the job API is down"


def poll_raises(handle: Mapping[str, Any]) -> JobStatus:
    raise ConnectionError(API_DOWN)


def poll_wrong_type(handle: Mapping[str, Any]) -> Any:
    return {"state": "done"}


def events_of(trigger: Any) -> list[Any]:
    async def collect(events: AsyncIterator[Any]) -> list[Any]:
        return [event async for event in events]

    return asyncio.run(collect(trigger.run()))


def first_events(triggers: list[Any], *, return_exceptions: bool = False) -> list[Any]:
    """The first event of each trigger, run side by side on one event loop as the triggerer runs them
    (or the exception a trigger raised, with ``return_exceptions``)."""

    async def run_all() -> list[Any]:
        return await asyncio.gather(
            *(anext(trigger.run()) for trigger in triggers), return_exceptions=return_exceptions
        )

    return asyncio.run(run_all())


def through_the_database(trigger: Any) -> Any:
    """The trigger the triggerer builds from what ``serialize()`` stored (encrypted kwargs and all)."""
    from airflow.models.trigger import Trigger
    from airflow.sdk.module_loading import import_string

    classpath, kwargs = trigger.serialize()
    row = Trigger(classpath=classpath, kwargs=kwargs)
    return import_string(row.classpath)(**row.kwargs)


# ------------------------------------------------------------------------------------ ToolJobTrigger


def test_job_trigger_serializes_to_what_rebuilds_it() -> None:
    trigger = ToolJobTrigger(
        poll_path=callable_path(poll_counted),
        handle={"job": "exp-1", "shards": [1, 2]},
        poll_interval=0.5,
        deadline=1_900_000_000.0,
        node_id="n1",
        cancel_path=f"{__name__}.poll_pending",
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_plan_provider.triggers.job.ToolJobTrigger"
    assert kwargs == {
        "poll_path": f"{__name__}.poll_counted",
        "handle": {"job": "exp-1", "shards": [1, 2]},
        "poll_interval": 0.5,
        "deadline": 1_900_000_000.0,
        "node_id": "n1",
        "cancel_path": f"{__name__}.poll_pending",
    }
    rebuilt = through_the_database(trigger)
    assert type(rebuilt) is ToolJobTrigger
    assert rebuilt.serialize() == (classpath, kwargs)


def test_job_trigger_polls_until_done_and_yields_the_result(tmp_path: Path) -> None:
    handle = {"counter": str(tmp_path / "polls"), "polls": 3, "result": {"rows": 42}}
    trigger = ToolJobTrigger(poll_path=callable_path(poll_counted), handle=handle, poll_interval=0.01)
    events = events_of(trigger)
    assert [event.payload for event in events] == [{"status": "done", "result": {"rows": 42}}]
    assert (tmp_path / "polls").read_text() == "3"  # pending twice, then done
    assert validate_job_event(events[0].payload) == JobOutcome("done", result={"rows": 42})


@pytest.mark.parametrize(
    ("poll", "deadline", "expected"),
    [
        (poll_failed, None, JobOutcome("failed", reason="export exp-1 was cancelled")),
        (poll_failed_without_reason, None, JobOutcome("failed", reason="the job failed")),
        (poll_raises, None, JobOutcome("failed", reason=f"polling raised ConnectionError: {API_DOWN}")),
        (poll_wrong_type, None, JobOutcome("failed", reason="poll returned dict, expected JobStatus")),
        (poll_pending, 0.0, JobOutcome("timeout", reason="the job did not finish before its timeout")),
    ],
)
def test_job_trigger_ends_with_one_terminal_event(
    poll: Any, deadline: float | None, expected: JobOutcome
) -> None:
    trigger = ToolJobTrigger(
        poll_path=callable_path(poll), handle={"job": "exp-1"}, poll_interval=0.01, deadline=deadline
    )
    events = events_of(trigger)
    assert len(events) == 1
    assert validate_job_event(events[0].payload) == expected


def test_job_trigger_keeps_polling_until_its_deadline(tmp_path: Path) -> None:
    handle = {"counter": str(tmp_path / "polls"), "polls": 10**9, "result": None}
    trigger = ToolJobTrigger(
        poll_path=callable_path(poll_counted), handle=handle, poll_interval=0.01, deadline=time.time() + 0.3
    )
    [event] = events_of(trigger)
    assert event.payload["status"] == "timeout"
    assert int((tmp_path / "polls").read_text()) > 1  # it polled again before giving up


# ---------------------------------------------------------------------------- ParentsFinishedTrigger


def answer_reads(
    monkeypatch: pytest.MonkeyPatch, run_id: str, answers: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Have the Task SDK's task states read (a request to Airflow's API server) answer with the first
    of ``answers`` (one run's states, ``run_id``'s), taking it off the list; the queries it was asked,
    as they come."""
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    asked: list[dict[str, Any]] = []

    def get_task_states(**query: Any) -> dict[str, Any]:
        asked.append(query)
        return {run_id: answers.pop(0)}

    monkeypatch.setattr(RuntimeTaskInstance, "get_task_states", staticmethod(get_task_states))
    return asked


def test_parents_trigger_serializes_to_what_rebuilds_it() -> None:
    trigger = ParentsFinishedTrigger(
        dag_id="plan_dag",
        run_id="manual__1",
        parents={NODES_TASK: [0, 2], lane_task_id("api"): [1]},
        poll_interval=0.5,
        checkpoints={f"{NODES_TASK}_0": "plan_dag/manual__1/a/1f"},
        artifact_store="s3://bucket/plans",
        free_deferral=True,
        grandparents={f"{NODES_TASK}_0": [f"{lane_task_id('api')}_0"], f"{NODES_TASK}_2": []},
        run_slots={"slots": 4, "tasks": [NODES_TASK, lane_task_id("api")]},
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_plan_provider.triggers.parents.ParentsFinishedTrigger"
    assert kwargs == {
        "dag_id": "plan_dag",
        "run_id": "manual__1",
        "parents": {NODES_TASK: [0, 2], lane_task_id("api"): [1]},
        "poll_interval": 0.5,
        "checkpoints": {f"{NODES_TASK}_0": "plan_dag/manual__1/a/1f"},
        "artifact_store": "s3://bucket/plans",
        "free_deferral": True,
        "grandparents": {f"{NODES_TASK}_0": [f"{lane_task_id('api')}_0"], f"{NODES_TASK}_2": []},
        "run_slots": {"slots": 4, "tasks": [NODES_TASK, lane_task_id("api")]},
        "seen_far": False,
    }
    rebuilt = through_the_database(trigger)
    assert type(rebuilt) is ParentsFinishedTrigger
    assert rebuilt.serialize() == (classpath, kwargs)


def test_parents_trigger_yields_ready_once_every_parent_finished(monkeypatch: pytest.MonkeyPatch) -> None:
    # the Task SDK call reaches Airflow's API server: here it answers from a script of states
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    answers = [
        {
            "manual__1": {
                f"{NODES_TASK}_0": "running",
                f"{NODES_TASK}_2": "success",
                f"{lane_task_id('api')}_1": "queued",
            }
        },
        {
            "manual__1": {
                f"{NODES_TASK}_0": "success",
                f"{NODES_TASK}_2": "success",
                f"{lane_task_id('api')}_1": "running",
            }
        },
        {
            "manual__1": {
                f"{NODES_TASK}_0": "success",
                f"{NODES_TASK}_2": "success",
                f"{lane_task_id('api')}_1": "failed",
            }
        },
    ]
    asked: list[dict[str, Any]] = []

    def get_task_states(**query: Any) -> dict[str, Any]:
        asked.append(query)
        return answers[len(asked) - 1]

    monkeypatch.setattr(RuntimeTaskInstance, "get_task_states", staticmethod(get_task_states))
    parents = {NODES_TASK: [0, 2], lane_task_id("api"): [1]}
    trigger = ParentsFinishedTrigger(
        dag_id="plan_dag", run_id="manual__1", parents=parents, poll_interval=0.01
    )
    events = events_of(trigger)
    assert [event.payload for event in events] == [{"status": "ready"}]
    assert len(asked) == 3  # not ready while a parent was queued or running
    assert asked[0] == {
        "dag_id": "plan_dag",
        "task_ids": [NODES_TASK, lane_task_id("api")],
        "run_ids": ["manual__1"],
    }
    validate_parents_event(events[0].payload)


def test_parents_trigger_has_the_node_come_back_once_its_parents_start_their_tools(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Given the grandparents, the trigger reads their task too and sends ``wait`` once every unfinished
    parent, seen waiting on its own parents before, runs with its own parents finished. Parents that ran
    their tools at the first read already (the node deferred on them past its in-slot bound) are waited
    for to the end."""
    lane = lane_task_id("api")
    far = {f"{NODES_TASK}_1": "running", f"{lane}_0": "running"}  # the parent waits on its own parent
    near = {f"{NODES_TASK}_1": "running", f"{lane}_0": "success"}  # the parent runs its tool
    done = {f"{NODES_TASK}_1": "success", f"{lane}_0": "success"}
    answers = [far, near, done]
    asked = answer_reads(monkeypatch, "manual__1", answers)
    trigger = ParentsFinishedTrigger(
        dag_id="plan_dag",
        run_id="manual__1",
        parents={NODES_TASK: [1]},
        poll_interval=0.01,
        grandparents={f"{NODES_TASK}_1": [f"{lane}_0"]},
    )
    assert [e.payload for e in events_of(trigger)] == [{"status": "wait"}]
    assert len(asked) == 2
    assert asked[0]["task_ids"] == sorted([NODES_TASK, lane])
    validate_parents_event({"status": "wait"})
    answers[:], asked[:] = [near, near, done], []
    assert [e.payload for e in events_of(trigger)] == [{"status": "ready"}]
    assert len(asked) == 3


def test_parents_trigger_of_a_run_without_slots_to_spare_has_the_node_come_back_only_to_an_idle_slot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Given the run's slots and node tasks (``run_slots``), one read of those tasks says how many of
    the run's instances hold or wait for a slot: the node comes back near its parents, which run their
    tools, only once fewer of them than the slots do; deferred and finished instances hold none."""
    lane, after = lane_task_id("api"), lane_task_id(after_lane(None))
    parent_runs_tool = {f"{NODES_TASK}_1": "running", f"{lane}_0": "success"}
    full = parent_runs_tool | {f"{NODES_TASK}_2": "scheduled", f"{NODES_TASK}_3": "deferred"}
    idle = parent_runs_tool | {f"{NODES_TASK}_2": "success", f"{NODES_TASK}_3": "deferred"}
    asked = answer_reads(monkeypatch, "manual__1", [full, full, idle])
    trigger = ParentsFinishedTrigger(
        dag_id="plan_dag",
        run_id="manual__1",
        parents={NODES_TASK: [1]},
        poll_interval=0.01,
        grandparents={f"{NODES_TASK}_1": [f"{lane}_0"]},
        run_slots={"slots": 2, "tasks": [NODES_TASK, lane, after]},
        seen_far=True,
    )
    rebuilt = ParentsFinishedTrigger(**trigger.serialize()[1])
    assert rebuilt.serialize() == trigger.serialize()
    assert [e.payload for e in events_of(rebuilt)] == [{"status": "wait"}]
    assert len(asked) == 3
    assert asked[0]["task_ids"] == sorted([NODES_TASK, lane, after])
    with pytest.raises(ValueError, match="slots"):
        ParentsFinishedTrigger(dag_id="d", run_id="r", parents={}, run_slots={"slots": 0, "tasks": ["n"]})


def test_the_held_nodes_of_a_run_count_its_slots_once_per_shared_read() -> None:
    """Every held trigger of a run asks the same shared read whether a slot is idle: the read counts
    the run's instances of its node tasks once for all of them (a 500-node run's hundreds of held nodes
    do not each walk its 500 states), and answers each question it was asked, not another's."""
    walks: list[str] = []

    class Instances(dict[str, str]):
        def items(self) -> Any:
            walks.append("walk")
            return super().items()

    lane = lane_task_id("api")
    mine = Instances({f"{NODES_TASK}_{i}": "running" for i in range(3)} | {f"{lane}_0": "deferred"})
    read = RunStates({"manual__1": mine, "manual__2": {f"{NODES_TASK}_0": "scheduled"}})
    four, three = RunSlots(slots=4, tasks=[NODES_TASK, lane]), RunSlots(slots=3, tasks=[NODES_TASK, lane])
    assert [read.slot_idle("manual__1", four) for _ in range(100)] == [True] * 100
    assert walks == ["walk"]
    assert read.slot_idle("manual__1", three) is False  # three running fill three slots
    assert read.slot_idle("manual__2", RunSlots(slots=1, tasks=[NODES_TASK])) is False
    assert RunStates(read).slot_idle("manual__1", four) is True  # a new read counts again
    assert walks == ["walk", "walk", "walk"]


@pytest.mark.parametrize(
    ("free_deferral", "on_a_triggerer", "expected"),
    [(False, True, "make_way"), (True, True, "ready"), (True, False, "make_way")],
    ids=["deferral holds a cap", "free deferral", "free deferral run inline"],
)
def test_a_free_deferral_waits_through_a_parent_needing_a_slot(
    monkeypatch: pytest.MonkeyPatch, free_deferral: bool, on_a_triggerer: bool, expected: str
) -> None:
    """A parent goes back to waiting for a slot (a retry): the trigger releases the node (make way)
    unless its deferral holds nothing, when it keeps waiting until the parent finished. Only on a
    triggerer, which gives the trigger its task instance: run inline (``dag.test()`` runs a trigger in
    the task's process to its first event, before any other task), it would wait for ever."""
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    states = iter(["running", "up_for_retry", "scheduled", "success"])

    def get_task_states(**query: Any) -> dict[str, Any]:
        return {"manual__1": {f"{NODES_TASK}_0": next(states)}}

    monkeypatch.setattr(RuntimeTaskInstance, "get_task_states", staticmethod(get_task_states))
    trigger = ParentsFinishedTrigger(
        dag_id="plan_dag",
        run_id="manual__1",
        parents={NODES_TASK: [0]},
        poll_interval=0.01,
        free_deferral=free_deferral,
    )
    if on_a_triggerer:
        trigger.task_instance = SimpleNamespace(task_id=NODES_TASK, map_index=3)
    assert [event.payload for event in events_of(trigger)] == [{"status": expected}]


def test_parents_trigger_is_ready_once_its_running_parents_saved_their_checkpoints(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """While its parents run, the trigger looks for their checkpoints between two reads: the node is
    ready once every unfinished parent saved one in this run, before the states say so (they say
    running throughout here). A checkpoint saved by another run does not count."""
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    from airflow_plan_provider import artifacts

    store = tmp_path.as_uri()
    reads: list[float] = []

    def get_task_states(**query: Any) -> dict[str, Any]:
        reads.append(time.monotonic())
        return {
            "manual__1": {
                f"{NODES_TASK}_0": "running",
                f"{NODES_TASK}_1": "running",
                f"{NODES_TASK}_2": "success",
            }
        }

    monkeypatch.setattr(RuntimeTaskInstance, "get_task_states", staticmethod(get_task_states))
    keys = {f"{NODES_TASK}_0": "plan_dag/root/a/1f", f"{NODES_TASK}_1": "plan_dag/root/b/2e"}
    artifacts.save_checkpoint(keys[f"{NODES_TASK}_0"], {"run_id": "manual__1", "output": 1}, store)
    artifacts.save_checkpoint(
        keys[f"{NODES_TASK}_1"], {"run_id": "manual__0", "output": 2}, store
    )  # another run's
    trigger = ParentsFinishedTrigger(
        dag_id="plan_dag",
        run_id="manual__1",
        parents={NODES_TASK: [0, 1, 2]},
        poll_interval=0.5,
        checkpoints=keys,
        artifact_store=store,
    )

    async def parent_b_saves_later() -> Any:
        started = time.monotonic()
        events = trigger.run()
        saving = asyncio.get_running_loop().call_later(
            0.7,
            artifacts.save_checkpoint,
            keys[f"{NODES_TASK}_1"],
            {"run_id": "manual__1", "output": 3},
            store,
        )
        event = await asyncio.wait_for(anext(events), timeout=5)  # the states alone never say ready
        saving.cancel()
        return event, time.monotonic() - started

    event, waited = asyncio.run(parent_b_saves_later())
    assert event.payload == {"status": "ready"}
    assert validate_parents_event(event.payload) == "ready"
    # found between the second and the third read, not at a read
    assert 0.7 <= waited < 1.0 and len(reads) == 2, (waited, reads)


def test_parents_trigger_makes_way_when_a_parent_needs_a_slot_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A parent that failed a try waits for a slot again: the deferred node is released (it would
    otherwise keep its task's max_active_tis_per_dagrun while the parent waits for that same cap)."""
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    answers = [
        {"manual__1": {f"{NODES_TASK}_0": "running", f"{NODES_TASK}_2": "deferred"}},
        {"manual__1": {f"{NODES_TASK}_0": "up_for_retry", f"{NODES_TASK}_2": "deferred"}},
    ]
    asked: list[dict[str, Any]] = []

    def get_task_states(**query: Any) -> dict[str, Any]:
        asked.append(query)
        return answers[len(asked) - 1]

    monkeypatch.setattr(RuntimeTaskInstance, "get_task_states", staticmethod(get_task_states))
    trigger = ParentsFinishedTrigger(
        dag_id="plan_dag", run_id="manual__1", parents={NODES_TASK: [0, 2]}, poll_interval=0.01
    )
    events = events_of(trigger)
    assert [event.payload for event in events] == [{"status": "make_way"}] and len(asked) == 2
    assert validate_parents_event(events[0].payload) == "make_way"


def test_parents_triggers_of_one_run_share_their_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Deferred nodes of one run waiting on the same node task cost one state read per poll interval
    between them, not one each."""
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    calls: list[dict[str, Any]] = []

    def get_task_states(**query: Any) -> dict[str, Any]:
        calls.append(query)
        state = "running" if len(calls) < 3 else "success"
        return {"manual__7": {f"{NODES_TASK}_{i}": state for i in range(3)}}

    monkeypatch.setattr(RuntimeTaskInstance, "get_task_states", staticmethod(get_task_states))
    triggers = [
        ParentsFinishedTrigger(
            dag_id="plan_dag", run_id="manual__7", parents={NODES_TASK: [i]}, poll_interval=0.2
        )
        for i in range(3)
    ]

    events = first_events(triggers)
    assert [event.payload for event in events] == [{"status": "ready"}] * 3
    # three rounds of reads (running, running, success); one read per trigger per round would be 9
    assert 3 <= len(calls) <= 4


def test_parents_triggers_wait_through_failed_reads(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The API server away for a while: the triggers sharing the failed reads keep waiting, read again
    after the policy's growing pauses, and are released once the reads come back; one log line names
    the outage, one its end."""
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    calls: list[dict[str, Any]] = []

    def get_task_states(**query: Any) -> dict[str, Any]:
        calls.append(query)
        if len(calls) <= 2:
            raise ConnectionError("API server unreachable")
        return {"manual__8": {"nodes_0": "success", "nodes_1": "success"}}

    monkeypatch.setattr(RuntimeTaskInstance, "get_task_states", staticmethod(get_task_states))
    triggers = [
        ParentsFinishedTrigger(
            dag_id="plan_dag", run_id="manual__8", parents={NODES_TASK: [i]}, poll_interval=0.2
        )
        for i in range(2)
    ]

    with caplog.at_level(logging.INFO, logger="airflow_plan_provider.triggers.parents"):
        events = first_events(triggers)
    assert [event.payload for event in events] == [{"status": "ready"}] * 2
    assert 3 <= len(calls) <= 4  # two failed reads shared by both triggers, then one good one (or two)
    outages = [
        r.getMessage() for r in caplog.records if "could not read the parents' states" in r.getMessage()
    ]
    assert outages and all("API server unreachable" in line for line in outages)
    assert any("again after 2 failed read(s)" in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------------------------- event validation


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        ({"status": "done", "result": None}, JobOutcome("done")),
        ({"status": "done", "result": [1, 2]}, JobOutcome("done", result=[1, 2])),
        ({"status": "failed", "reason": "quota"}, JobOutcome("failed", reason="quota")),
        ({"status": "timeout", "reason": "too slow"}, JobOutcome("timeout", reason="too slow")),
    ],
)
def test_job_events_the_trigger_sends_are_accepted(event: dict[str, Any], expected: JobOutcome) -> None:
    assert validate_job_event(event) == expected
    assert expected.payload() == event


@pytest.mark.parametrize(
    ("event", "message"),
    [
        (None, "resumed without an event from the job trigger"),
        ("done", "is a str, expected a mapping"),
        ({}, "status None, expected one of done, failed, timeout"),
        ({"status": "success", "result": 1}, "status 'success', expected one of done, failed, timeout"),
        ({"status": "done"}, "done event from the job trigger has no result"),
        ({"status": "failed"}, "failed event from the job trigger has no reason"),
        ({"status": "timeout", "reason": ""}, "timeout event from the job trigger has no reason"),
        ({"status": "failed", "reason": {"code": 3}}, "has no reason (text)"),
    ],
)
def test_job_events_the_trigger_cannot_send_are_rejected(event: Any, message: str) -> None:
    with pytest.raises(TriggerEventError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate_job_event(event)


@pytest.mark.parametrize(
    ("event", "message"),
    [
        (None, "resumed without an event from the parents trigger"),
        (["ready"], "is a list, expected a mapping"),
        ({"status": "done"}, "status 'done', expected one of ready, make_way"),
    ],
)
def test_parents_events_other_than_ready_are_rejected(event: Any, message: str) -> None:
    with pytest.raises(TriggerEventError, match=message):
        validate_parents_event(event)


DAG_STATE_TRIGGER = "airflow.providers.standard.triggers.external_task.DagStateTrigger"


@pytest.mark.parametrize(
    "event",
    [
        (DAG_STATE_TRIGGER, {"run_ids": ["r2"], "r2": "failed"}),
        [DAG_STATE_TRIGGER, {"run_ids": ["r2"], "r2": "failed"}],  # a tuple read back from the database
    ],
)
def test_dag_state_events_name_the_run_and_its_state(event: Any) -> None:
    assert validate_dag_state_event(event) == ("r2", "failed")


@pytest.mark.parametrize(
    ("event", "message"),
    [
        (None, "resumed without an event from the DAG run state trigger"),
        ({"run_ids": ["r2"], "r2": "success"}, "not a \\(class path, data\\) pair"),
        (("path", ["r2"]), "is a list, expected a mapping"),
        (("path", {"r2": "success"}), "exactly one run in run_ids: None"),
        (("path", {"run_ids": ["r2", "r3"], "r2": "success"}), "exactly one run in run_ids"),
        (("path", {"run_ids": "r2", "r2": "success"}), "exactly one run in run_ids: 'r2'"),
        (("path", {"run_ids": ["r2"]}), "no state for run 'r2'"),
    ],
)
def test_dag_state_events_without_one_run_and_its_state_are_rejected(event: Any, message: str) -> None:
    with pytest.raises(TriggerEventError, match=message):
        validate_dag_state_event(event)


@pytest.mark.parametrize(
    "event",
    [
        {
            "chosen_options": ["Approve"],
            "params_input": {},
            "responded_by_user": {"id": "1", "name": "ann"},
            "responded_at": "2026-01-01T00:00:00+00:00",
            "timedout": False,
        },
        {"chosen_options": ["Reject"], "params_input": {}, "responded_by_user": None, "timedout": True},
        {"error": "The timeout has passed", "error_type": "timeout"},
        {"error": "bad params", "error_type": "validation"},
    ],
)
def test_approval_events_the_hitl_trigger_sends_are_accepted(event: dict[str, Any]) -> None:
    assert validate_approval_event(event) == event


@pytest.mark.parametrize(
    ("event", "message"),
    [
        (None, "resumed without an event from the approval trigger"),
        ({}, "chosen_options None, expected a list of option names"),
        ({"chosen_options": "Approve"}, "chosen_options 'Approve', expected a list"),
        ({"chosen_options": [1]}, "chosen_options \\[1\\], expected a list"),
        ({"chosen_options": ["Approve"], "responded_by_user": "ann"}, "responded_by_user 'ann'"),
        (
            {"chosen_options": ["Approve"], "responded_by_user": {"name": "ann"}},
            "expected {id, name} or None",
        ),
        ({"chosen_options": ["Approve"], "timedout": "no"}, "timedout 'no', expected a bool"),
        ({"error": "x"}, "must carry the error \\(text\\) and an error_type"),
        ({"error": None, "error_type": "timeout"}, "must carry the error"),
        ({"error": "x", "error_type": "crash"}, "error_type, one of timeout, unknown, validation"),
    ],
)
def test_approval_events_the_hitl_trigger_cannot_send_are_rejected(event: Any, message: str) -> None:
    with pytest.raises(TriggerEventError, match=message):
        validate_approval_event(event)


# ------------------------------------------------------------------------------ resuming operators


@pytest.mark.parametrize(
    "event",
    [None, ("path", {"run_ids": []}), ("path", {"run_ids": ["r2"], "r2": None})],
)
def test_replan_task_fails_at_once_on_an_event_without_its_run(event: Any) -> None:
    from airflow_plan_provider.airflow_features import AirflowFailException
    from airflow_plan_provider.operators.replan import ReplanOperator

    operator = ReplanOperator(task_id=REPLAN_TASK, trigger_dag_id="plan")
    with pytest.raises(AirflowFailException, match=rf"task '{REPLAN_TASK}': the .*DAG run state trigger"):
        operator.execute_complete({}, event)  # type: ignore[typeddict-item]


@pytest.mark.parametrize(
    "event",
    [None, {"chosen_options": "Approve"}, {"error": "lost", "error_type": "crash"}],
)
def test_approval_task_fails_at_once_on_an_event_the_hitl_trigger_cannot_send(event: Any) -> None:
    from airflow_plan_provider.airflow_features import AirflowFailException
    from airflow_plan_provider.operators.approval import PlanApprovalOperator

    operator = PlanApprovalOperator(task_id=APPROVE_TASK)
    with pytest.raises(AirflowFailException, match=rf"task '{APPROVE_TASK}': the .*approval trigger"):
        operator.execute_complete({}, event)  # type: ignore[typeddict-item]


@pytest.mark.airflow
def test_node_fails_with_the_fault_when_its_job_event_is_malformed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A done event without its result (as a trigger of another version might send) fails the node; it
    does not succeed with no output."""
    from datetime import timedelta

    from airflow.triggers.base import TriggerEvent

    from airflow_plan_provider import NodeExecution
    from airflow_plan_provider.dag_factory import build_plan_dag
    from airflow_plan_provider.testing import CallLog, ScriptedPlanner, ScriptedTool, scripted_registry
    from airflow_plan_provider.testing.in_process import run_plan_dag
    from tests.airflow.support import xcom

    async def run_without_result(self: ToolJobTrigger) -> AsyncIterator[TriggerEvent]:
        yield TriggerEvent({"status": "done"})

    monkeypatch.setattr(ToolJobTrigger, "run", run_without_result)
    tool = ScriptedTool(
        "export", log=CallLog(tmp_path), returns={"rows": 1}, job_seconds=1, poll_interval=0.1
    )
    plan = {"nodes": [{"id": "1", "action": "export", "tool": "export"}]}
    dag = build_plan_dag(
        "job_event_without_result",
        planner=ScriptedPlanner(plan),
        tools=scripted_registry(tool),
        execution=NodeExecution(retries=0, retry_delay=timedelta(0)),
        replan=False,
    )
    run = run_plan_dag(dag, {"goal": "g"})
    assert str(run.state) == "failed"
    record = xcom(run, NODES_TASK, key=NODE_KEY, map_index=0)
    assert record["status"] == "failed" and record["output"] is None
    assert record["error"] == "the done event from the job trigger has no result"
    assert record["polling"]["outcome"] == "malformed"
