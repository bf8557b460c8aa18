"""Plan DAGs with a risky tool, for the approval end-to-end tests (tests/e2e/test_approval.py).

``purge`` and ``notify`` need approval; ``read`` and ``probe`` do not. Only ``alice`` may answer.
Every DAG logs its tool calls to ``$PLAN_E2E_CALL_LOG/<dag_id>``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow_plan_provider import ApprovalPolicy, NodeExecution, build_plan_dag
from airflow_plan_provider.testing import CallLog, ScriptedPlanner, ScriptedTool, scripted_registry

CALL_LOG_ENV = "PLAN_E2E_CALL_LOG"  # the folder the test gives every process for call logs

SECRET = "sk-e2e-approval-secret-0042"  # a param value the approval request must not show
#: the node tasks' settings every DAG here starts from
NODES: dict[str, Any] = {"retry_delay": timedelta(seconds=1), "retries": 0}
COMMON: dict[str, Any] = {"tags": ["e2e"]}


def call_log(dag_id: str) -> CallLog:
    return CallLog.in_folder_of(CALL_LOG_ENV, dag_id)


def tools(dag_id: str, probe_replans: bool = False) -> Any:
    log = call_log(dag_id)
    return scripted_registry(
        ScriptedTool("read", log=log, returns={"rows": 3}),
        ScriptedTool(
            "probe", log=log, returns={"found": 0}, replan="nothing found" if probe_replans else None
        ),
        ScriptedTool("purge", log=log, returns={"purged": 3}, side_effect=True, needs_approval=True),
        ScriptedTool("notify", log=log, returns="sent", needs_approval=True),
    )


def purge_plan(first_tool: str = "read") -> dict[str, Any]:
    return {
        "goal": "purge the stale rows",
        "nodes": [
            {"id": "1", "action": "count stale rows", "tool": first_tool, "params": {}},
            {
                "id": "2",
                "action": "purge stale rows",
                "tool": "purge",
                "params": {"rows": "${1}", "table": "payments_stale", "api_token": SECRET},
            },
        ],
        "edges": [],
    }


# Rejected in one run, approved in another.
e2e_approval = build_plan_dag(
    "e2e_approval",
    planner=ScriptedPlanner(purge_plan()),
    tools=tools("e2e_approval"),
    approval=ApprovalPolicy(approvers=["alice"], timeout=timedelta(minutes=10)),
    execution=NodeExecution(**NODES),
    **COMMON,
)

# Nobody answers within 10 s: a rejection.
e2e_approval_timeout = build_plan_dag(
    "e2e_approval_timeout",
    planner=ScriptedPlanner(purge_plan()),
    tools=tools("e2e_approval_timeout"),
    approval=ApprovalPolicy(approvers=["alice"], timeout=timedelta(seconds=10)),
    execution=NodeExecution(**NODES),
    **COMMON,
)

# Node 1 asks for a replan; the new revision keeps node 2 as it was (approved: not asked again) and
# adds node 3, a new risky node: revision 1 asks again, for node 3 only.
e2e_approval_replan = build_plan_dag(
    "e2e_approval_replan",
    planner=ScriptedPlanner(
        purge_plan(first_tool="probe"),
        on_error=[
            (
                "nothing found",
                {
                    "nodes": [
                        purge_plan()["nodes"][1],
                        {
                            "id": "3",
                            "action": "tell the owners",
                            "tool": "notify",
                            "params": {"to": "owners"},
                        },
                    ],
                    "edges": [{"from": "1", "to": "2"}, {"from": "2", "to": "3"}],
                },
            )
        ],
    ),
    tools=tools("e2e_approval_replan", probe_replans=True),
    approval=ApprovalPolicy(approvers=["alice"], timeout=timedelta(minutes=10)),
    execution=NodeExecution(**NODES),
    **COMMON,
)
