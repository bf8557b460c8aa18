"""Build a plan-and-execute DAG in one call, or a plan as a task group inside a DAG of your own.

::

    dag = build_plan_dag("incident_report", planner=my_planner, tools=my_tools)

    with DAG("nightly", schedule="@daily") as dag:
        extract() >> plan_task_group("triage", planner=my_planner, tools=my_tools, goal=GOAL) >> publish()

``tools`` is required: a :class:`ToolRegistry`, ``"module:attribute"``, the name of a registry installed
under the ``airflow_plan_provider.tools`` entry-point group, or ``"*"`` for every installed registry.
Settings come as a few validated objects (:mod:`airflow_plan_provider.settings`): ``limits``,
``budgets``, ``execution``, ``artifacts``, ``control_retries``, ``approval``; ``operator_args`` is passed
to every task built here.

The tasks: ``plan`` → ``nodes`` → ``finalize`` → ``replan`` (only runs when a replan is due; only in
:func:`build_plan_dag`). ``nodes`` is one mapped task, one instance per node of the plan, in the plan's
topological order. There is no layer barrier: each node starts when its own parents finish, waiting
for them in its slot while they run (see :class:`~airflow_plan_provider.operators.node.PlanNodeOperator`).
Every task retries when its worker is lost: nodes as ``NodeExecution`` says, the other tasks as
:class:`ControlRetries` says.

Pools: Airflow gives every instance of a mapped task the task's pool. Nodes whose tool declares a pool
(``@registry.tool(pool="ticket_api")``) therefore run in a lane of their own: beside ``nodes``, a task
``nodes__<pool>`` built with that pool, mapping over its own ``select_nodes__<pool>`` task. A registry
without pooled tools builds exactly the tasks above.

Nodes started on the triggerer (``NodeExecution(start_on_triggerer=True)``, where Airflow offers it):
beside each lane's task, a task ``nodes__after`` (``nodes__<pool>__after``) for the lane's nodes that
have parents, mapping over its own ``select_`` task; Airflow starts its instances on the triggerer
(:class:`~airflow_plan_provider.triggers.start.NodeStartTrigger`).

Sessions in turn: every task built here weighs its instances with
:class:`~airflow_plan_provider.sessions_in_turn.SessionsInTurn` (:data:`SESSIONS_IN_TURN`): when runs
share slots, an earlier session's instances go first. ``operator_args={"weight_rule": ...}`` replaces it.

Approval: with a tool marked ``needs_approval`` (or ``ApprovalPolicy("always")``), an ``approve`` task
between ``plan`` and the first node tasks waits for a human when the plan needs it, and skips itself when
it does not.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow.sdk import DAG, TaskGroup, TriggerRule

from airflow_plan_provider import airflow_features
from airflow_plan_provider.artifacts import local_store_warning
from airflow_plan_provider.contract import (
    APPROVE_TASK,
    FINALIZE_TASK,
    PLAN_TASK,
    REPLAN_TASK,
    after_lane,
    dag_lanes,
    lane_task_id,
    select_task_id,
)
from airflow_plan_provider.operators.finalize import FinalizePlanOperator
from airflow_plan_provider.operators.node import PlanNodeOperator
from airflow_plan_provider.operators.plan_task import PlanOperator
from airflow_plan_provider.operators.replan import ReplanOperator
from airflow_plan_provider.operators.select import LaneSelectOperator
from airflow_plan_provider.plan.budgets import Budgets
from airflow_plan_provider.plan.validate import Limits
from airflow_plan_provider.settings import (
    ApprovalPolicy,
    ArtifactStore,
    ControlRetries,
    NodeExecution,
    check_operator_args,
)
from airflow_plan_provider.tools.registry import (
    ALL_INSTALLED,
    ToolRegistry,
    installed_registries,
    load_tools,
    missing_tools_message,
)
from airflow_plan_provider.tools.sources import ToolSource
from airflow_plan_provider.tools.tool import Tool
from airflow_plan_provider.trigger_form import plan_params as plan_params  # the form, where it was
from airflow_plan_provider.trigger_form import tools_markdown as tools_markdown

if TYPE_CHECKING:
    from airflow_plan_provider.planners.base import Planner

# an instance's label, ``id · action``, from its mapped value (contract.mapped_label); when Airflow gets it:
# PlanNodeOperator.instance_label
MAP_INDEX_TEMPLATE = "{{ task.instance_label }}"
# the weight rule of every task built here, by the name the plugin registers it under (a DAG file does not
# import the scheduler's side of it)
SESSIONS_IN_TURN = "airflow_plan_provider.sessions_in_turn.SessionsInTurn"

log = logging.getLogger(__name__)
_checked_stores: set[str | None] = set()  # artifact stores already checked in this process


@dataclass(frozen=True)
class _PlanTasks:
    """Everything the plan's tasks are built from, checked: shared by the DAG and the task group forms."""

    planner: Planner | None
    tools: ToolRegistry | str
    lanes: dict[str, Tool | ToolSource]
    starts_on_triggerer: bool  # the nodes with parents start on the triggerer (lanes ``..after``)
    limits: Limits
    budgets: Budgets
    execution: NodeExecution
    artifacts: ArtifactStore
    control: dict[str, Any]
    approval: ApprovalPolicy
    asks_approval: bool
    repair_attempts: int
    operator_args: dict[str, Any]
    ready_plan: Mapping[str, Any] | None
    catalog: ToolRegistry  # the tools, as loaded when the DAG is built (listed in the trigger form)

    @classmethod
    def check(
        cls,
        planner: Planner | None,
        tools: ToolRegistry | Mapping[str, Tool] | str | None,
        *,
        limits: Limits | None,
        budgets: Budgets | None,
        execution: NodeExecution | None,
        artifacts: ArtifactStore | None,
        control_retries: ControlRetries | None,
        approval: ApprovalPolicy | None,
        repair_attempts: int,
        operator_args: Mapping[str, Any] | None,
        plan: Mapping[str, Any] | None,
    ) -> _PlanTasks:
        limits = _setting("limits", limits, Limits)
        _check_map_length(limits.max_nodes)
        execution = _setting("execution", execution, NodeExecution)
        approval = _setting("approval", approval, ApprovalPolicy)
        spec = _tools_spec(tools)
        catalog = load_tools(spec)
        # a source's tools are known when a run plans: a source whose tools may be risky asks for the task
        asks = approval.mode == "always" or (
            approval.mode == "risky"
            and (
                any(tool.needs_approval for tool in catalog.values())
                or any(source.may_need_approval for source in catalog.sources)
            )
        )
        artifacts = _setting("artifacts", artifacts, ArtifactStore)
        _check_store(artifacts.url)
        lanes = dag_lanes([*catalog.values(), *catalog.sources])  # pooled tools and sources: node tasks
        return cls(
            planner=planner,
            tools=spec,
            lanes=lanes,
            starts_on_triggerer=_starts_on_triggerer(execution, lanes),
            limits=limits,
            budgets=_setting("budgets", budgets, Budgets),
            execution=execution,
            artifacts=artifacts,
            control=_setting("control_retries", control_retries, ControlRetries).task_kwargs(),
            approval=approval,
            asks_approval=asks,
            repair_attempts=repair_attempts,
            operator_args={"weight_rule": SESSIONS_IN_TURN, **check_operator_args(operator_args)},
            ready_plan=plan,
            catalog=catalog,
        )

    def build(self, *, goal: str | None, replan_dag_id: str | None) -> None:
        """Add the tasks to the DAG or task group being defined.

        ``goal`` is the planning task's own goal (the task group form), ``None`` to read it from the run's
        conf and Params (the DAG form); ``replan_dag_id`` adds the ``replan`` task, which starts runs of
        that DAG.
        """
        control = {**self.operator_args, **self.control}
        planning = self._planning_task(goal, control)
        approve = self._approve_task(planning, control)
        lanes_tasks = [
            self._node_task(lane, kwargs, planning, approve, control)
            for lane, kwargs in self._lane_kwargs().items()
        ]
        finalize = FinalizePlanOperator(
            task_id=FINALIZE_TASK,
            trigger_rule=TriggerRule.ALL_DONE,
            replan_task_id=REPLAN_TASK if replan_dag_id else None,
            **control,
        )
        [planning, *lanes_tasks] >> finalize
        if replan_dag_id:
            finalize >> ReplanOperator(task_id=REPLAN_TASK, trigger_dag_id=replan_dag_id, **control)

    def _lane_kwargs(self) -> dict[str | None, dict[str, Any]]:
        """Each lane's node task arguments: the default lane's (None), and a pool's lane's with its pool."""
        node_kwargs: dict[str, Any] = {
            **self.operator_args,
            **node_execution_kwargs(self.execution),
            **self.artifacts.task_kwargs(),
            "tools": self.tools,
            "map_index_template": MAP_INDEX_TEMPLATE,
            **node_retry_policy(),
        }
        lane_kwargs: dict[str | None, dict[str, Any]] = {None: node_kwargs}
        for lane, tool in self.lanes.items():
            lane_kwargs[lane] = {**node_kwargs, "pool": tool.pool, "pool_slots": tool.pool_slots}
        if self.starts_on_triggerer:
            for first, kwargs in list(lane_kwargs.items()):
                lane_kwargs[after_lane(first)] = kwargs
        return lane_kwargs

    def _start_on_triggerer(self, task: Any) -> None:
        """Have Airflow start the instances of mapped node task ``task`` on the triggerer, all with the
        same trigger arguments (:class:`NodeStartTrigger` reads each node's brief by its map index). Set on
        the mapped task itself, which the scheduler reads and Airflow serializes field by field (an
        operator argument would be serialized as its ``repr``)."""
        from airflow.triggers.base import StartTriggerArgs

        from airflow_plan_provider.triggers.start import NodeStartTrigger

        trigger_cls, trigger_kwargs = NodeStartTrigger(
            checkpoints=self.artifacts.checkpoints, artifact_store=self.artifacts.url
        ).serialize()
        task.start_from_trigger = True
        task.start_trigger_args = StartTriggerArgs(
            trigger_cls=trigger_cls,
            trigger_kwargs=trigger_kwargs,
            next_method="resume_after_parents",
            next_kwargs={"started_on_triggerer": True},
            timeout=None,
        )

    def _planning_task(self, goal: str | None, control: Mapping[str, Any]) -> PlanOperator:
        return PlanOperator(
            task_id=PLAN_TASK,
            planner=self.planner,
            tools=self.tools,
            repair_attempts=self.repair_attempts,
            limits=self.limits,
            budgets=self.budgets,
            goal=goal,
            lanes=list(self.lanes),
            start_on_triggerer=self.starts_on_triggerer,
            artifact_store=self.artifacts.url,
            ready_plan=self.ready_plan,
            **control,
        )

    def _approve_task(self, planning: PlanOperator, control: Mapping[str, Any]) -> Any:
        """The ``approve`` task after ``planning``, when the DAG asks for approval; else None."""
        if not self.asks_approval:
            return None
        # imported only by the DAGs that ask for approval: every task of a DAG parses its file
        from airflow_plan_provider.operators.approval import PlanApprovalOperator

        approve = PlanApprovalOperator(
            task_id=APPROVE_TASK,
            mode=self.approval.mode,
            tools=self.tools,
            approvers=self.approval.approvers,
            response_timeout=self.approval.timeout,
            **control,
        )
        planning >> approve
        return approve

    def _node_task(
        self,
        lane: str | None,
        kwargs: Mapping[str, Any],
        planning: PlanOperator,
        approve: Any,
        control: Mapping[str, Any],
    ) -> Any:
        """The mapped task of ``lane``: the default lane maps over the planning task's return value, a
        pool's lane over a select task of its own, which runs beside the default lane. Both run after a
        skipped approval (none needed), never after a failed one."""
        first_rule = TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS if approve else TriggerRule.ALL_SUCCESS
        task_id = lane_task_id(lane)
        if lane is None:
            source = planning.output
        else:
            select = LaneSelectOperator(
                task_id=select_task_id(task_id),
                node_task=task_id,
                trigger_rule=first_rule,
                approval_task_id=APPROVE_TASK if approve else None,
                **control,
            )
            planning >> select
            if approve is not None:
                approve >> select
            source = select.output
        task = PlanNodeOperator.partial(task_id=task_id, trigger_rule=first_rule, **kwargs).expand(
            plan_node=source
        )
        if self.starts_on_triggerer and lane not in (None, *self.lanes):  # a lane's nodes with parents
            self._start_on_triggerer(task)
        planning >> task
        if approve is not None:
            approve >> task
        return task


