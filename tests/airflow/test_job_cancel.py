"""An asynchronous tool's job is cancelled when its node's task is killed: by the node's ``on_kill``
while the task runs, by the job trigger's ``on_kill`` while the task waits deferred (a user marked it
failed or cleared it), with the tool's ``cancel`` function."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_plan_provider.contract import NODES_TASK
from airflow_plan_provider.tools.jobs import JobStatus, callable_path
from airflow_plan_provider.tools.registry import ToolRegistry

pytestmark = pytest.mark.airflow

CANCELLED: list[Any] = []  # the handles cancel_export was called with


def poll_export(handle: Any) -> JobStatus:
    return JobStatus.pending()


def cancel_export(handle: Any) -> None:
    CANCELLED.append(handle)


def cancel_refused(handle: Any) -> None:
    raise RuntimeError(f"job {handle['job']} is already finishing")


def registry(cancel: Any = cancel_export) -> ToolRegistry:
    tools = ToolRegistry()

    @tools.tool(poll=poll_export, cancel=cancel, poll_interval=1)
    def export(table: str) -> dict[str, str]:
        """Start an export."""
        return {"job": f"export-{table}"}

    return tools


@pytest.fixture(autouse=True)
def _no_cancels_yet() -> None:
    CANCELLED.clear()


class PushingTi:
    def __init__(self) -> None:
        self.pushed: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value


def deferred_node(cancel: Any = cancel_export) -> tuple[Any, Any]:
    """A node operator whose try started its tool's job and deferred to the job's trigger (TaskDeferred
    caught), and that trigger."""
    from airflow.sdk.exceptions import TaskDeferred

    from airflow_plan_provider.contract import POLLING_KEY
    from airflow_plan_provider.operators.node import PlanNodeOperator
    from airflow_plan_provider.plan.node_step import JobWait

    operator = PlanNodeOperator(task_id=NODES_TASK, plan_node={})
    tool = registry(cancel)["export"]
    job = JobWait({"job": "export-t"}, {"handle": {"job": "export-t"}, "timeout": 60}, None, [], [], tool)
    run = SimpleNamespace(ti=PushingTi(), node=SimpleNamespace(id="n"))
    with pytest.raises(TaskDeferred) as deferred:
        operator._defer_to_job(run, job)
    assert run.ti.pushed[POLLING_KEY]["handle"] == {"job": "export-t"}  # the job wait, in XCom
    return operator, deferred.value.trigger


def test_a_node_killed_while_its_job_runs_cancels_the_job_once() -> None:
    operator, _trigger = deferred_node()
    operator.on_kill()
    assert CANCELLED == [{"job": "export-t"}]
    operator.on_kill()  # killed again (SIGTERM, then the timeout): cancelled once
    assert CANCELLED == [{"job": "export-t"}]


def test_a_node_killed_before_any_job_cancels_nothing() -> None:
    from airflow_plan_provider.operators.node import PlanNodeOperator

    PlanNodeOperator(task_id=NODES_TASK, plan_node={}).on_kill()
    assert CANCELLED == []


def test_a_deferred_node_killed_by_a_user_has_its_trigger_cancel_the_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow_plan_provider.triggers.job import ToolJobTrigger

    said: list[str] = []
    logger = SimpleNamespace(
        info=lambda message, *args: said.append(message % args),
        warning=lambda message, *args: said.append(message % args),
    )
    monkeypatch.setattr(ToolJobTrigger, "log", property(lambda self: logger))
    _operator, trigger = deferred_node()
    assert trigger.serialize()[1]["cancel_path"] == f"{__name__}.cancel_export"
    asyncio.run(trigger.on_kill())
    assert CANCELLED == [{"job": "export-t"}]
    _operator, refusing = deferred_node(cancel_refused)
    asyncio.run(refusing.on_kill())  # a cancel that raises is logged, not raised
    assert said == [
        "node n: the job was cancelled",
        "node n: the job was not cancelled: cancel raised RuntimeError: job export-t is already finishing",
    ]


def test_a_tool_without_cancel_leaves_its_job_alone() -> None:
    from airflow_plan_provider.triggers.job import ToolJobTrigger

    operator, trigger = deferred_node(cancel=None)
    assert trigger.serialize()[1]["cancel_path"] is None
    operator.on_kill()
    asyncio.run(trigger.on_kill())
    assert CANCELLED == []
    assert ToolJobTrigger(poll_path=callable_path(poll_export), handle={}).cancel_path is None  # as before


def test_cancel_is_a_module_level_function_of_an_asynchronous_tool() -> None:
    tools = ToolRegistry()
    with pytest.raises(ValueError, match="cancel stops a job, so it needs poll"):
        tools.tool(lambda table: None, name="sync", cancel=cancel_export)
    with pytest.raises(ValueError, match="must be a module-level function"):
        tools.tool(lambda table: None, name="nested", poll=poll_export, cancel=lambda handle: None)
