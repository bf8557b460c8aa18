"""The contract between the tasks of a plan DAG: their ids, the XComs they publish, and each XCom's shape.

One plan DAG (or one :func:`~airflow_plan_provider.dag_factory.plan_task_group`) has these tasks::

    plan ─┬─ approve ─┬─ nodes                      (mapped: one instance per node of the default lane)
          │           └─ select_nodes__<lane> ── nodes__<lane>   (one pair per pool lane)
          └──────────────────────────────────── finalize ── replan

With ``NodeExecution(start_on_triggerer=True)`` each lane's nodes that have parents run in a task of
their own, whose instances Airflow starts on the triggerer (:func:`after_lane`): ``select_nodes__after
── nodes__after`` beside ``nodes``, ``select_nodes__<lane>__after ── nodes__<lane>__after`` beside a
pool's lane.

and each publishes these XComs (task → key: shape):

- ``plan`` → ``plan``: :class:`~airflow_plan_provider.plan.model.ValidatedPlan`; ``session``:
  :class:`~airflow_plan_provider.plan.session.SessionState`; ``run``:
  :class:`~airflow_plan_provider.plan.session.RunContext`; ``locked__<node>``:
  :class:`~airflow_plan_provider.plan.session.LockedOutput` (one per reused node); ``planning_error``:
  :class:`PlanningErrorRecord` (when planning failed); ``briefs__<node task>__<n>``: a group of the
  :class:`NodeBrief` of a node task of more than 32 instances (:func:`briefs_key`); ``return_value``:
  what the default lane's node task maps over (:func:`mapped_values`): its nodes' briefs, or for more
  than 32 nodes their labels (``id · action``).
- ``select_nodes__<lane>`` → ``return_value``: what the lane's node task maps over, the same way.
- ``approve`` → ``approval``: :class:`ApprovalRecord`.
- ``nodes`` / ``nodes__<lane>`` (each instance) → ``node``:
  :class:`~airflow_plan_provider.plan.result.NodeRecord` (as :meth:`~.NodeRecord.pushed`); ``polling``:
  :class:`PollingRecord` (while an asynchronous job runs, and after).
- ``finalize`` → ``return_value``: :class:`~airflow_plan_provider.plan.result.SessionResult`;
  ``replan_conf``: :class:`ReplanConf` (when a replan is due).
- ``replan`` → ``return_value``: the :class:`~airflow_plan_provider.plan.result.SessionResult` of the
  rest of the chain.

Inside a task group every task id carries the group's prefix (``triage.plan``); the ids here are the
unprefixed ones, and each reader adds the prefix of the plan it reads. Which node runs in which task
instance is decided here too (:func:`node_tasks`), as is how a run reports its outcome
(:func:`session_outcome`) and labels its node instances (:func:`node_label`). This module imports no
Airflow: the plugin, ``freeze`` and the command line read runs through it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import cached_property
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError

from airflow_plan_provider.base_model import Model
from airflow_plan_provider.plan.approval import Approval
from airflow_plan_provider.plan.calls import node_key
from airflow_plan_provider.plan.model import Node, ValidatedPlan, node_and_parents
from airflow_plan_provider.plan.result import SessionResult
from airflow_plan_provider.plan.session import RunContext, SessionState
from airflow_plan_provider.tools.sources import ToolSource
from airflow_plan_provider.tools.tool import Tool

# ------------------------------------------------------------------------------------------------ task ids

PLAN_TASK = "plan"
APPROVE_TASK = "approve"
NODES_TASK = "nodes"  # the default lane's node task; a pool's lane is ``nodes__<lane>``
FINALIZE_TASK = "finalize"
REPLAN_TASK = "replan"
LANE_SEPARATOR = "__"
SELECT_PREFIX = "select_"  # a pool lane's select task: ``select_nodes__<lane>``
AFTER_LANE = "after"  # the lane of a lane's nodes that have parents, started on the triggerer

# ------------------------------------------------------------------------------------------------ XCom keys

RESULT_KEY = "return_value"  # Airflow's key of what a task returns
PLAN_KEY = "plan"  # of plan: the ValidatedPlan
SESSION_KEY = "session"  # of plan: the SessionState
RUN_CONTEXT_KEY = "run"  # of plan: the RunContext (what the node tasks need of the session)
PLANNING_ERROR_KEY = "planning_error"  # of plan: a PlanningErrorRecord
TOOLS_KEY = "tools"  # of plan: the ToolListing of the DAG's tool sources (only when it declares some)
PLACES_KEY = "places"  # of plan: node task id -> its nodes' places in the run order (only with lanes)
LOCKED_PREFIX = "locked__"  # of plan: ``locked__<node>``, a reused node's LockedOutput
BRIEFS_PREFIX = "briefs__"  # of plan: ``briefs__<node task>__<n>``, the NodeBriefs of the task's nodes
APPROVAL_KEY = "approval"  # of approve: an ApprovalRecord
NODE_KEY = "node"  # of each node instance: its NodeRecord
POLLING_KEY = "polling"  # of a node instance waiting for its asynchronous job: a PollingRecord
REPLAN_CONF_KEY = "replan_conf"  # of finalize: the ReplanConf of the next revision's run

#: Between the node id and the action in a node instance's label (node ids have no spaces).
LABEL_SEPARATOR = " · "


def lane_task_id(lane: str | None) -> str:
    """The node task of ``lane``: ``nodes`` for the default lane, ``nodes__<lane>`` for a pool's."""
    return f"{NODES_TASK}{LANE_SEPARATOR}{lane}" if lane else NODES_TASK


