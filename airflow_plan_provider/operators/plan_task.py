"""The planning task: ask the planner, validate (repairing while allowed), publish the plan and layers.

A replan run's conf names the session so far (root run, parent run, revision); the task reads the session
from the parent run's XCom, once it has proved the conf came from this DAG's own replan task
(:mod:`~airflow_plan_provider.operators.session_trust`): a conf is user input.

The task is retried when its worker is lost. A retry plans again: it repeats the conf checks and asks
the planner again (an LLM planner is called again), unless an earlier try of this task already had a
plan validated: that plan's reply, kept in Airflow's task state store, is validated again and reused,
so the tokens are not spent twice and the run goes on with the plan the first try logged. (Where Airflow
has no task state store, before 3.3, the reply is kept as a checkpoint in the DAG's artifact store.)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from airflow.sdk import BaseOperator, BaseOperatorLink

from airflow_plan_provider import airflow_features, artifacts
from airflow_plan_provider.airflow_features import AirflowFailException
from airflow_plan_provider.contract import (
    NODES_TASK,
    PLACES_KEY,
    PLAN_KEY,
    PLANNING_ERROR_KEY,
    RUN_CONTEXT_KEY,
    SESSION_KEY,
    TOOLS_KEY,
    PlanningErrorRecord,
    after_lane,
    brief_groups,
    lane_of,
    lane_task_id,
    locked_key,
    mapped_values,
    node_briefs,
    node_places,
)
from airflow_plan_provider.exceptions import (
    PlanningError,
    PlanProviderError,
    PlanValidationError,
    ToolSourceError,
)
from airflow_plan_provider.operators._telemetry import emit, span
from airflow_plan_provider.operators.links import ParentRunLink
from airflow_plan_provider.operators.run_dates import with_run_dates
from airflow_plan_provider.plan.budgets import Budgets
from airflow_plan_provider.plan.merge import merge_replan
from airflow_plan_provider.plan.model import Node, Plan, ValidatedPlan
from airflow_plan_provider.plan.session import (
    PlanSource,
    RunSlots,
    SessionState,
    continue_session,
    record_plan,
    record_planning_failure,
    run_context,
    start_session,
)
from airflow_plan_provider.plan.validate import Limits, validate_plan
from airflow_plan_provider.plan.waiting import slots_to_spare
from airflow_plan_provider.problems import MAX_REPORTED_PROBLEMS, capped, clip, describe
from airflow_plan_provider.tools.registry import ToolRegistry, load_tools

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_plan_provider.planners.base import Planner, PlanningOutcome, PlanRequest
    from airflow_plan_provider.tools.sources import ToolListing
    from airflow_plan_provider.tools.tool import Tool

# The planners, the session checks and the merge are imported where the planning task runs, not at
# module level: every task of a plan DAG (each node) parses the DAG file, which imports this module.

MAX_MESSAGE_CHARS = 2000  # of an error's own text (before its problem list) in logs and XCom
FROZEN_PLAN_REFUSAL = (
    "this DAG runs its own frozen plan: a run's conf may not give another one (trigger it without "
    "'plan', or trigger a plan DAG without a frozen plan)"
)
#: Task state store key of the planner reply a try of the planning task validated (reused by retries).
ACCEPTED_REPLY_KEY = "accepted_plan_reply"
#: The most bytes of run conf, times the run's node instances, the planning task lets pass without a
#: warning: Airflow loads a run with each of its task instances and decodes the run's conf once per
#: instance, in every scheduler loop (``docs/performance.md``).
CONF_DECODE_WARNING_BYTES = 4_000_000


#: the fewest slots a run (started on the triggerer) has for its nodes to be weighed by their descendants
#: (:meth:`PlanOperator.places_by_descendants`)
PLACES_BY_DESCENDANTS_FROM = 4


class PlanOperator(BaseOperator):
    """Plan (or replan) and validate; push the plan and session state; return the node ids the first
    default lane's node task ``nodes`` maps (in the plan's run order).

    The run's conf (or the DAG's Params) gives ``goal``, optionally a ready ``plan`` (the planner is then
    skipped), ``max_steps`` and ``max_replans``. A replan run's conf carries ``goal`` and ``session``
    only, the session named as the parent run's finalize task prepared it (its state, read from that
    task's XCom, is the session so far, from which only the affected subgraph is planned again). Any
    other conf with a session is rejected.
    An invalid plan fails this task with its problems in its log (the first
    :data:`~airflow_plan_provider.problems.MAX_REPORTED_PROBLEMS` and a count of the rest), and no
    node runs.

    Safe to retry (a lost worker): no node runs before this task succeeds, so a retry may plan afresh.
    A try that had a plan validated keeps the planner's reply (and the attempts' token usage) in the
    task state store first; a later try of the same task instance (a retry, or the task cleared)
    validates that reply again instead of asking the planner. Trigger a new run for a fresh plan.

    :param planner: the planner; ``None`` runs only ready plans given in the conf.
    :param tools: a tool registry, or ``"module:attribute"`` naming one.
    :param limits: plan size limits.
    :param repair_attempts: how many times invalid plans are sent back to the planner (0 or more).
    :param lanes: the pool lanes this DAG has node tasks for; a node whose tool declares a pool runs in
        its lane (recorded in the session), and a pool with no lane here fails planning.
    :param start_on_triggerer: the DAG has a task started on the triggerer beside each lane's
        (``NodeExecution.start_on_triggerer``): a node that has parents runs in its lane's
        :func:`~airflow_plan_provider.contract.after_lane`, whose briefs are always published in groups
        (its trigger reads its brief there).
    :param artifact_store: the DAG's artifact store, checked to be shared by every worker (a warning).
    :param budgets: the session's budgets when the run's conf (or Params) gives none.
    :param goal: the session's goal, rendered as a Jinja template with the run's context (the task group
        form); the run's conf is then not read at all (it belongs to the DAG the group is in).
        ``None``: the conf (or the DAG's Params) gives the goal, a ready plan and budgets.
    :param ready_plan: a plan baked into the DAG (a frozen plan): every run runs it as is, after
        rendering its strings as Jinja templates with the run's context (``"{{ ds }}"``; a run without a
        logical date renders with the dates of its ``run_after``). Only
        this plan, written by the DAG's author, is rendered: a plan from the conf or a planner is
        untrusted text and never is. A conf that gives a plan of its own is refused (planning fails
        with reason ``invalid_plan``): the DAG's reviewed plan is the only one it runs.
    """

    template_fields: Sequence[str] = ("goal",)
    ui_color = "#d9e8fb"
    operator_extra_links: tuple[BaseOperatorLink, ...] = (ParentRunLink(),)

    def __init__(
        self,
        *,
        planner: Planner | None,
        tools: ToolRegistry | str | None = None,
        limits: Limits | None = None,
        budgets: Budgets | None = None,
        goal: str | None = None,
        repair_attempts: int = 2,
        lanes: Sequence[str] = (),
        start_on_triggerer: bool = False,
        artifact_store: str | None = None,
        ready_plan: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.lanes = list(lanes)
        self.start_on_triggerer = start_on_triggerer
        self.artifact_store = artifact_store
        self.ready_plan = dict(ready_plan) if ready_plan is not None else None
        if isinstance(repair_attempts, bool) or not isinstance(repair_attempts, int) or repair_attempts < 0:
            raise ValueError(f"repair_attempts must be an integer >= 0, got {repair_attempts!r}")
        self.planner = planner
        self.tools = tools
        self.limits = limits or Limits()
        self.budgets = budgets or Budgets()
        self.goal = goal
        if goal is None:  # nothing to render: Airflow then sends no rendered fields when the task starts
            self.template_fields = ()
        self.repair_attempts = repair_attempts
        self.parent_run_id: str | None = None  # set from a verified session, for ParentRunLink

    def render_template_fields(self, context: Context, jinja_env: Any = None) -> None:
        """Render the goal; a run without a logical date renders with its ``run_after``'s dates
        (:mod:`~airflow_plan_provider.operators.run_dates`)."""
        super().render_template_fields(with_run_dates(context), jinja_env)

    def execute(self, context: Context) -> list[Any]:
        ti = context["ti"]
        run_id = context["run_id"]
        shared = artifacts.local_store_warning(self.artifact_store)
        if shared:
            self.log.warning("%s", shared)
        conf, params = self._conf_and_params(context)
        state = self._started_session(ti, conf, params, run_id)
        # what the planner sees of the conf: never the session state (outputs) or a ready plan
        planner_conf = {k: v for k, v in params.items() if k not in ("session", "plan")}
        planner_conf["goal"] = state.goal
        tools, listing = self._tools_or_fail(ti, state)
        dag_plan = self._dag_plan(ti, state, params, context)
        try:
            with span("plan.planning", dag_id=ti.dag_id, run_id=run_id, revision=state.revision):
                source, outcome = self._plan(
                    state,
                    params,
                    planner_conf,
                    tools,
                    self._reply_store(context),
                    dag_plan,
                    earlier_tries=ti.try_number > 1,
                )
        except PlanningError as error:
            self._fail(ti, state, error)
        planned = self._recorded(ti, state, source, outcome, tools)
        heavy = heavy_conf_warning(conf, len(outcome.plan.nodes))
        if heavy:
            self.log.warning("%s", heavy)
        return self._published(ti, planned, outcome.plan, tools, listing)

    def _conf_and_params(self, context: Context) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
        """The run's conf, and the Params with the conf over them; a task group's session has neither
        (the run's conf and Params are the DAG's own): its goal is the group's."""
        if self.goal is not None:
            return {}, {"goal": self.goal}
        conf: Mapping[str, Any] = context["dag_run"].conf or {}
        return conf, {**(context.get("params") or {}), **conf}

    def _started_session(
        self, ti: Any, conf: Mapping[str, Any], params: Mapping[str, Any], run_id: str
    ) -> SessionState:
        """The run's session (:meth:`_session`), or fail the try with a fresh session that reports why
        not; the parent run's link kept when the run has one."""
        try:
            state = self._session(ti, conf, params, run_id)
        except PlanningError as error:
            # nothing of the rejected session is kept: a fresh session reports the rejection
            self._fail(ti, start_session(goal="", dag_id=ti.dag_id, run_id=run_id), error)
        self.parent_run_id = state.parent_run_id
        if not self.parent_run_id:  # a session's first run has no parent run: no link for Airflow to keep
            self.operator_extra_links = ()
        return state

    def _tools_or_fail(self, ti: Any, state: SessionState) -> tuple[ToolRegistry, ToolListing]:
        """The DAG's tools as :meth:`_listed_tools` lists them. A source that cannot be listed fails
        this try while Airflow has tries left (a server restarting is back by a later try), and the
        session on the last."""
        try:
            return self._listed_tools()
        except ToolSourceError as error:
            if ti.try_number <= (self.retries or 0):
                raise
            self._fail(ti, state, PlanningError(f"a tool source could not be listed: {error}"))

    def _dag_plan(self, ti: Any, state: SessionState, params: Mapping[str, Any], context: Context) -> Any:
        """The DAG's own plan (a frozen plan DAG), rendered with the run's context, when this revision
        runs it; None otherwise. A run's conf that gives a plan of its own fails the try."""
        if self.ready_plan is None:
            return None
        if params.get("plan"):
            self._fail(ti, state, PlanningError(FROZEN_PLAN_REFUSAL, reason="invalid_plan"))
        if state.current_plan is not None:
            return None
        try:
            return self.render_template(self.ready_plan, with_run_dates(context))
        except Exception as error:  # a Jinja syntax error or an undefined name in the DAG's plan
            message = f"cannot render the DAG's plan: {type(error).__name__}: {error}"
            self._fail(ti, state, PlanningError(message, reason="invalid_plan"))

    def _recorded(
        self, ti: Any, state: SessionState, source: PlanSource, outcome: PlanningOutcome, tools: ToolRegistry
    ) -> SessionState:
        """The session with the plan recorded (its lanes, usage and rejected attempts), logged."""
        try:
            lanes = self._lanes(outcome.plan, tools)
        except PlanningError as error:
            self._fail(ti, state, error, usage=outcome.usage)
        plan = outcome.plan
        planned = record_plan(
            state,
            plan,
            source=source,
            lanes=lanes,
            usage=outcome.usage,
            attempts=outcome.attempts,
            details=_rejected(outcome.rejected),
        )
        self._publish(state, planned)
        self.log.info(
            "plan revision %s: %s nodes in %s layers %s",
            planned.revision,
            len(plan.nodes),
            len(plan.layers),
            plan.layers,
        )
        return planned

    def _published(
        self, ti: Any, planned: SessionState, plan: ValidatedPlan, tools: ToolRegistry, listing: ToolListing
    ) -> list[Any]:
        """Push what the run's other tasks read (the tools listed, the plan, the session, the run's
        context, locked outputs, the nodes' briefs), and return what the node task maps over."""
        run = run_context(planned)
        by_descendants = False
        started = (
            [lane_task_id(after_lane(lane)) for lane in (None, *self.lanes)]
            if self.start_on_triggerer
            else []
        )
        if started:
            slots = self.slots(ti)
            spare = slots_to_spare(len(plan.nodes), len(plan.layers), slots)
            if not spare:
                tasks = [lane_task_id(lane) for lane in (None, *self.lanes)] + started
                run.near_while_idle = RunSlots(slots=slots, tasks=tasks)
            by_descendants = self.places_by_descendants(slots, spare)
        self._keep_tools(ti, tools, listing, plan)
        ti.xcom_push(key=PLAN_KEY, value=plan.model_dump(mode="json", by_alias=True, exclude_none=True))
        ti.xcom_push(key=SESSION_KEY, value=planned.model_dump(mode="json"))
        ti.xcom_push(key=RUN_CONTEXT_KEY, value=run.model_dump(mode="json"))
        if run.lanes:  # the node instances' weights follow the plan's order across the lanes' tasks
            ti.xcom_push(key=PLACES_KEY, value=node_places(plan, run, by_descendants))
        for node_id in run.reused:
            ti.xcom_push(key=locked_key(node_id), value=planned.locked[node_id].model_dump(mode="json"))
        briefs = node_briefs(plan, run)
        for key, group in brief_groups(briefs, grouped=started).items():
            ti.xcom_push(key=key, value=group)
        return mapped_values(plan, run, NODES_TASK, briefs)

    @staticmethod
    def places_by_descendants(slots: int, spare: bool) -> bool:
        """Whether the node instances of a run whose nodes with parents start on the triggerer are
        weighed by their number of descendants (their places in the plan's
        :attr:`~airflow_plan_provider.plan.model.ValidatedPlan.descendant_order`) instead of its run
        order: where the run has no slots to spare (``spare`` False: its nodes come to their slots near
        their parents only while the run leaves one idle) or at least :data:`PLACES_BY_DESCENDANTS_FROM`
        ``slots`` (:meth:`slots`). Other runs are weighed by the run order.

        Nodes started on the triggerer hold no slot while their parents have not begun their tools, so
        the slots go to the nodes that can run or whose parents run, and among those the one that holds
        up most of the plan goes first, as in a static DAG (Airflow's ``downstream`` weight). With fewer
        slots, and nodes that come near their parents, the run order (layer by layer) keeps the plan's
        front moving instead. The simulator's figures for both, on the same generated plans:
        ``bench/simulate.py --families 1000 --mechanisms``.
        """
        return not spare or slots >= PLACES_BY_DESCENDANTS_FROM

    @staticmethod
    def slots(ti: Any) -> int:
        """The most node instances of the run that can hold slots at once, as the planning task can know
        it: the least of the DAG's ``max_active_tasks`` and Airflow's ``[core] parallelism`` (a pool's
        slots are not read)."""
        from airflow_plan_provider.airflow_features import sdk_conf

        dag = getattr(getattr(ti, "task", None), "dag", None)
        caps = [getattr(dag, "max_active_tasks", None), sdk_conf().getint("core", "parallelism", fallback=32)]
        return min(cap for cap in caps if isinstance(cap, int) and cap > 0)

    def _listed_tools(self) -> tuple[ToolRegistry, ToolListing]:
        """The DAG's tools, with those its sources list now, and the listing (kept beside the plan for
        the run's other tasks: :meth:`_keep_tools`). A required source that cannot be listed fails this
        try (Airflow retries it: a server restarting is back by the next try)."""
        from airflow_plan_provider.tools.sources import ToolListing

        tools = load_tools(self.tools)
        if not tools.sources:
            return tools, ToolListing()
        listed, listing = tools.listed()
        for source in listing.sources:
            if source.error:
                self.log.warning("tool source %s: planning without it: %s", source.source, source.error)
                continue
            names = [tool.name for tool in source.tools]
            self.log.info(
                "tool source %s: %s tool(s) advertised, %s offered to the planner: %s",
                source.source,
                source.advertised,
                len(names),
                ", ".join(names[:50]) + (" ..." if len(names) > 50 else ""),
            )
            for skipped in source.skipped[:20]:
                self.log.warning("tool source %s: left out %s", source.source, skipped)
        return listed, listing

    def _keep_tools(self, ti: Any, tools: ToolRegistry, listing: ToolListing, plan: ValidatedPlan) -> None:
        """Push the sources' listing and where each tool of the plan comes from (XCom ``tools``), when
        the DAG has sources or tools other than Python functions: the run's nodes rebuild the listed
        tools from it, and the plan view shows it."""
        used = {node.tool: tools[node.tool].origin for node in plan.nodes if node.tool in tools}
        if not listing.sources and all(origin.kind == "python" for origin in used.values()):
            return
        listing.origins = {name: origin.to_dict() for name, origin in sorted(used.items())}
        ti.xcom_push(key=TOOLS_KEY, value=listing.model_dump(mode="json"))

    def _lanes(self, plan: ValidatedPlan, tools: ToolRegistry) -> dict[str, str]:
        """Node id → lane, for the nodes whose tool declares a pool, and where nodes start on the
        triggerer, for the nodes that have parents (their lane's :func:`after_lane`)."""
        lanes: dict[str, str] = {}
        for node in plan.nodes:
            tool = tools[node.tool]
            lane = lane_of(tool)
            if self.start_on_triggerer and plan.parents[node.id]:
                self._check_lane(node, tool, lane)
                lanes[node.id] = after_lane(lane)
                continue
            if lane is None:
                continue
            self._check_lane(node, tool, lane)
            lanes[node.id] = lane
        return lanes

    def _check_lane(self, node: Node, tool: Tool, lane: str | None) -> None:
        """A pooled tool's lane must be one this DAG has node tasks for."""
        if lane is not None and lane not in self.lanes:
            raise PlanningError(
                f"node {node.id}: tool {tool.name!r} declares pool {tool.pool!r} "
                f"({tool.pool_slots} slot(s)), but this DAG has no node tasks for it (its pool lanes: "
                f"{self.lanes or 'none'}); the DAG file must be parsed again with this tool registry"
            )

    def _fail(
        self, ti: Any, state: SessionState, error: PlanningError, usage: Sequence[Mapping[str, int]] = ()
    ) -> NoReturn:
        """Report a planning failure (log, event, XCom for finalize) with the problems capped, and fail."""
        shown, more = capped(error.problems)
        for problem in shown:
            self.log.error("plan problem: %s", problem)
        if more:
            self.log.error("plan problem: ... and %s more problem(s)", more)
        text = clip(error.text, MAX_MESSAGE_CHARS)
        message = f"{text}\n{describe(error.problems)}" if error.problems else text
        failed = record_planning_failure(
            state,
            reason=error.reason,
            message=text.splitlines()[0] if text else "",
            problems=[p.to_dict() for p in shown],
            more_problems=more,
            usage=[*usage, *error.usage],
        )
        self._publish(state, failed)
        ti.xcom_push(key=SESSION_KEY, value=failed.model_dump(mode="json"))
        ti.xcom_push(
            key=PLANNING_ERROR_KEY,
            value=PlanningErrorRecord(reason=error.reason, message=message).model_dump(mode="json"),
        )
        # "from None": the cause's text is the uncapped problem list
        raise AirflowFailException(message) from None

    def _publish(self, before: SessionState, after: SessionState) -> None:
        """Log (and count) the events this task added to the session."""
        for event in after.events[len(before.events) :]:
            emit(self.log, event)

    def _session(
        self, ti: Any, conf: Mapping[str, Any], params: Mapping[str, Any], run_id: str
    ) -> SessionState:
        if conf.get("session") is not None:
            from airflow_plan_provider.operators.session_trust import verified_session

            verified = verified_session(ti, conf, run_id)
            return continue_session(verified, dag_id=ti.dag_id, run_id=run_id)
        budgets = Budgets(
            max_steps=int(params.get("max_steps") or self.budgets.max_steps),
            max_replans=int(params["max_replans"])
            if params.get("max_replans") is not None
            else self.budgets.max_replans,
        )
        goal = str(params.get("goal") or (self.ready_plan or {}).get("goal") or "")
        return start_session(goal=goal, budgets=budgets, dag_id=ti.dag_id, run_id=run_id)

    def _plan(
        self,
        state: SessionState,
        params: Mapping[str, Any],
        planner_conf: Mapping[str, Any],
        tools: ToolRegistry,
        store: Any = None,
        dag_plan: Any = None,
        *,
        earlier_tries: bool = False,
    ) -> tuple[PlanSource, PlanningOutcome]:
        """The run's plan and where it came from: a ready plan (the conf's, or the DAG's own), the
        planner's first plan, or (a replan run) the planner's replacement merged into the current plan.
        ``earlier_tries``: whether this task instance ran before (a reply it kept is then looked for)."""
        from airflow_plan_provider.planners.base import PlanRequest, replan_request

        limits = self.limits
        if state.current_plan is None:
            if params.get("plan"):
                return "conf", _ready_plan(params["plan"], tools, limits)
            if dag_plan is not None:  # the DAG's own plan (frozen), rendered for this run
                return "dag", _ready_plan(dag_plan, tools, limits)
            if self.planner is None:
                raise PlanningError("no planner configured and no plan given in the run's conf")
            request = PlanRequest(goal=state.goal, tools=tools, limits=limits, conf=dict(planner_conf))
            outcome = self._outcome(
                self.planner,
                request,
                lambda raw: validate_plan(raw, tools, limits),
                repair_attempts=self.repair_attempts,
                store=store,
                earlier_tries=earlier_tries,
            )
            return "planner", outcome
        if self.planner is None:
            raise PlanningError("replanning needs a planner; none is configured", reason="no_plan")
        current = validate_plan(state.current_plan)
        outcome = self._outcome(
            self.planner,
            replan_request(state, current, tools, limits, planner_conf),
            lambda raw: validate_plan(merge_replan(current, raw, state.locked)[0], tools, limits),
            repair_attempts=self.repair_attempts,
            store=store,
            earlier_tries=earlier_tries,
        )
        return state.plan_source, outcome

    def _outcome(
        self,
        planner: Planner,
        request: PlanRequest,
        finish: Callable[[Any], ValidatedPlan],
        *,
        repair_attempts: int,
        store: Any,
        earlier_tries: bool,
    ) -> PlanningOutcome:
        """Plan with repairs; reuse the reply an earlier try of this task validated, keep the one accepted.

        Only a task instance that ran before (``earlier_tries``) looks for a kept reply: a first try has
        none, and the look is a request to the API server. A kept reply goes through ``finish`` again
        (the same checks as any planner reply); if it no longer passes, the planner is asked as usual.
        """
        from airflow_plan_provider.planners.base import PlanningOutcome, plan_with_repairs

        kept = _kept_reply(store.get(ACCEPTED_REPLY_KEY)) if store is not None and earlier_tries else None
        if kept is not None:
            try:
                plan = finish(kept["reply"])
            except PlanProviderError as error:
                self.log.warning(
                    "the plan an earlier try validated is not valid now (%s); asking the planner",
                    str(error).splitlines()[0][:MAX_MESSAGE_CHARS],
                )
            else:
                self.log.info("reusing the plan an earlier try of this task validated; planner not asked")
                return PlanningOutcome(plan, kept["attempts"], kept["usage"], kept["rejected"])
        accepted: list[Any] = []

        def finish_and_keep(raw: Any) -> ValidatedPlan:
            validated = finish(raw)
            accepted.append(raw)
            return validated

        outcome = plan_with_repairs(planner, request, finish_and_keep, repair_attempts=repair_attempts)
        if store is not None:
            self._keep(store, accepted[-1], outcome)
        return outcome

    def _reply_store(self, context: Context) -> Any:
        """Where a try keeps the reply it had validated for later tries of this task instance: Airflow's
        task state store, or where Airflow has none, checkpoints in the DAG's artifact store."""
        if airflow_features.task_state_store():
            return context.get("task_state_store")
        ti = context["ti"]
        scope = json.dumps([ti.dag_id, ti.run_id, ti.task_id, ti.map_index])
        return artifacts.TaskStateCheckpoints(scope, self.artifact_store)

    def _keep(self, store: Any, reply: Any, outcome: PlanningOutcome) -> None:
        """Keep an accepted reply for this task's retries (skipped when it is too large to keep)."""
        if isinstance(reply, Plan):
            reply = reply.to_json_dict()
        value = {
            "reply": reply,
            "attempts": outcome.attempts,
            "usage": outcome.usage,
            "rejected": outcome.rejected,
        }
        try:
            size = len(json.dumps(value))
        except (TypeError, ValueError):
            self.log.info("the accepted plan is not JSON; a retry of this task asks the planner again")
            return
        limit = airflow_features.sdk_conf().getint("state_store", "max_value_storage_bytes", fallback=65535)
        if 0 < limit < size:
            self.log.info(
                "the accepted plan (%s bytes) exceeds [state_store] max_value_storage_bytes (%s); "
                "a retry of this task asks the planner again",
                size,
                limit,
            )
            return
        store.set(ACCEPTED_REPLY_KEY, value)


