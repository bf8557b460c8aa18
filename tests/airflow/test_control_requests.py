"""What the plan DAG's control tasks ask the API server for (dag.test): each XCom read and write is a
request, paid once per session, with ten sessions starting together on a small deployment.

- finalize of a DAG built without approval reads no approval (there is no approve task to read);
- finalize pushes the session's result once, whether it then skips the replan task (which ends its
  try) or the DAG has no replan task (a returned result would be pushed a second time);
- the planning task of a DAG whose runs give their goal in the conf has no template field, so Airflow
  sends (and keeps) no rendered fields for it (a task group's planning task renders its goal:
  ``test_task_group.py``).

The planning task's first try looks for no kept reply: ``test_control_retries.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_plan_provider.contract import APPROVE_TASK, FINALIZE_TASK, NODES_TASK, RESULT_KEY
from airflow_plan_provider.testing import CallLog, ScriptedTool, scripted_registry
from airflow_plan_provider.testing.in_process import run_plan_dag
from tests.airflow.support import run_xcoms, xcom

pytestmark = pytest.mark.airflow

PLAN = {
    "nodes": [
        {"id": "a", "action": "first", "tool": "emit", "params": {"value": 1}},
        {"id": "b", "action": "second", "tool": "emit", "params": {"value": "${a}"}},
    ],
    "edges": [{"from": "a", "to": "b"}],
}


@pytest.mark.parametrize("replan", [True, False], ids=["replan task skipped", "no replan task"])
def test_control_tasks_read_and_write_nothing_they_do_not_need(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, replan: bool
) -> None:
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    from airflow_plan_provider.dag_factory import build_plan_dag

    reads: list[tuple[Any, str]] = []
    pull = RuntimeTaskInstance.xcom_pull

    def counted_pull(self: Any, task_ids: Any = None, *args: Any, **kwargs: Any) -> Any:
        if self.task_id == FINALIZE_TASK:
            reads.append((task_ids, kwargs.get("key", args[1] if len(args) > 1 else RESULT_KEY)))
        return pull(self, task_ids, *args, **kwargs)

    monkeypatch.setattr(RuntimeTaskInstance, "xcom_pull", counted_pull)
    log = CallLog(tmp_path)
    tools = scripted_registry(ScriptedTool("emit", log=log, returns=lambda params: params["value"]))
    dag = build_plan_dag(f"control_requests_{replan}", planner=None, tools=tools, replan=replan)
    run = run_plan_dag(dag, {"goal": "two steps", "plan": PLAN})
    assert str(run.state) == "success" and log.count("emit") == 2
    assert xcom(run, FINALIZE_TASK)["status"] == "completed"
    assert reads and all(task_ids != APPROVE_TASK for task_ids, _ in reads), reads
    # and, skipping the replan task, Airflow's record of the branch it followed (none)
    expected = [RESULT_KEY, "skipmixin_key"] if replan else [RESULT_KEY]
    assert sorted(key for task_id, _, key in run_xcoms(run) if task_id == FINALIZE_TASK) == expected
    assert rendered_task_ids(run) == {NODES_TASK}  # the nodes' resolved params, the planning task none


def rendered_task_ids(run: Any) -> set[str]:
    """The tasks of ``run`` whose rendered fields Airflow keeps."""
    from tests.airflow.support import rendered_fields

    return {task_id for task_id, _ in rendered_fields(run)}