def after_lane(lane: str | None) -> str:
    """The lane of ``lane``'s nodes that have parents, where they start on the triggerer
    (``NodeExecution(start_on_triggerer=True)``): ``after`` for the default lane, ``<lane>__after`` for a
    pool's.

    >>> after_lane(None), after_lane("gpu"), lane_task_id(after_lane("gpu"))
    ('after', 'gpu__after', 'nodes__gpu__after')
    """
    return f"{lane}{LANE_SEPARATOR}{AFTER_LANE}" if lane else AFTER_LANE


def select_task_id(node_task: str) -> str:
    """The task returning the node ids a pool lane's task maps (``select_nodes__api``)."""
    return f"{SELECT_PREFIX}{node_task}"


def locked_key(node_id: str) -> str:
    """The XCom key (of ``plan``) holding a reused node's locked output."""
    return f"{LOCKED_PREFIX}{node_id}"


#: How many node briefs one XCom of the planning task holds (:func:`briefs_key`): a node reads the
#: briefs of its group, so what it reads stays a few KB however large the plan, and a plan of N nodes
#: costs its planning task N / 32 XCom writes. A node task of at most this many instances maps over the
#: briefs themselves instead (:func:`briefs_in_mapped_values`).
BRIEFS_PER_XCOM = 32


def briefs_key(task_id: str, map_index: int) -> str:
    """The XCom key (of ``plan``) holding the brief of instance ``map_index`` of node task ``task_id``
    (without a task group's prefix), among the briefs of its group of :data:`BRIEFS_PER_XCOM`
    instances (at position ``map_index % BRIEFS_PER_XCOM``).

    >>> briefs_key("nodes", 0), briefs_key("nodes", 31), briefs_key("nodes__api", 32)
    ('briefs__nodes__0', 'briefs__nodes__0', 'briefs__nodes__api__1')
    """
    return f"{BRIEFS_PREFIX}{task_id}{LANE_SEPARATOR}{map_index // BRIEFS_PER_XCOM}"


def node_label(node_id: str, action: str) -> str:
    """The label of a node's task instance (its rendered map index in the grid)."""
    return f"{node_id}{LABEL_SEPARATOR}{action}"


def labelled_node(label: str | None) -> str | None:
    """The node id a task instance's label names, or None for an unlabelled instance."""
    return label.split(LABEL_SEPARATOR, 1)[0] if label else None


# ---------------------------------------------------------------------------------------- where nodes run


def lane_of(tool: Tool | ToolSource) -> str | None:
    """The lane of the nodes calling ``tool``: its pool, with the slot count when it takes more than one;
    None (the default lane) for a tool without a pool."""
    if not tool.pool:
        return None
    return tool.pool if tool.pool_slots == 1 else f"{tool.pool}{LANE_SEPARATOR}x{tool.pool_slots}"