def build_plan_dag(
    dag_id: str,
    *,
    planner: Planner | None,
    tools: ToolRegistry | Mapping[str, Tool] | str | None = None,
    goal: str = "",
    plan: Mapping[str, Any] | None = None,
    limits: Limits | None = None,
    budgets: Budgets | None = None,
    execution: NodeExecution | None = None,
    artifacts: ArtifactStore | None = None,
    control_retries: ControlRetries | None = None,
    approval: ApprovalPolicy | None = None,
    replan: bool = True,
    repair_attempts: int = 2,
    operator_args: Mapping[str, Any] | None = None,
    schedule: Any = None,
    params: Mapping[str, Any] | None = None,
    **dag_kwargs: Any,
) -> DAG:
    """A DAG that plans ``goal`` with ``planner`` and runs the plan with ``tools``.

    :param dag_id: the DAG's id.
    :param planner: the planner; ``None`` runs only ready plans (``plan``, or one given in the conf).
    :param tools: the tools this DAG offers its planner and runs: a :class:`ToolRegistry` (or a mapping
        of tools), ``"module:attribute"`` naming one, or the name of a registry installed under the
        ``airflow_plan_provider.tools`` entry-point group. ``"*"`` is the explicit opt-in to every
        installed registry; ``None`` raises ``ValueError``. A spec string is loaded when the DAG is
        built (its pooled tools decide the node tasks) and again in the worker; a registry is carried by
        the tasks and serialized as its tool names and catalog digest (the same on every parse).
    :param goal: the trigger form's default goal.
    :param plan: a ready plan baked into the DAG (as ``airflow-plan freeze`` writes): each run runs it
        without calling a planner and never replans it, its strings rendered as Jinja templates with
        the run's context (say ``"{{ ds }}"``). The trigger form then has only the step budget (the
        session's goal is the plan's), and a run whose conf gives a plan is refused (its planning
        fails): the DAG runs only its own plan.
    :param limits: plan size limits (default ``Limits()``), the same ``airflow-plan validate`` applies:
        ``max_nodes`` (at most Airflow's ``[core] max_map_length``), no depth limit.
    :param budgets: the trigger form's default budgets (default ``Budgets()``); a run's conf may set its
        own.
    :param execution: how the nodes run (default ``NodeExecution()``): retries, timeout,
        ``max_active_nodes`` (per run, in each node task), ``pool`` (shared across runs, for nodes whose
        tool declares no pool: a tool's own ``pool=`` wins for its nodes, which run in lane tasks
        ``nodes__<pool>``), ``slot_wait`` (how long a node waits in its slot for running parents).
    :param artifacts: where outputs over ``threshold`` bytes and checkpoints go (default
        ``ArtifactStore()``); XCom carries a reference to a stored output.
    :param control_retries: how every task other than the nodes retries (default ``ControlRetries()``:
        3 retries, 5 s apart).
    :param approval: the ``approve`` task (default ``ApprovalPolicy()``: ask before running a node whose
        tool has ``needs_approval``). A revision whose nodes were all approved earlier in the session
        does not ask again; a rejection (or no answer in time) ends the session failed with reason
        ``rejected`` before any node runs.
    :param replan: whether a failed node (or one whose result makes the rest moot) starts a replan run.
    :param repair_attempts: how many times invalid plans go back to the planner in one revision.
    :param operator_args: passed to every task built here (``owner``, ``queue``, callbacks, ...); the
        arguments the settings own (``retries``, ``pool``, ``execution_timeout``, ...) are refused with
        the setting to use instead.
    :param schedule: the DAG's schedule.
    :param params: more Params, beside the trigger form's ``goal``, ``plan``, ``max_replans`` and
        ``max_steps`` (the fields that apply: see :func:`~airflow_plan_provider.trigger_form.plan_params`).
    :param dag_kwargs: passed to :class:`~airflow.sdk.DAG` (``tags`` default ``["plan"]``,
        ``max_active_runs`` 16, ``catchup`` False).
    """
    tasks = _PlanTasks.check(
        planner,
        tools,
        limits=limits,
        budgets=budgets,
        execution=execution,
        artifacts=artifacts,
        control_retries=control_retries,
        approval=approval,
        repair_attempts=repair_attempts,
        operator_args=operator_args,
        plan=plan,
    )
    dag_kwargs.setdefault("tags", ["plan"])
    dag_kwargs.setdefault("max_active_runs", 16)  # replan runs start while their parent waits
    dag_kwargs.setdefault("catchup", False)
    # a frozen plan DAG runs its own plan only: no goal, ready plan or replan budget to give
    form = plan_params(goal, tasks.budgets, tasks.catalog, frozen=plan is not None, replans=replan)
    all_params: dict[str, Any] = {**form, **(params or {})}
    with DAG(dag_id, schedule=schedule, params=all_params, **dag_kwargs) as dag:
        tasks.build(goal=None, replan_dag_id=dag_id if replan else None)
    return dag


