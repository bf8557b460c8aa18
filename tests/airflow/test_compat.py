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
    from airflow.sdk.execution_time import task_runner
    from airflow.sdk.execution_time.comms import SetRenderedMapIndex

    channel = Channel()
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", channel, raising=False)
    assert compat.send_rendered_map_index("a · fetch") is True
    assert channel.messages == [SetRenderedMapIndex(rendered_map_index="a · fetch")]


def test_without_a_channel_or_the_message_a_label_is_not_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.execution_time import comms, task_runner

    monkeypatch.delattr(task_runner, "SUPERVISOR_COMMS", raising=False)  # outside a task's process
    assert compat.send_rendered_map_index("a · fetch") is False
    channel = Channel()
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", channel, raising=False)
    monkeypatch.delattr(comms, "SetRenderedMapIndex")  # an Airflow without the message
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
