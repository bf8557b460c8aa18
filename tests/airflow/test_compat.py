"""What the provider uses of Airflow's internals (:mod:`airflow_plan_provider.compat`) works on the running
Airflow, and each use falls back as documented where the internal name is missing."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from airflow_plan_provider import compat

pytestmark = pytest.mark.airflow


class Channel:
    """A task's channel to its supervisor, keeping what it is sent."""

    def __init__(self) -> None:
        self.messages: list[Any] = []

    def send(self, message: Any) -> None:
        self.messages.append(message)


def test_a_label_is_sent_as_the_rendered_map_index_on_the_tasks_channel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where this Airflow has the message (3.2 and later), the label goes on the task's channel; where it
    has none (3.1), nothing is sent and the label comes with the final state."""
    from airflow.sdk.execution_time import comms, task_runner

    channel = Channel()
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", channel, raising=False)
    message = getattr(comms, "SetRenderedMapIndex", None)
    if message is None:
        assert compat.send_rendered_map_index("a · fetch") is False
        assert channel.messages == []
    else:
        assert compat.send_rendered_map_index("a · fetch") is True
        assert channel.messages == [message(rendered_map_index="a · fetch")]


def test_without_a_channel_or_the_message_a_label_is_not_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.execution_time import comms, task_runner

    monkeypatch.delattr(task_runner, "SUPERVISOR_COMMS", raising=False)  # outside a task's process
    assert compat.send_rendered_map_index("a · fetch") is False
    channel = Channel()
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", channel, raising=False)
    monkeypatch.delattr(comms, "SetRenderedMapIndex", raising=False)  # an Airflow without the message
    assert compat.send_rendered_map_index("a · fetch") is False
    assert channel.messages == []


class PullingTi:
    """A task instance whose ``xcom_pull`` answers from a dict of map index → value."""

    def __init__(self, values: dict[int, Any]) -> None:
        self.values, self.pulls = values, []

    def xcom_pull(self, *, task_ids: str, key: str, map_indexes: int) -> Any:
        self.pulls.append((task_ids, key, map_indexes))
        return self.values.get(map_indexes)


def test_without_lazy_sequences_a_mapped_tasks_first_values_are_pulled_one_by_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "airflow.sdk.execution_time.lazy_sequence", None)  # import fails
    ti = PullingTi({0: "a", 2: "c", 3: "d"})
    assert compat.first_mapped_xcoms(ti, "fetch", "rows", 3) == ["a", None, "c"]
    assert ti.pulls == [("fetch", "rows", 0), ("fetch", "rows", 1), ("fetch", "rows", 2)]


def test_a_mapped_tasks_first_values_are_read_in_one_slice() -> None:
    """On the running Airflow, through its lazy sequence: in a task after a mapped task of four
    instances, the first three values in map-index order."""
    from airflow.sdk import DAG, task

    from airflow_plan_provider.testing.in_process import run_plan_dag
    from tests.airflow.support import xcom

    with DAG("compat_first_mapped_xcoms", schedule=None) as dag:

        @task
        def emit(value: str) -> str:
            return value

        @task
        def read(**context: Any) -> list[Any]:
            return compat.first_mapped_xcoms(context["ti"], "emit", "return_value", 3)

        emit.expand(value=["w", "x", "y", "z"]) >> read()

    run = run_plan_dag(dag, {})
    assert str(run.state) == "success"
    assert xcom(run, "read") == ["w", "x", "y"]


def test_a_trigger_reads_task_states_and_the_plan_view_reads_runs_on_this_airflow() -> None:
    """On the running Airflow: the task states read a trigger makes (here from a task, through the same
    channel) sees a finished mapped task's instances by map index, and the plan view's three queries read
    the run, a mapped task's XComs by map index, decoded, and its task instances."""
    from airflow.sdk import DAG, task
    from airflow.utils.session import create_session

    from airflow_plan_provider.testing.in_process import run_plan_dag
    from tests.airflow.support import xcom

    with DAG("compat_task_states", schedule=None) as dag:

        @task
        def emit(value: str) -> dict[str, str]:
            return {"value": value}

        @task
        def read(**context: Any) -> dict[str, Any]:
            reader = compat.task_states_reader()
            assert reader is not None
            ti = context["ti"]
            return dict(reader(dag_id=ti.dag_id, task_ids=["emit"], run_ids=[ti.run_id])[ti.run_id])

        emit.expand(value=["a", "b"]) >> read()

    run = run_plan_dag(dag, {})
    assert str(run.state) == "success"
    assert {key: str(state) for key, state in xcom(run, "read").items()} == {
        "emit_0": "success",
        "emit_1": "success",
    }

    with create_session() as session:
        runs = compat.read_runs(session, dag.dag_id, [run.run_id, "no such run"])
        values = sorted(
            (task_id, index, key, value)
            for _, task_id, index, key, value in compat.read_xcoms(
                session,
                dag.dag_id,
                [run.run_id],
                [("read", "return_value")],
                every_instance_key="return_value",
            )
        )
        instances = sorted(
            (ti.task_id, ti.map_index, str(ti.state))
            for ti in compat.read_task_instances(session, dag.dag_id, [run.run_id])
        )
        first = compat.first_task_with_xcom(
            session, dag.dag_id, run.run_id, "return_value", ["read"], ".read"
        )
    assert [(r["run_id"], str(r["state"])) for r in runs] == [(run.run_id, "success")]
    assert values[:2] == [
        ("emit", 0, "return_value", {"value": "a"}),
        ("emit", 1, "return_value", {"value": "b"}),
    ]
    assert values[2][:3] == ("read", -1, "return_value")
    assert instances == [("emit", 0, "success"), ("emit", 1, "success"), ("read", -1, "success")]
    assert first == "read"  # "emit" has the key too, but neither its id nor its suffix matches


def test_without_a_task_states_read_a_waiting_nodes_trigger_wakes_it_to_look_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncio

    from airflow_plan_provider.contract import NODES_TASK
    from airflow_plan_provider.triggers.parents import ParentsFinishedTrigger

    monkeypatch.setitem(sys.modules, "airflow.sdk.execution_time.task_runner", None)  # import fails
    assert compat.task_states_reader() is None
    trigger = ParentsFinishedTrigger(dag_id="d", run_id="r", parents={NODES_TASK: [0]}, poll_interval=0.01)

    async def first_event() -> Any:
        async for event in trigger.run():
            return event.payload

    assert asyncio.run(first_event()) == {"status": "ready"}