class PlanTaskGroup(TaskGroup):
    """The task group :func:`plan_task_group` returns: a :class:`TaskGroup` whose :attr:`result` is the
    session's :class:`~airflow_plan_provider.plan.result.SessionResult` (as a dict)."""

    @property
    def result(self) -> Any:
        """The ``finalize`` task's return value: pass it to a task after the group (it also sets the
        dependency)."""
        finalize: Any = self.children[self.child_id(FINALIZE_TASK)]  # type: ignore[no-untyped-call]
        return finalize.output


def plan_task_group(
    group_id: str,
    *,
    planner: Planner | None,
    tools: ToolRegistry | Mapping[str, Tool] | str | None = None,
    goal: str = "",
    plan: Mapping[str, Any] | None = None,
    limits: Limits | None = None,
    budgets: Budgets | None = None,
    execution: NodeExecution | None = None,
    artifacts: ArtifactStore | None = None,
    control_retries: ControlRetries | None = None,
    approval: ApprovalPolicy | None = None,
    repair_attempts: int = 2,
    operator_args: Mapping[str, Any] | None = None,
    **group_kwargs: Any,
) -> PlanTaskGroup:
    """A plan as a task group inside a DAG of your own, between your own tasks::

        with DAG("nightly_triage", schedule="@daily") as dag:
            triage = plan_task_group("triage", planner=planner, tools=registry, goal="why did {{ ds }} fail?")
            extract() >> triage
            publish(triage.result)

    The group holds the same tasks as :func:`build_plan_dag`'s DAG, their ids prefixed by the group's
    (``triage.plan``, ``triage.nodes``, ``triage.finalize``), and ends with ``finalize``, whose return
    value (:attr:`PlanTaskGroup.result`) is the session's result; a session that fails fails
    ``finalize``, so the tasks after the group do not run (as after any failed task).

    A plan in a group never replans: a replan is a new run of the whole DAG, which would run your own
    tasks again. A node that fails for good ends the session with reason ``node_failed``; use
    :func:`build_plan_dag` for sessions that replan.

    The group's goal is ``goal``, rendered as a Jinja template with the run's context (so it may quote
    what an upstream task pushed); its budgets are ``budgets`` (``max_replans`` does not apply). The
    run's conf belongs to your DAG: the group reads no goal, ready plan, budgets or session from it.
    The other settings are those of :func:`build_plan_dag`; ``group_kwargs`` go to the
    :class:`~airflow.sdk.TaskGroup` (``tooltip``, ``ui_color``, ...).
    """
    tasks = _PlanTasks.check(
        planner,
        tools,
        limits=limits,
        budgets=budgets,
        execution=execution,
        artifacts=artifacts,
        control_retries=control_retries,
        approval=approval,
        repair_attempts=repair_attempts,
        operator_args=operator_args,
        plan=plan,
    )
    if not isinstance(goal, str):
        raise ValueError(f"goal must be a string (a Jinja template), not {goal!r}")
    group = PlanTaskGroup(group_id, **group_kwargs)
    with group:
        tasks.build(goal=goal, replan_dag_id=None)
    return group