def dag_lanes(tools: Iterable[Tool | ToolSource]) -> dict[str, Tool | ToolSource]:
    """Lane → a tool that runs in it (its pool and slots), for every pooled tool; sorted by lane.

    Raises ``ValueError`` when two different (pool, slots) pairs would share a lane name.
    """
    lanes: dict[str, Tool | ToolSource] = {}
    for tool in sorted(tools, key=lambda t: t.name):
        lane = lane_of(tool)
        if lane is None:
            continue
        other = lanes.setdefault(lane, tool)
        if (other.pool, other.pool_slots) != (tool.pool, tool.pool_slots):
            raise ValueError(
                f"tools {other.name!r} (pool {other.pool!r}, {other.pool_slots} slot(s)) and {tool.name!r} "
                f"(pool {tool.pool!r}, {tool.pool_slots} slot(s)) would share the node tasks "
                f"{lane_task_id(lane)!r}: rename one of the pools"
            )
    return dict(sorted(lanes.items()))


def node_tasks(plan: ValidatedPlan, run: RunContext) -> dict[str, list[str]]:
    """Node task id → the node ids it maps, in map-index order: where every node of the run runs.

    Nodes run in the mapped task ``nodes``, except nodes whose tool declares an Airflow pool: Airflow
    gives every instance of a mapped task the task's pool, so those run in a lane of their own,
    ``nodes__<lane>`` (the planning task records each pooled node's lane in ``run.lanes``); where nodes
    start on the triggerer, a lane's nodes that have parents run in its :func:`after_lane`. In every task
    the map-index order is the plan's run order
    (:attr:`~airflow_plan_provider.plan.model.ValidatedPlan.run_order`: a parent before its children):
    among instances of equal priority weight Airflow's scheduler hands out slots in map-index order. A
    task with no node is absent.
    """
    tasks: dict[str, list[str]] = {}
    for node in plan.run_order:
        tasks.setdefault(lane_task_id(run.lanes.get(node)), []).append(node)
    return tasks


def node_places(plan: ValidatedPlan, run: RunContext, by_descendants: bool = False) -> dict[str, list[int]]:
    """Node task id → the place of each of its instances' nodes, in map-index order: the order
    :class:`~airflow_plan_provider.sessions_in_turn.SessionsInTurn` weighs a run's node instances in
    across its node tasks. The place in the plan's run order (in a run without lanes, the map indexes
    themselves), or ``by_descendants`` in its :attr:`~.ValidatedPlan.descendant_order` (where nodes
    start on the triggerer: see :meth:`~.PlanOperator.places_by_descendants`)."""
    order = plan.descendant_order if by_descendants else plan.run_order
    place = {node: i for i, node in enumerate(order)}
    return {task: [place[node] for node in nodes] for task, nodes in node_tasks(plan, run).items()}


class ParentBrief(Model):
    """What a node needs of one of its parents: its id, the tool and params it is called with (they key
    its stored output), and whether the edge is optional."""

    model_config = ConfigDict(extra="forbid")

    id: str
    tool: str
    params: dict[str, Any] = Field(default_factory=dict)
    optional: bool = False