def _ready_plan(raw: Any, tools: ToolRegistry, limits: Limits) -> PlanningOutcome:
    """A ready plan (from the run's conf, or the DAG's own), validated as given: nobody can repair it, so
    its problems are reported at once (raises :class:`PlanningError`, reason ``invalid_plan``)."""
    from airflow_plan_provider.planners.base import PlanningOutcome

    try:
        return PlanningOutcome(validate_plan(raw, tools, limits), attempts=1, usage=[], rejected=[])
    except PlanValidationError as error:
        raise PlanningError(
            f"the ready plan is invalid: {len(error.problems)} problem(s) (a ready plan is run as given; "
            "nothing repairs it)",
            error.problems,
            reason="invalid_plan",
        ) from None


def _kept_reply(value: Any) -> dict[str, Any] | None:
    """What :meth:`PlanOperator._keep` stored, when it has that shape (the store is not ours alone)."""
    if not isinstance(value, Mapping) or "reply" not in value:
        return None
    attempts, usage, rejected = value.get("attempts"), value.get("usage"), value.get("rejected")
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        return None
    if not isinstance(usage, list) or not all(
        isinstance(u, dict) and all(isinstance(n, int) and not isinstance(n, bool) for n in u.values())
        for u in usage
    ):
        return None
    if not isinstance(rejected, list) or not all(isinstance(r, list) for r in rejected):
        return None
    return {"reply": value["reply"], "attempts": attempts, "usage": usage, "rejected": rejected}


def _rejected(rejected: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Event fields for the problems of each rejected attempt: the first ones and each attempt's total."""
    from airflow_plan_provider.planners.base import rejected_problem_count

    return {
        "rejected": [problems[:MAX_REPORTED_PROBLEMS] for problems in rejected],
        "rejected_total": [rejected_problem_count(problems) for problems in rejected],
    }


def heavy_conf_warning(conf: Mapping[str, Any], instances: int) -> str | None:
    """A warning when decoding ``conf`` once per node instance (as Airflow does whenever it loads the
    run's task instances) comes to more than :data:`CONF_DECODE_WARNING_BYTES`; None otherwise."""
    size = len(json.dumps(conf, default=str))
    if size * instances <= CONF_DECODE_WARNING_BYTES:
        return None
    return (
        f"this run's conf is {size / 1000:.0f} kB and its plan has {instances} nodes: Airflow decodes a "
        f"run's conf once for each of its task instances whenever it loads them, in every scheduler loop "
        f"({size * instances / 1e6:.0f} MB each time here). A plan this size runs cheaper from a planner or "
        "built into the DAG (StaticPlanner(plan), or a DAG airflow-plan freeze wrote) than from the conf"
    )