def _setting(name: str, value: Any, kind: type[Any]) -> Any:
    """``value``, or the default ``kind()`` when it is None; a value of another type is a clear error."""
    if value is None:
        return kind()
    if not isinstance(value, kind):
        raise ValueError(f"{name} must be {kind.__name__}(...) (or None for the defaults), not {value!r}")
    return value


def _check_store(artifact_store: str | None) -> None:
    """Warn (once per process and store) when the artifact store is not shared by every worker.

    Only where the DAG processor parses the file: a task process parses it too, before its task runs
    (Airflow's parsing context then names the task), and every node's log would open with the same
    warning; the planning task warns in its own log once per run instead."""
    from airflow.sdk import get_parsing_context

    if artifact_store in _checked_stores or get_parsing_context().task_id is not None:
        return
    _checked_stores.add(artifact_store)
    warning = local_store_warning(artifact_store)
    if warning:
        log.warning("%s", warning)


def _starts_on_triggerer(execution: NodeExecution, lanes: Mapping[str, Any]) -> bool:
    """Whether the DAG's nodes with parents start on the triggerer: asked for, and offered by this
    Airflow (elsewhere they start in a slot, and a warning says so). Raises ``ValueError`` when a pool's
    lane would share its task with another lane's nodes that start on the triggerer."""
    if not execution.start_on_triggerer:
        return False
    if not airflow_features.starts_mapped_on_triggerer():
        from airflow.sdk import get_parsing_context

        if get_parsing_context().task_id is None:  # the DAG processor's parse, not each task's
            log.warning(
                "NodeExecution(start_on_triggerer=True): this Airflow starts no mapped task instance on the "
                "triggerer; nodes start in a slot"
            )
        return False
    for lane in lanes:
        for other in (None, *lanes):
            if lane == after_lane(other):
                raise ValueError(
                    f"pool lane {lane!r} would share its node task {lane_task_id(lane)!r} with the nodes of "
                    f"lane {other or 'nodes'!r} that start on the triggerer: rename the pool"
                )
    return True