class NodeBrief(Model):
    """What one node's task instance needs of its run: its mapped value (a node task of up to
    :data:`BRIEFS_PER_XCOM` instances), or one of the groups the planning task publishes
    (:func:`briefs_key`), so a node reads a few KB however large the plan, and no plan, run context or
    layout, to start.

    :param node: the node.
    :param parents: its parents (:class:`ParentBrief`), in the plan's order of its parents.
    :param grandparents: each parent's own parents: how near the parents are to running.
    :param at: node task id (without a task group's prefix) → node id → map index, for the instances
        of the node, its parents and its grandparents.
    :param run: the run's context as this node needs it
        (:meth:`~airflow_plan_provider.plan.session.RunContext.for_node`).
    :param position: the node's place in the revision's execution order (what the step budget counts);
        None for a reused node.
    :param plan_size: the number of nodes of the whole plan.
    """

    model_config = ConfigDict(extra="forbid")

    node: Node
    parents: list[ParentBrief] = Field(default_factory=list)
    grandparents: dict[str, list[str]] = Field(default_factory=dict)
    at: dict[str, dict[str, int]]
    run: RunContext = Field(default_factory=RunContext)
    position: int | None = None
    plan_size: int

    @property
    def node_id(self) -> str:
        return self.node.id

    @property
    def label(self) -> str:
        return node_label(self.node.id, self.node.action)

    @cached_property
    def plan(self) -> ValidatedPlan:
        """The node and its parents as a plan of their own
        (:func:`~airflow_plan_provider.plan.model.node_and_parents`)."""
        parents = [(Node(id=p.id, action="", tool=p.tool, params=p.params), p.optional) for p in self.parents]
        return node_and_parents(self.node, parents)

    def parent_keys(self, scope: str, run_id: str) -> dict[str, str]:
        """Each parent → the idempotency key of its call (its checkpoint's key) in the session of run
        ``run_id`` (the session's first run, when this run is a replan) within ``scope``
        (:func:`~airflow_plan_provider.plan.calls.key_scope`)."""
        session = self.run.root_run_id or run_id
        return {p.id: node_key(scope, session, self.plan.node(p.id)) for p in self.parents}

    def instances(self, node_ids: Iterable[str], prefix: str = "") -> dict[str, list[int]]:
        """Task id (with a group's ``prefix``) → the map indexes of the instances of ``node_ids``, each
        one of the node, its parents and its grandparents."""
        found: dict[str, list[int]] = {}
        for node in node_ids:
            task, index = self.location(node)
            found.setdefault(prefix + task, []).append(index)
        return found

    def instance_key(self, node_id: str, prefix: str = "") -> str:
        """The key of ``node_id``'s instance in a read of task states (Airflow's ``<task id>_<map
        index>``, the task id with a group's ``prefix``)."""
        task, index = self.location(node_id)
        return f"{prefix}{task}_{index}"

    def grandparent_keys(self, prefix: str = "") -> dict[str, list[str]]:
        """Each parent's instance key → its own parents' instance keys (:meth:`instance_key`)."""
        return {
            self.instance_key(p.id, prefix): [
                self.instance_key(g, prefix) for g in self.grandparents.get(p.id, [])
            ]
            for p in self.parents
        }

    def location(self, node_id: str) -> tuple[str, int]:
        """The task id (without a group's prefix) and map index of the instance of ``node_id``, one of
        the node, its parents and its grandparents."""
        for task_id, indexes in self.at.items():
            if node_id in indexes:
                return task_id, indexes[node_id]
        raise KeyError(node_id)


def node_briefs(
    plan: ValidatedPlan, run: RunContext, task_id: str | None = None
) -> dict[str, list[dict[str, Any]]]:
    """Node task id → the briefs (:class:`NodeBrief`, as JSON) of its instances, in map-index order,
    for every node of the run, or only for node task ``task_id``'s. How they reach the instances:
    :func:`mapped_values` and :func:`brief_groups`."""
    tasks = node_tasks(plan, run)
    at = {node: (task, index) for task, nodes in tasks.items() for index, node in enumerate(nodes)}
    soft = set(map(tuple, plan.soft_edges))
    briefs: dict[str, list[dict[str, Any]]] = {}
    for task, nodes in tasks.items():
        if task_id is not None and task != task_id:
            continue
        for node_id in nodes:
            parents = plan.parents[node_id]
            grandparents = {p: plan.parents[p] for p in parents}
            where: dict[str, dict[str, int]] = {}
            for near in sorted({node_id, *parents, *(g for gs in grandparents.values() for g in gs)}):
                near_task, near_index = at[near]
                where.setdefault(near_task, {})[near] = near_index
            brief = NodeBrief(
                node=plan.node(node_id),
                parents=[
                    ParentBrief(
                        id=p,
                        tool=plan.node(p).tool,
                        params=plan.node(p).params,
                        optional=(p, node_id) in soft,
                    )
                    for p in parents
                ],
                grandparents={p: gs for p, gs in grandparents.items() if gs},
                at=where,
                run=run.for_node(node_id),
                position=run.position(node_id),
                plan_size=len(plan.nodes),
            )
            briefs.setdefault(task, []).append(
                brief.model_dump(mode="json", exclude_defaults=True, exclude_none=True)
            )
    return briefs


