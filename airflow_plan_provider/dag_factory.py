"""Build a plan-and-execute DAG in one call.

::

    dag = build_plan_dag("incident_report", planner=my_planner, tools=my_tools)

``tools`` is required: a :class:`ToolRegistry`, ``"module:attribute"``, the name of a registry installed
under the ``airflow_plan_provider.tools`` entry-point group, or ``"*"`` for every installed registry.

The DAG: ``plan`` → ``layer_0`` … ``layer_{K-1}`` (one mapped task per layer, one instance per node)
→ ``finalize`` → ``replan`` (only runs when a replan is due). Layer 0 maps over the planning task's
return value; later layers map over a tiny ``select_layer_k`` task that runs alongside layer k-1, so no
extra scheduling hop sits on the critical path. Every task retries when its worker is lost: nodes as
``node_retries`` says, the other tasks as :class:`ControlRetries` says.

Pools: Airflow gives every instance of a mapped task the task's pool. Nodes whose tool declares a pool
(``@registry.tool(pool="ticket_api")``) therefore run in a lane of their own: for each layer, beside
``layer_k``, a task ``layer_k__<pool>`` built with that pool, mapping over its own ``select_layer_k__<pool>``
task (``nodes__<pool>`` and ``select_nodes__<pool>`` in eager mode). A registry without pooled tools
builds exactly the tasks above.

Approval: with a tool marked ``needs_approval`` (or ``approval="always"``), an ``approve`` task between
``plan`` and the first node tasks waits for a human when the plan needs it, and skips itself when it
does not.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from airflow.sdk import DAG, Param, TriggerRule

from airflow_plan_provider import artifacts
from airflow_plan_provider.operators.approval import Approver, PlanApprovalOperator
from airflow_plan_provider.operators.finalize import FinalizePlanOperator
from airflow_plan_provider.operators.layout import (
    APPROVE_TASK,
    EAGER_TASK,
    FINALIZE_TASK,
    PLAN_TASK,
    REPLAN_TASK,
    dag_lanes,
    lane_task_id,
    layer_task_id,
    select_task_id,
)
from airflow_plan_provider.operators.node import NODE_LABEL, PlanNodeOperator
from airflow_plan_provider.operators.plan_task import PlanOperator
from airflow_plan_provider.operators.replan import ReplanOperator
from airflow_plan_provider.operators.retry import ToolRetryPolicy
from airflow_plan_provider.operators.select import LayerSelectOperator
from airflow_plan_provider.plan.approval import APPROVAL_MODES, ApprovalMode
from airflow_plan_provider.plan.budgets import Budgets
from airflow_plan_provider.plan.validate import Limits
from airflow_plan_provider.planners.base import Planner
from airflow_plan_provider.tools.registry import (
    ALL_INSTALLED,
    Tool,
    ToolRegistry,
    installed_registries,
    load_tools,
    missing_tools_message,
)

MAP_INDEX_TEMPLATE = "{{ " + NODE_LABEL + " | default(task.plan_node) }}"

log = logging.getLogger(__name__)
_checked_stores: set[str | None] = set()  # artifact stores already checked in this process


@dataclass(frozen=True)
class ControlRetries:
    """How the tasks around the nodes (``plan``, ``select_layer_k``, ``finalize``, ``replan``) retry.

    They fail for good on their own verdicts (an invalid plan, a failed session); a retry is for a
    lost worker (killed, evicted, out of memory) or an unexpected error, and every one of them is safe
    to run again: planning plans again (see :class:`~airflow_plan_provider.operators.plan_task.PlanOperator`
    for the plan it reuses), select and finalize recompute from what the earlier tasks recorded, and
    replan waits for the run an earlier try started instead of starting another. The default retries
    three times, five seconds apart: a lost task costs the heartbeat timeout that notices it plus a few
    seconds, not Airflow's default five minutes.

    >>> ControlRetries(retries=1, delay=timedelta(seconds=2)).task_kwargs()
    {'retries': 1, 'retry_delay': datetime.timedelta(seconds=2)}
    """

    retries: int = 3
    delay: timedelta = timedelta(seconds=5)

    def __post_init__(self) -> None:
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError(f"ControlRetries.retries must be an integer >= 0, got {self.retries!r}")
        if not isinstance(self.delay, timedelta) or self.delay < timedelta(0):
            raise ValueError(f"ControlRetries.delay must be a timedelta >= 0, got {self.delay!r}")

    def task_kwargs(self) -> dict[str, Any]:
        """The operator arguments of a control task."""
        return {"retries": self.retries, "retry_delay": self.delay}


READY_PLAN_EXAMPLE = """{
  "nodes": [
    {"id": "1", "action": "fetch yesterday's orders", "tool": "<a tool of this DAG>",
     "params": {"day": "yesterday"}},
    {"id": "2", "action": "fetch yesterday's refunds", "tool": "<a tool of this DAG>",
     "params": {"day": "yesterday"}},
    {"id": "3", "action": "compare them", "tool": "<a tool of this DAG>",
     "params": {"orders": "${1}", "refunds": "${2.items}"}}
  ],
  "edges": [{"from": "1", "to": "3"}, {"from": "2", "to": "3"}]
}"""


def plan_params(goal: str = "", budgets: Budgets | None = None) -> dict[str, Param]:
    """The trigger form: a goal, an optional ready plan, and the session budgets."""
    budgets = budgets or Budgets()
    return {
        "goal": Param(goal, type="string", title="Goal", description="What the plan should achieve."),
        "plan": Param(
            None,
            type=["null", "object"],
            title="Ready plan",
            description_md=(
                "Optional. A plan to run as given: the planner is skipped, the plan is validated as is "
                "(an invalid one is rejected with its problems) and never replanned. Each node calls one "
                "of this DAG's tools; `${ID}` passes node ID's output, `${ID.field}` part of it. "
                "Example (put this DAG's tools and params in):\n\n```json\n" + READY_PLAN_EXAMPLE + "\n```"
            ),
        ),
        "max_replans": Param(
            budgets.max_replans,
            type="integer",
            minimum=0,
            title="Max replans",
            description=(
                "How many times the session may replan the part of the plan a failed node (or a node "
                "whose result made the rest moot) affects; each replan is a new run of this DAG. "
                "0: a failed node fails the session."
            ),
        ),
        "max_steps": Param(
            budgets.max_steps,
            type="integer",
            minimum=1,
            title="Max node executions",
            description=(
                "How many node executions (tool calls) the session may make across all its runs; "
                "reused nodes do not count. Nodes past the budget are skipped and the session fails "
                "with reason step_budget."
            ),
        ),
    }


def build_plan_dag(
    dag_id: str,
    *,
    planner: Planner | None,
    tools: ToolRegistry | Mapping[str, Tool] | str | None = None,
    max_layers: int = 6,
    max_nodes: int = 200,
    max_active_nodes: int = 5,
    pool: str | None = None,
    node_retries: int = 2,
    retry_delay: timedelta = timedelta(seconds=5),
    retry_exponential_backoff: float = 2.0,
    max_retry_delay: timedelta = timedelta(minutes=5),
    node_timeout: timedelta | None = None,
    max_steps: int = 50,
    max_replans: int = 3,
    repair_attempts: int = 2,
    replan: bool = True,
    artifact_store: str | None = None,
    artifact_threshold: int = 64 * 1024,
    checkpoints: bool = True,
    eager: bool = False,
    control_retries: ControlRetries | None = None,
    approval: ApprovalMode = "risky",
    approval_timeout: timedelta | None = timedelta(days=1),
    approvers: Sequence[Approver] | str | None = None,
    plan: Mapping[str, Any] | None = None,
    goal: str = "",
    schedule: Any = None,
    params: Mapping[str, Any] | None = None,
    **dag_kwargs: Any,
) -> DAG:
    """A DAG that plans ``goal`` with ``planner`` and runs the plan with ``tools``.

    ``tools`` names the tools this DAG offers its planner and runs: a :class:`ToolRegistry` (or a
    mapping of tools), ``"module:attribute"`` naming one, or the name of a registry installed under the
    ``airflow_plan_provider.tools`` entry-point group. ``tools="*"`` is the explicit opt-in to every
    installed registry. ``None`` raises ``ValueError``: installed registries are never offered to a
    planner unless the DAG asks for them. A spec string is loaded when the DAG is built (its pooled
    tools decide the node tasks) and again in the worker; a registry is carried by the tasks and
    serialized as its tool names and catalog digest (the same on every parse).
    ``max_layers`` fixes the number of layer tasks (a deeper plan is rejected at validation);
    ``max_active_nodes`` caps the nodes running at once in one run (in each lane, see below); ``pool``
    shares a cap across runs.

    A tool declared with ``pool=`` (and optionally ``pool_slots=``) has its nodes take slots from that
    Airflow pool, across every run and worker: they run in the node tasks ``layer_k__<pool>``, built with
    that pool. A node takes slots from one pool only (Airflow gives a task one pool), so the DAG's
    ``pool`` applies to the nodes whose tool declares none, and a tool's own pool wins for its nodes.
    ``max_active_nodes`` applies to each lane's task: a layer's pooled nodes run beside its other nodes.
    ``eager=True`` maps every node in one task ``nodes`` instead of one task per layer: a node starts
    as soon as its own parents finish (waiting deferred on the triggerer), with no layer barrier.
    Outputs over ``artifact_threshold`` bytes go to ``artifact_store`` (an ObjectStoragePath URL; default
    a folder under AIRFLOW_HOME) and XCom carries a reference. ``control_retries`` (default
    ``ControlRetries()``: 3 retries, 5 s apart) is how every task other than the nodes retries.

    ``approval`` inserts a human approval task ``approve`` between ``plan`` and the first node tasks:
    ``"risky"`` (default) when a tool has ``needs_approval`` (it asks when the plan would run such a
    node), ``"always"`` (it asks for every plan), ``"never"`` (no task). A revision whose nodes were all
    approved earlier in the session does not ask again. ``approvers`` (user ids) may answer; no answer
    within ``approval_timeout`` is a rejection, and a rejection ends the session failed with reason
    ``rejected`` before any node runs.
    ``plan`` bakes a ready plan into the DAG (as ``airflow-plan freeze`` writes): each run runs it
    without calling a planner and never replans it, its strings rendered as Jinja templates with the
    run's context (say ``"{{ ds }}"``), unless the run's conf gives a plan of its own.
    """
    tools = _tools_spec(tools)
    catalog = load_tools(tools)
    lanes = dag_lanes(catalog.values())  # the pooled tools decide the node tasks
    if approval not in APPROVAL_MODES:
        raise ValueError(f"approval must be one of {APPROVAL_MODES}, not {approval!r}")
    asks_approval = approval == "always" or (
        approval == "risky" and any(tool.needs_approval for tool in catalog.values())
    )
    _check_store(artifact_store)
    dag_kwargs.setdefault("tags", ["plan"])
    dag_kwargs.setdefault("max_active_runs", 16)  # replan runs start while their parent waits
    dag_kwargs.setdefault("catchup", False)
    all_params: dict[str, Any] = {
        **plan_params(goal, Budgets(max_steps=max_steps, max_replans=max_replans)),
        **(params or {}),
    }
    node_kwargs: dict[str, Any] = {
        "tools": tools,
        "retries": node_retries,
        "retry_delay": retry_delay,
        "retry_exponential_backoff": retry_exponential_backoff,
        "max_retry_delay": max_retry_delay,
        "max_active_tis_per_dagrun": max_active_nodes,
        "map_index_template": MAP_INDEX_TEMPLATE,
        "execution_timeout": node_timeout,
        "artifact_store": artifact_store,
        "artifact_threshold": artifact_threshold,
        "checkpoints": checkpoints,
        "retry_policy": ToolRetryPolicy(),
    }
    if pool:
        node_kwargs["pool"] = pool
    control = (control_retries or ControlRetries()).task_kwargs()
    lane_kwargs: dict[str | None, dict[str, Any]] = {None: node_kwargs}
    for lane, tool in lanes.items():
        lane_kwargs[lane] = {**node_kwargs, "pool": tool.pool, "pool_slots": tool.pool_slots}
    with DAG(dag_id, schedule=schedule, params=all_params, **dag_kwargs) as dag:
        planning = PlanOperator(
            task_id=PLAN_TASK,
            eager=eager,
            planner=planner,
            tools=tools,
            repair_attempts=repair_attempts,
            limits=Limits(max_nodes=max_nodes, max_depth=max_layers),
            lanes=list(lanes),
            artifact_store=artifact_store,
            ready_plan=plan,
            **control,
        )
        approve = None
        if asks_approval:
            approve = PlanApprovalOperator(
                task_id=APPROVE_TASK,
                mode=approval,
                tools=tools,
                approvers=approvers,
                response_timeout=approval_timeout,
                **control,
            )
            planning >> approve
        # the first node tasks run after a skipped approval (none needed), never after a failed one
        first_rule = TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS if approve else TriggerRule.ALL_SUCCESS

        def node_task(base: str, lane: str | None, first: bool, after: list[Any]) -> Any:
            """The mapped task of ``lane`` of node task ``base``; the default lane of the first node task
            maps over the planning task's return value, every other over a select task of its own."""
            task_id = lane_task_id(base, lane)
            if first and lane is None:
                source = planning.output
            else:
                # runs beside the node task before (after the one before that), off the critical path
                select = LayerSelectOperator(
                    task_id=select_task_id(task_id),
                    node_task=task_id,
                    trigger_rule=TriggerRule.ALL_DONE,
                    approval_task_id=APPROVE_TASK if approve else None,
                    **control,
                )
                planning >> select
                after >> select
                if approve is not None and not after:  # a select that would start before the answer
                    approve >> select
                source = select.output
            task = PlanNodeOperator.partial(
                task_id=task_id,
                trigger_rule=first_rule if first else TriggerRule.ALL_DONE,
                **lane_kwargs[lane],
            ).expand(plan_node=source)
            if first and approve is not None:
                approve >> task
            return task

        previous: list[Any] = [planning]
        layers: list[list[Any]] = []
        for index in range(1 if eager else max_layers):
            base = EAGER_TASK if eager else layer_task_id(index)
            before_previous = layers[index - 2] if index >= 2 else []
            group = [node_task(base, lane, index == 0, before_previous) for lane in lane_kwargs]
            for task in group:
                previous >> task
            previous = group
            layers.append(group)
        finalize = FinalizePlanOperator(
            task_id=FINALIZE_TASK,
            trigger_rule=TriggerRule.ALL_DONE,
            replan_task_id=REPLAN_TASK if replan else None,
            **control,
        )
        [planning, *previous] >> finalize
        if replan:
            finalize >> ReplanOperator(task_id=REPLAN_TASK, trigger_dag_id=dag_id, **control)
    return dag


def _check_store(artifact_store: str | None) -> None:
    """Warn (once per process and store) when the artifact store is not shared by every worker."""
    if artifact_store in _checked_stores:
        return
    _checked_stores.add(artifact_store)
    warning = artifacts.local_store_warning(artifact_store)
    if warning:
        log.warning("%s", warning)


def _tools_spec(tools: ToolRegistry | Mapping[str, Tool] | str | None) -> ToolRegistry | str:
    """What the tasks carry: a registry (stable ``repr``) or a spec string, checked at DAG build."""
    if tools is None:
        raise ValueError(missing_tools_message())
    if isinstance(tools, ToolRegistry):
        return tools
    if isinstance(tools, Mapping):
        return ToolRegistry(list(tools.values()))
    if not isinstance(tools, str) or not tools.strip():
        raise ValueError(f"tools must be a ToolRegistry or a non-empty spec string, not {tools!r}")
    if tools != ALL_INSTALLED and ":" not in tools and tools not in installed_registries():
        raise ValueError(f"no tool registry named {tools!r}; installed: {installed_registries()}")
    return tools