def _check_map_length(max_nodes: int) -> None:
    """Every node of a plan may be an instance of the one node task: Airflow must be able to map them."""
    longest = airflow_features.sdk_conf().getint("core", "max_map_length")
    if max_nodes > longest:
        raise ValueError(
            f"Limits.max_nodes={max_nodes} is more than Airflow maps in one task "
            f"([core] max_map_length={longest})"
        )


def node_execution_kwargs(execution: NodeExecution) -> dict[str, Any]:
    """The node tasks' arguments from ``execution``, in the running Airflow's terms: before Airflow 3.2,
    ``retry_exponential_backoff`` is a switch (any multiplier but 0 doubles each delay)."""
    kwargs = execution.task_kwargs()
    if not airflow_features.retry_backoff_multiplier():
        kwargs["retry_exponential_backoff"] = bool(kwargs["retry_exponential_backoff"])
    return kwargs


def node_retry_policy() -> dict[str, Any]:
    """The node tasks' ``retry_policy`` keyword, where Airflow has retry policies: a rate-limited tool is
    retried after the delay it asked for. Without them (Airflow before 3.3), nothing: every retry waits
    the task's ``retry_delay``."""
    if not airflow_features.retry_policies():
        return {}
    from airflow_plan_provider.operators.retry import ToolRetryPolicy

    return {"retry_policy": ToolRetryPolicy()}


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