def briefs_in_mapped_values(instances: int) -> bool:
    """Whether a node task of ``instances`` instances maps over its nodes' briefs (at most one group of
    :data:`BRIEFS_PER_XCOM`) rather than their labels.

    Airflow reads the whole list a task maps over for every instance it starts, in one request. A
    task of one group's size maps over the briefs themselves: each instance reads no more than its
    group would hold, and makes no second request for its brief. A larger task maps over the labels
    (``id · action``), and each instance reads its brief from its group (:func:`brief_groups`), so that
    what it reads stays a few KB however large the plan.
    """
    return instances <= BRIEFS_PER_XCOM


def mapped_values(
    plan: ValidatedPlan,
    run: RunContext,
    task_id: str,
    briefs: dict[str, list[dict[str, Any]]] | None = None,
) -> list[Any]:
    """What node task ``task_id`` maps over: its nodes' briefs, taken from ``briefs`` (every task's,
    :func:`node_briefs`) or built here, or their labels when there are more than one group's worth
    (:func:`briefs_in_mapped_values`; no brief is built then)."""
    nodes = node_tasks(plan, run).get(task_id, [])
    if not briefs_in_mapped_values(len(nodes)):
        return [node_label(node, plan.node(node).action) for node in nodes]
    return (node_briefs(plan, run, task_id) if briefs is None else briefs).get(task_id, [])


def brief_groups(
    briefs: dict[str, list[dict[str, Any]]], grouped: Iterable[str] = ()
) -> dict[str, list[dict[str, Any]]]:
    """XCom key (:func:`briefs_key`) → the briefs it holds, in map-index order, for the node tasks that
    map over their labels (:func:`mapped_values`) and for the tasks ``grouped`` (whatever their size:
    the tasks started on the triggerer, whose trigger reads its node's brief before the instance has its
    mapped value); given every task's briefs (:func:`node_briefs`)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    grouped = set(grouped)
    for task_id, task_briefs in briefs.items():
        if briefs_in_mapped_values(len(task_briefs)) and task_id not in grouped:
            continue
        for index, brief in enumerate(task_briefs):
            groups.setdefault(briefs_key(task_id, index), []).append(brief)
    return groups


def mapped_label(value: Any) -> str | None:
    """The label (``id · action``) of the node instance whose mapped value is ``value``: a label, or a
    brief (as JSON); None for anything else."""
    if isinstance(value, str):
        return value
    node = value.get("node") if isinstance(value, dict) else None
    if not isinstance(node, dict) or not isinstance(node.get("id"), str):
        return None
    return node_label(node["id"], str(node.get("action", "")))


def node_location(plan: ValidatedPlan, run: RunContext, node_id: str) -> tuple[str, int]:
    """The task id and map index of a node's task instance."""
    task_id = lane_task_id(run.lanes.get(node_id))
    return task_id, node_tasks(plan, run)[task_id].index(node_id)


# ------------------------------------------------------------------------------------ what tasks publish


class PlanningErrorRecord(Model):
    """Why planning failed (XCom ``planning_error`` of ``plan``): what finalize reports and the plan view
    shows. ``message`` is the error's own text followed by its problem list (the first ones and a count
    of the rest)."""

    reason: str = "no_plan"
    message: str = ""


ApprovalStatus = Literal["not_needed", "requested", "granted", "rejected"]


class ApprovalRecord(Model):
    """What the approval task publishes (XCom ``approval``).

    ``not_needed``: nothing was asked (``approved_earlier`` names the risky nodes approved earlier in the
    session). ``requested``: the request, not answered yet. ``granted`` / ``rejected``: the answer. The
    request and the answer carry the fields of :class:`~airflow_plan_provider.plan.approval.Approval`.
    """

    model_config = ConfigDict(extra="allow")

    status: ApprovalStatus
    revision: int = 0
    approved_earlier: list[str] = Field(default_factory=list)

    @classmethod
    def not_needed(cls, revision: int, approved_earlier: Iterable[str]) -> ApprovalRecord:
        return cls(status="not_needed", revision=revision, approved_earlier=list(approved_earlier))

    @classmethod
    def requested(cls, request: Approval) -> ApprovalRecord:
        return cls.model_validate({**request.model_dump(mode="json"), "status": "requested"})

    @property
    def lets_nodes_run(self) -> bool:
        """Whether the run's nodes may run: approval was granted or not needed."""
        return self.status in ("granted", "not_needed")

    def answer(self) -> Approval | None:
        """The answer as an :class:`Approval`: None when nothing was asked; a request never answered (the
        approval task ended without an answer) is a rejection."""
        if self.status == "not_needed":
            return None
        fields = self.model_dump(mode="json", exclude={"approved_earlier"})
        if self.status == "requested":
            fields |= {"status": "rejected", "calls": {}, "message": "the approval task ended unanswered"}
        return Approval.model_validate(fields)


def approval_lets_nodes_run(value: Any) -> bool:
    """Whether the approval task's XCom ``approval`` lets the run's nodes run. No record (the task never
    answered), or anything that is not one, does not."""
    try:
        return ApprovalRecord.model_validate(value).lets_nodes_run
    except ValidationError:
        return False


class PollingRecord(Model):
    """A node's asynchronous job (XCom ``polling`` of the node's instance): what the job is, since when,
    and, once the node resumed, until when and how it ended; the node's record keeps the same under
    ``polling``. While the job runs the record also carries what the node needs when it resumes: the
    missing inputs, when the try started and its events so far."""

    model_config = ConfigDict(extra="allow")

    handle: Any = None
    since: str | None = None
    timeout: float | None = None
    key: str | None = None
    until: str | None = None
    outcome: str | None = None
    missing: list[str] = Field(default_factory=list)
    started: float | None = None  # when the tool was called, in epoch seconds
    events: list[dict[str, Any]] = Field(default_factory=list)


class SessionRef(Model):
    """The session a replan run continues, as its conf names it: the revision and the runs before it.
    The session itself stays in the parent run's XCom (``replan_conf`` of ``finalize``), where the
    planning task reads it: Airflow decodes a run's conf with every task instance it loads, once per
    instance, so a run's conf is kept small."""

    model_config = ConfigDict(extra="forbid")

    root_run_id: str
    parent_run_id: str
    revision: int

    @classmethod
    def of(cls, state: SessionState) -> SessionRef:
        return cls(
            root_run_id=state.root_run_id, parent_run_id=state.parent_run_id or "", revision=state.revision
        )


class ReplanConf(Model):
    """The next revision's session (XCom ``replan_conf`` of ``finalize``): the goal, and the session so
    far as JSON. The replan task starts that revision's run with :meth:`run_conf`."""

    goal: str = ""
    session: dict[str, Any]

    @cached_property
    def state(self) -> SessionState:
        return SessionState.model_validate(self.session)

    def run_conf(self) -> dict[str, Any]:
        """The conf of the revision's run: the goal and a :class:`SessionRef`."""
        return {"goal": self.goal, "session": SessionRef.of(self.state).model_dump(mode="json")}


# ------------------------------------------------------------------------------- how a run reports


def as_result(value: Any) -> SessionResult | None:
    """``value`` as a :class:`SessionResult`, or None when it is missing or is not one."""
    if not isinstance(value, dict):
        return None
    try:
        return SessionResult.model_validate(value)
    except ValidationError:
        return None


def session_outcome(read: Callable[[str], Any], *later: Callable[[str], Any]) -> SessionResult | None:
    """The outcome of a session as its runs report it: the one rule freeze, the plan view, the replan
    task and the testing kit read it by.

    A run's own result is ``finalize``'s ``return_value``. When that result is ``replanned``, the run
    handed over to its next revision, and the session's outcome is the ``return_value`` of the run's
    ``replan`` task, which reports the rest of the chain (completed, or failed and why). Until that task
    reports, the next run of the chain tells the outcome the same way, when the reader has it.

    :param read: ``task_id`` → that task's ``return_value`` XCom in the run (None when it has none).
    :param later: the same for the runs after it in the session's chain, in order (those the reader has).
    :return: the first result of the chain that is not ``replanned``, as the runs report it; None while
        the session has not reported an outcome yet.
    """
    for run in (read, *later):
        result = as_result(run(FINALIZE_TASK))
        if result is None or result.status != "replanned":
            return result
        chain = as_result(run(REPLAN_TASK))
        if chain is not None:
            return chain
    return None
