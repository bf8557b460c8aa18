"""A deterministic discrete-event model of Airflow's slot hand-out to a plan DAG's node instances.

One heap of ``(time, seq, callback, args)``; ``seq`` breaks ties in the order events were made, so a
run is a pure function of its inputs. What is modelled (Airflow 3.3, ``jobs/scheduler_job_runner.py``):

- a scheduler loop (CPU ``loop_cpu``, then ``loop_sleep``) that expands a run's node task when its
  ``plan`` task ended, schedules instances whose reschedule date or retry delay passed (and, for a
  static DAG, tasks whose upstream finished), then queues scheduled instances in the order
  ``-priority_weight, logical_date, map_index`` (``_executable_task_instances_to_queued``), at most
  ``max_tis_per_query`` and the executor's free ``parallelism`` a loop, skipping an instance whose pool,
  DAG run (``max_active_tasks``: queued and running instances) or task (``max_active_tis_per_dagrun``:
  queued, running and deferred, ``ConcurrencyMap.load``) is full;
- a queued instance's process: executor pick-up (``start_date``), start-up CPU, then the node's waiting
  loop: read the states (CPU), ask the policy (:mod:`bench.simulator.policy`), then wait in the slot
  (reading again, or picking its running parents' checkpoints up), defer (its trigger polls on the
  triggerer), step aside (defer), make way (``up_for_reschedule``, scheduled again after the delay), or
  run its tool; after the tool, the record push and task end (CPU) free the slot; a node whose parents
  all saved their checkpoints starts on those without a state read;
- a deferred node's trigger: a state read every ``trigger_poll`` (the first ``trigger_pickup`` after
  the deferral) and, while every unfinished parent runs, a look for their checkpoints every
  ``checkpoint_poll`` in between (``WaitingPolicy.trigger_watches``): all saved, the node resumes;
- a tool that fails transiently: ``up_for_retry``, scheduled again ``retry_delay`` later, until its
  retries are spent (then ``failed``, and its children skip);
- apache/airflow#71172: an instance rescheduled and queued again before the executor's report of its
  previous exit (``report_latency``) fails its try;
- CPU work (process starts, state reads, task ends, scheduler loops) shared by every process on
  ``cores`` cores (processor sharing), or, with ``cores`` = 0, each part taking its own time.

What it simplifies is listed in ``bench/README.md`` (the ``simulate.py`` section), but for the trigger's
checkpoint looks, modelled as above (a look costs ``checkpoint_read`` seconds and no CPU).
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_plan_provider.contract import FINALIZE_TASK, NODES_TASK, PLAN_TASK, lane_task_id
from airflow_plan_provider.plan.graph import topological_layers
from airflow_plan_provider.plan.waiting import Move, Wait, WaitView, deferral_is_free, slots_to_spare
from bench.simulator.model import Caps, Costs, SimPlan, list_scheduling_bound
from bench.simulator.policy import Policy

# Airflow's own sets, kept apart from the policy's so that the model checks the policy's beliefs about
# them: a finished instance; one that holds a worker, pool and DAG slot (EXECUTION_STATES); one counted
# under its task's max_active_tis_per_dagrun (ti_deps/dependencies_states.py ACTIVE_STATES, less
# awaiting_input, which the model has no use for)
FINISHED = frozenset({"success", "failed", "skipped", "upstream_failed", "removed"})
FAILED = frozenset({"failed", "skipped", "upstream_failed"})
IN_SLOT = frozenset({"queued", "running"})
UNDER_TASK_CAP = frozenset({"queued", "running", "deferred"})


#: the weight between two sessions' ranks (``airflow_plan_provider.sessions_in_turn.RANK_STRIDE``)
RANK_STRIDE = 10_000


class Ti:
    """One task instance: a node of one run, or its run's ``plan`` / ``finalize`` task."""

    __slots__ = (
        "awaited",
        "began",
        "came_back",
        "exited_at",
        "grandparents_done",
        "index",
        "key",
        "node",
        "origin",
        "pace",
        "parents_left",
        "read_at",
        "read_done",
        "reschedules",
        "run",
        "seen_far",
        "slot_since",
        "state",
        "task",
        "token",
        "try_number",
        "wait_token",
    )  # fmt: skip

    def __init__(self, run: Run, node: str, task: str, index: int, weight: int) -> None:
        self.run, self.node, self.task, self.index = run, node, task, index
        self.key = (-weight, run.index, index, task)
        self.state: str | None = None
        self.try_number, self.reschedules, self.token, self.wait_token = 1, 0, 0, 0
        self.began = self.read_at = self.origin = self.slot_since = 0.0
        self.read_done = -1.0
        self.awaited: list[str] = []
        self.pace: float | None = None
        self.exited_at: float | None = None
        self.parents_left = 0
        self.came_back = self.seen_far = False
        #: the grandparents a node reading one by one saw finished in this start of its task
        self.grandparents_done: set[str] = set()


class Run:
    def __init__(self, index: int, plan: SimPlan, trigger_at: float, static: bool) -> None:
        self.index, self.plan, self.trigger_at, self.static = index, plan, trigger_at, static
        order = plan.order
        self.tasks: dict[str, list[str]] = {}
        for node in order:
            self.tasks.setdefault(task_of(plan, node), []).append(node)
        self.weights = {n: 1 + d for n, d in plan.descendants().items()} if static else {}
        self.tis: dict[str, Ti] = {}
        self.dag_active = 0
        self.task_active: dict[str, int] = {}
        self.tool_done: set[str] = set()
        self.tool_start: dict[str, float] = {}
        self.tool_end: dict[str, float] = {}
        self.watchers: dict[str, list[Ti]] = {}
        self.trigger_watchers: dict[str, list[Ti]] = {}
        self.unfinished = len(order)
        #: chain child → its chain parent and back (Simulation(chain_lanes=True)); empty otherwise
        self.chain_parent: dict[str, str] = {}
        self.chain_child: dict[str, str] = {}
        self.expanded = self.planned = False
        self.start: float | None = None
        self.end: float | None = None
        self.finalizing = False


def task_of(plan: SimPlan, node: str) -> str:
    return lane_task_id(plan.lanes.get(node))


@dataclass
class Outcome:
    """What one simulation did. ``makespans``: per run, the first task's start to the last task's end
    (``plan`` → ``finalize`` for a plan DAG); ``deadlock``: why the run could not finish (None: it did);
    ``waiting``: slot-seconds nodes spent waiting for parents in a slot; ``given_back``: slot-seconds of
    processes that gave their slot back (deferred, stepped aside, made way) before they waited;
    ``processes``: node task processes started."""

    makespans: list[float] = field(default_factory=list)
    deadlock: str | None = None
    time: float = 0.0
    finished: int = 0
    nodes: int = 0
    waiting: float = 0.0
    given_back: float = 0.0
    processes: int = 0
    slot_seconds: float = 0.0
    tool_seconds: float = 0.0
    moves: dict[str, int] = field(default_factory=dict)
    events: int = 0
    failed_by_race: int = 0
    handoffs: list[float] = field(default_factory=list)

    @property
    def makespan(self) -> float:
        return max(self.makespans, default=math.inf)

    @property
    def handoff(self) -> float:
        """The median hand-off: a node's last parent's tool end → its own tool start."""
        return statistics.median(self.handoffs) if self.handoffs else math.nan

    @property
    def wasted(self) -> float:
        return self.waiting + self.given_back


class Cpu:
    """Processor sharing on ``cores`` cores with a virtual clock: every job progresses at the same rate
    min(1, cores / jobs), so a job of ``work`` CPU-seconds ends when the virtual clock passed its start
    plus ``work``."""

    def __init__(self, sim: Simulation, cores: float) -> None:
        self.sim, self.cores = sim, cores
        self.virtual = self.at = 0.0
        self.jobs: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self.version = 0

    def rate(self) -> float:
        return 1.0 if len(self.jobs) <= self.cores else self.cores / len(self.jobs)

    def _advance(self, now: float) -> None:
        if self.jobs:
            self.virtual += (now - self.at) * self.rate()
        self.at = now

    def submit(self, work: float, callback: Callable[..., None], *args: Any) -> None:
        now = self.sim.now
        if self.cores <= 0:
            self.sim.at(now + work, callback, *args)
            return
        self._advance(now)
        heapq.heappush(self.jobs, (self.virtual + work, self.sim.next_seq(), callback, args))
        self._wake(now)

    def _wake(self, now: float) -> None:
        self.version += 1
        if self.jobs:
            self.sim.at(
                now + max(0.0, (self.jobs[0][0] - self.virtual) / self.rate()), self._tick, self.version
            )

    def _tick(self, version: int) -> None:
        if version != self.version:
            return
        now = self.sim.now
        self._advance(now)
        done = []
        while self.jobs and self.jobs[0][0] <= self.virtual + 1e-9:
            done.append(heapq.heappop(self.jobs))
        self._wake(now)
        for _, _, callback, args in done:
            callback(*args)


class Simulation:
    """One deployment running ``plans`` (one run each, triggered ``run_gap`` seconds apart) as plan
    DAGs whose nodes follow ``policy`` (or, ``static``, as static DAGs: one task per node, scheduled
    when its upstream finished)."""

    def __init__(
        self,
        plans: Sequence[SimPlan],
        policy: Policy,
        caps: Caps = Caps(),  # noqa: B008  # frozen
        costs: Costs = Costs(),  # noqa: B008  # frozen
        *,
        static: bool = False,
        checkpoints: bool = True,
        run_gap: float = 0.0,
        quiet_bound: float | None = None,
        time_bound: float | None = None,
        trigger_looks: bool = True,
        resumed_first: bool = False,
        runs_undated: bool = False,
        sessions_in_turn: bool = True,
        node_weights: str | None = "position",
        comes_back: bool = True,
        yields_to_ready: str | None = None,
        yields_after: float = 0.0,
        starts_deferred: str | None = None,
        near_within: float | None = None,
        near_if_idle: str | None = None,
        chain_lanes: bool = False,
        chain_lanes_up_to: int | None = None,
        tie_order: int | None = None,
        spare_share: float = 1.0,
        gate_long_tools: float | None = None,
    ) -> None:
        # with ``near_if_idle`` "spare-less...": a run with slots to spare gates its nodes' coming near
        # too (near only while a slot is idle) once the median of its finished tools ran longer than
        # this many seconds (a node near a long tool holds its slot long); None: never
        self.gate_long_tools = gate_long_tools
        # with ``starts_deferred`` "near where slots are many": a run has slots to spare when its plan's
        # nodes fill at most this share of its slots times its layers (1.0: plan.waiting.slots_to_spare)
        self.spare_share = spare_share
        # a static DAG's tasks of equal weight: the scheduler queues them in the order its database
        # returns them. None: the order Airflow created their instances in (the DAG's tasks, defined in
        # the plan's node order), SQLite's order; PostgreSQL returns them in the order of its heap, which
        # no order of the plan predicts. A seed: a random order drawn from it (``--heldout`` shows how
        # far that order alone moves a static DAG's makespan)
        self.tie_order = tie_order
        # a plan run's nodes with parents start on the triggerer (Airflow's start_from_trigger: the
        # scheduler defers the instance, no worker start, no slot): "near" (its trigger has it take a slot
        # when its parents run their tools), "ready" (when they finished or saved their checkpoints), or
        # "near where slots are many" (plan.waiting.slots_to_spare: "ready" in a run whose plan has more
        # nodes than its layers times its slots, or with ``near_if_idle`` "spare-less" near while a slot
        # is idle, the package's rule; "near" otherwise; the runs without slots to spare are weighed by
        # descendant places, as the package's planning task weighs them); None: each node starts in a slot
        self.starts_deferred = starts_deferred
        # an oracle: a deferred node's trigger has it come back to wait in a slot only once every parent
        # it waits for is due to end its tool within ``near_within`` seconds (None: as soon as they run
        # their tools, WaitingPolicy.trigger_move's WAIT)
        self.near_within = near_within
        # a deferred node's trigger has it come back to wait in a slot only while its run leaves a slot
        # idle: fewer of its instances queued, running (and, "...+scheduled", scheduled) than the run's
        # slots (one read of the run's node tasks' states); else it reads again a poll later. "all": in
        # every run; "spare-less": only in the runs without slots to spare, whose nodes then come near
        # too (the others come near freely); None: never
        self.near_if_idle = near_if_idle
        # an oracle no node has: a waiting node that sees a ready node of its run without a slot defers
        # ("far": only when its parents wait on their own parents; "all": always); "scheduled": what a node
        # can see in one count of its run's instances (Airflow's task instance count by state), it defers
        # when another instance of its run waits for a slot, ready or not; None: the policy alone. It
        # yields only once it waited ``yields_after`` seconds in its slot
        self.yields_to_ready, self.yields_after = yields_to_ready, yields_after
        self.policy, self.caps, self.costs, self.static, self.checkpoints = (
            policy,
            caps,
            costs,
            static,
            checkpoints,
        )
        self.trigger_looks = trigger_looks  # False: a deferred node's trigger reads states only
        # a node its trigger resumed goes before every node not yet resumed (a higher priority weight)
        self.resumed_first = resumed_first
        # runs without a logical date (the scheduler's order then falls to the map index); a plan run's
        # node instances weighed as the package's SessionsInTurn does: less the session's rank
        self.runs_undated, self.sessions_in_turn = runs_undated, sessions_in_turn
        # a deferred node's trigger has it come back to wait in a slot (once a try) when its parents run
        # their tools (WaitingPolicy.trigger_move's WAIT); False: it waits on the triggerer to the end
        self.comes_back = comes_back
        self.heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self.seq = 0
        self.now = 0.0
        self.cpu = Cpu(self, costs.cores)
        self.runs = [Run(i, plan, i * run_gap, static) for i, plan in enumerate(plans)]
        # a plan run's node instances weighed by their node: "position" (one lower per place in the
        # plan's run order, across its tasks, as the package's SessionsInTurn does), "descendants"
        # (1 + the node's descendants, as a static DAG's tasks), "descendants from cap 4" (by
        # descendants where the least of the task, DAG, executor and pool caps is 4 or more, else by
        # position), "descendant places" (one lower per place in the order by descendants, most first,
        # ties in run order: the package's places with start_on_triggerer where the caps are 4 or more),
        # "descendant places from cap 4", None (one weight: Airflow's map-index order within each task)
        # the tightest of the caps on a node: the weights' "from cap 4", the time bound below
        cap = min(c for c in (caps.task_cap, caps.dag_cap, caps.parallelism, caps.pool) if c is not None)
        # the runs whose nodes come near (all but where the package's planning task finds no slots to
        # spare, from the DAG's cap and the executor's parallelism: PlanOperator.slots)
        self.near_runs = {
            run.index
            for run in self.runs
            if starts_deferred != "near where slots are many"
            or slots_to_spare(
                math.ceil(len(run.plan.parents) / spare_share),
                len(topological_layers(run.plan.parents)),
                min(caps.dag_cap, caps.parallelism),
            )
        }
        if chain_lanes_up_to is not None and cap <= chain_lanes_up_to:
            # up to that cap, chains weighed by descendants with heads in slots; above it, the options
            chain_lanes, node_weights, self.starts_deferred = True, "descendants", None
        if node_weights in ("descendants from cap 4", "descendant places from cap 4"):
            node_weights = node_weights.removesuffix(" from cap 4") if cap >= 4 else "position"
        for run in self.runs:
            weights = node_weights
            if starts_deferred == "near where slots are many" and run.index not in self.near_runs:
                weights = "descendant places"  # nodes come to their slots ready, as a static DAG's tasks
            if not static and weights in ("position", "descendant places"):
                order = run.plan.order
                if weights == "descendant places":
                    descendants = run.plan.descendants()
                    order = sorted(order, key=lambda n: -descendants[n])
                run.weights = {n: len(order) - i for i, n in enumerate(order)}
                # a mapped task's first instance is the placeholder Airflow created with the run (map
                # index -1, no node yet: place 0), turned into map index 0 at expansion, weight kept
                for nodes in run.tasks.values():
                    run.weights[nodes[0]] = len(order)
            elif not static and weights == "descendants":
                run.weights = {n: 1 + d for n, d in run.plan.descendants().items()}
            if not static and chain_lanes:
                # the run's nodes laid out in chains: a node with a chain parent is an instance of a mapped
                # task group's next step, which Airflow schedules once its chain parent's instance ended (a
                # static DAG's hand-off, bench/deferred.py); it waits for its other parents as any node
                # does. Chain heads start as the other options say
                run.chain_parent = chain_cover(run.plan)
                run.chain_child = {p: c for c, p in run.chain_parent.items()}
        self.scheduled: list[tuple[tuple[int, int, int, str], Ti]] = []
        self.scheduled_per: dict[tuple[int, str], int] = {}
        self.due: list[tuple[float, int, Ti]] = []
        self.executor_used = 0
        self.pool_used: dict[str, int] = {}
        self.last_change = 0.0
        self.out = Outcome(nodes=sum(len(p.parents) for p in plans))
        self.ended: dict[int, list[float]] = {}
        self.open_runs = len(self.runs)
        self.loop_at: float | None = None  # when the next scheduler loop starts (None: it idles)
        self.loop_base = 0.0  # when the last loop went to sleep
        self.loop_id = 0
        self.loop_running = False
        longest = max((s for p in plans for s in p.seconds.values()), default=0.0)
        self.quiet_bound = quiet_bound or 2 * longest + 600.0
        bound = sum(list_scheduling_bound(p, cap) for p in plans)
        tries = 1 + caps.retries
        per_node = 60.0 * tries * sum(len(p.parents) for p in plans) / cap
        self.time_bound = time_bound or 10 * bound + per_node + 600.0

    # ---------------------------------------------------------------------------- event machinery

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def at(self, when: float, callback: Callable[..., None], *args: Any) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (when, self.seq, callback, args))

    def run(self) -> Outcome:
        for run in self.runs:
            self.at(run.trigger_at, self._wake, run.trigger_at)
        out = self.out
        while self.heap:
            when, _, callback, args = heapq.heappop(self.heap)
            self.now = when
            callback(*args)
            out.events += 1
            if self.open_runs == 0:
                break
            if when - self.last_change > self.quiet_bound:
                out.deadlock = f"no state changed for {when - self.last_change:.0f} s"
                break
            if when > self.time_bound:
                out.deadlock = f"not finished after {when:.0f} s (bound {self.time_bound:.0f} s)"
                break
        out.time = self.now
        out.makespans = [r.end - r.start for r in self.runs if r.end is not None and r.start is not None]
        out.finished = sum(len(r.plan.parents) - r.unfinished for r in self.runs)
        for run in self.runs:
            for node, start in run.tool_start.items():
                ends = [run.tool_end[p] for p in run.plan.parents[node] if p in run.tool_end]
                if ends:
                    out.handoffs.append(start - max(ends))
        if out.deadlock is None and out.finished < out.nodes:
            out.deadlock = "no event left"
        return out

    # ---------------------------------------------------------------------------- states and caps

    def _pool(self, ti: Ti) -> tuple[str, int | None]:
        lane = ti.run.plan.lanes.get(ti.node)
        if lane is not None and ti.task != PLAN_TASK and ti.task != FINALIZE_TASK:
            return lane, self.caps.lane_pools.get(lane)
        if ti.task in (PLAN_TASK, FINALIZE_TASK):
            return "default", None
        return NODES_TASK, self.caps.pool

    def _pool_holds(self, state: str | None) -> bool:
        return state in IN_SLOT or (state == "deferred" and self.caps.pool_counts_deferred)

    def set_state(self, ti: Ti, new: str | None) -> None:
        old, run = ti.state, ti.run
        if old == new:
            return
        pool, _ = self._pool(ti)
        if old in IN_SLOT:
            run.dag_active -= 1
            if new in IN_SLOT or not self.costs.exit_hold:
                self.executor_used -= 1
            else:  # the executor learns of the process's exit (its slot open again) a little later
                self.at(self.now + self.costs.exit_hold, self._executor_slot_open)
            if new not in IN_SLOT:
                self.out.slot_seconds += self.now - ti.slot_since
        if old in UNDER_TASK_CAP:
            run.task_active[ti.task] -= 1
        if self._pool_holds(old):
            self.pool_used[pool] -= 1
        if old == "scheduled":
            at = bisect.bisect_left(self.scheduled, ti.key, key=lambda item: item[0])
            del self.scheduled[at]
            self.scheduled_per[(run.index, ti.task)] -= 1
        if new in IN_SLOT:
            run.dag_active += 1
            self.executor_used += 1
            if old not in IN_SLOT:
                ti.slot_since = self.now
        if new in UNDER_TASK_CAP:
            run.task_active[ti.task] = run.task_active.get(ti.task, 0) + 1
        if self._pool_holds(new):
            self.pool_used[pool] = self.pool_used.get(pool, 0) + 1
        if new == "scheduled":
            bisect.insort(self.scheduled, (ti.key, ti), key=lambda item: item[0])
            k = (run.index, ti.task)
            self.scheduled_per[k] = self.scheduled_per.get(k, 0) + 1
        ti.state = new
        ti.token += 1
        self.last_change = self.now
        if new == "scheduled" or old in UNDER_TASK_CAP or self._pool_holds(old):
            self._wake(self.now)
        for watcher in run.trigger_watchers.get(ti.node, ()):
            self._trigger_tick(watcher)
        if new in FINISHED and ti.task not in (PLAN_TASK, FINALIZE_TASK):
            run.unfinished -= 1
            if run.unfinished == 0:
                self._wake(self.now)
            if run.static:
                for child in self._children(run, ti.node):
                    child.parents_left -= 1
                    if child.parents_left == 0:
                        self._due(self.now, child)
            elif ti.node in run.chain_child:
                self._due(self.now, run.tis[run.chain_child[ti.node]])

    def _executor_slot_open(self) -> None:
        self.executor_used -= 1
        self._wake(self.now)

    def _children(self, run: Run, node: str) -> list[Ti]:
        if not hasattr(run, "children"):
            children: dict[str, list[str]] = {n: [] for n in run.plan.parents}
            for n, ps in run.plan.parents.items():
                for p in ps:
                    children[p].append(n)
            run.children = children  # type: ignore[attr-defined]
        return [run.tis[c] for c in run.children[node]]  # type: ignore[attr-defined]

    def _due(self, when: float, ti: Ti) -> None:
        self.seq += 1
        heapq.heappush(self.due, (when, self.seq, ti))
        self._wake(when)

    def _wake(self, when: float) -> None:
        """Have a scheduler loop start at the first loop time at or after ``when``. The loop runs every
        ``loop_sleep`` (plus its own time) while it has work; a loop that found nothing to do and nothing
        due is not simulated (it would change nothing) until something needs one, and then starts on the
        idle loop's beat."""
        if self.loop_running:
            return  # the running loop's body sees it, or decides when the next one starts
        period = self.costs.loop_sleep + self.costs.loop_cpu
        at = self.loop_base + max(0.0, math.ceil((when - self.loop_base) / period - 1e-9)) * period
        if self.loop_at is None or at < self.loop_at - 1e-9:
            self.loop_at = at
            self.loop_id += 1
            self.at(at, self._loop, self.loop_id)

    # ---------------------------------------------------------------------------- the scheduler

    def _loop(self, loop_id: int) -> None:
        if loop_id != self.loop_id:
            return  # superseded by an earlier loop
        self.loop_running = True
        tis = sum(r.unfinished for r in self.runs if r.trigger_at <= self.now and r.end is None)
        self.cpu.submit(self.costs.loop_cpu + self.costs.loop_ti_cpu * tis, self._loop_body)

    def _loop_body(self) -> None:
        now = self.now
        for run in self.runs:
            if run.trigger_at <= now and PLAN_TASK not in run.tis and not run.static:
                ti = run.tis[PLAN_TASK] = Ti(run, PLAN_TASK, PLAN_TASK, -1, 10**9)
                self.set_state(ti, "scheduled")
            if (run.planned or (run.static and run.trigger_at <= now)) and not run.expanded:
                self._expand(run)
            if run.expanded and run.unfinished == 0 and not run.finalizing:
                run.finalizing = True
                if run.static:
                    run.end = max(self.ended.get(run.index, [now]))
                    self.open_runs -= 1
                else:
                    ti = run.tis[FINALIZE_TASK] = Ti(run, FINALIZE_TASK, FINALIZE_TASK, -1, 10**9)
                    self.set_state(ti, "scheduled")
        while self.due and self.due[0][0] <= now:
            _, _, ti = heapq.heappop(self.due)
            if ti.state is None and ti.run.chain_parent:
                self.set_state(ti, "scheduled")
            elif ti.run.static and ti.state is None:
                parents = ti.run.plan.parents[ti.node]
                failed = any(ti.run.tis[p].state in FAILED for p in parents)
                self.set_state(ti, "upstream_failed" if failed else "scheduled")
            elif ti.state in ("up_for_retry", "up_for_reschedule"):
                self.set_state(ti, "scheduled")
        queued = self._queue()
        self.loop_at, self.loop_base, self.loop_running = None, now + self.costs.loop_sleep, False
        needs = any(
            (r.planned and not r.expanded) or (r.expanded and r.unfinished == 0 and not r.finalizing)
            for r in self.runs
        )
        if queued or needs:
            self._wake(self.loop_base)
        elif self.due:
            self._wake(self.due[0][0])

    def _expand(self, run: Run) -> None:
        run.expanded = True
        rank = 0
        if self.sessions_in_turn and not run.static:
            rank = sum(1 for r in self.runs[: run.index] if r.trigger_at <= self.now and r.end is None)
        ties: dict[str, int] = {}
        if run.static:
            # tasks of equal weight come in the order Airflow created their instances, the DAG's task
            # order: the plan's node order (or, with ``tie_order``, a random order drawn from it)
            defined = list(run.plan.parents)
            if self.tie_order is not None:
                random.Random(f"{self.tie_order}:{run.index}").shuffle(defined)
            ties = {node: place for place, node in enumerate(defined)}
        for task, nodes in run.tasks.items():
            for index, node in enumerate(nodes):
                ti = run.tis[node] = Ti(run, node, task, index, run.weights.get(node, 1))
                if ties:
                    ti.key = (ti.key[0], ti.key[1], ties[node], task)
                if self.runs_undated:  # no logical date: the runs' instances interleave by map index
                    ti.key = (ti.key[0], 0, index, task, run.index)  # type: ignore[assignment]
                if rank:  # a weight a stride lower per unfinished run created before this one
                    ti.key = (ti.key[0] + rank * RANK_STRIDE, *ti.key[1:])  # type: ignore[assignment]
                ti.parents_left = len(run.plan.parents[node])
        for node, ti in run.tis.items():
            if node in (PLAN_TASK, FINALIZE_TASK):
                continue
            if run.static:
                if ti.parents_left == 0:
                    self.set_state(ti, "scheduled")
            elif node in run.chain_parent:
                continue  # scheduled once its chain parent ended (set_state)
            elif self.starts_deferred and run.plan.parents[node]:
                self._start_deferred(ti)
            else:
                self.set_state(ti, "scheduled")

    def _start_deferred(self, ti: Ti) -> None:
        """The scheduler defers the instance as it schedules it (``start_from_trigger``): its trigger
        reads its parents from the triggerer's pick-up on, and it takes a slot only when resumed ("near":
        its trigger may have it come back at once; "ready": never)."""
        run = ti.run
        near = self.starts_deferred != "ready" and (run.index in self.near_runs or self._near_gated(run))
        ti.came_back = not near
        self._defer(ti, seen_far=near)

    def _defer(self, ti: Ti, seen_far: bool) -> None:
        """``ti`` deferred: its trigger reads first at the triggerer's pick-up (``seen_far``: as if an
        earlier read had seen its parents far, so it may come back to wait near them)."""
        ti.origin = ti.read_at = -1.0  # its trigger has not read yet
        ti.seen_far = seen_far
        ti.pace = None
        self.set_state(ti, "deferred")
        self.at(self._triggerer_tick(self.now + self.costs.trigger_pickup), self._trigger, ti, ti.token)

    def _queue(self) -> int:
        caps = self.caps
        budget = min(caps.max_tis_per_query, caps.parallelism - self.executor_used)
        blocked: set[tuple[int, str]] = set()
        keys = sum(1 for count in self.scheduled_per.values() if count)
        picked: list[Ti] = []
        pool_used = dict(self.pool_used)
        for _, ti in self.scheduled:
            if len(picked) >= budget or len(blocked) >= keys:
                break
            run, k = ti.run, (ti.run.index, ti.task)
            if k in blocked:
                continue
            pool, slots = self._pool(ti)
            dag_cap = caps.dag_cap
            task_cap = caps.task_cap if ti.task.startswith(NODES_TASK) else None
            if (
                (slots is not None and pool_used.get(pool, 0) >= slots)
                or run.dag_active + sum(1 for p in picked if p.run is run) >= dag_cap
                or (
                    task_cap is not None
                    and run.task_active.get(ti.task, 0)
                    + sum(1 for p in picked if p.run is run and p.task == ti.task)
                    >= task_cap
                )
            ):
                blocked.add(k)
                continue
            pool_used[pool] = pool_used.get(pool, 0) + 1
            picked.append(ti)
        for ti in picked:
            self._queued(ti)
        return len(picked)

    # ---------------------------------------------------------------------------- a task process

    def _queued(self, ti: Ti) -> None:
        self.set_state(ti, "queued")
        if ti.exited_at is not None and self.now < ti.exited_at + self.costs.report_latency:
            self.at(ti.exited_at + self.costs.report_latency, self._race, ti, ti.slot_since)
        self.at(self.now + self.costs.queue_latency, self._process, ti, ti.token)

    def _race(self, ti: Ti, queued_at: float) -> None:
        """The executor's report of the previous exit finds the instance queued again: Airflow fails the
        try (apache/airflow#71172)."""
        if ti.state in IN_SLOT and ti.slot_since == queued_at:
            self.out.failed_by_race += 1
            self._try_failed(ti)

    def _process(self, ti: Ti, token: int) -> None:
        if ti.token != token:
            return
        self.set_state(ti, "running")
        run = ti.run
        if run.start is None:
            run.start = self.now
        if ti.task not in (PLAN_TASK, FINALIZE_TASK):
            self.out.processes += 1
        costs = self.costs
        factor = costs.static_start_factor if run.static else 1.0
        work = (costs.start_cpu + costs.start_node_cpu * len(run.plan.parents)) * factor
        self.cpu.submit(work, self._started, ti, ti.token)

    def _started(self, ti: Ti, token: int) -> None:
        if ti.token != token:
            return
        ti.began = self.now
        if ti.task == PLAN_TASK:
            self.at(self.now + self.costs.plan_task, self._task_end, ti, ti.token)
        elif ti.task == FINALIZE_TASK:
            self.at(self.now + self.costs.finalize_task, self._task_end, ti, ti.token)
        elif ti.run.static or not ti.run.plan.parents[ti.node]:
            self._tool(ti)
        elif self.checkpoints and all(p in ti.run.tool_done for p in ti.run.plan.parents[ti.node]):
            # every parent saved its checkpoint in this run: the node starts on those, reading no state
            ti.wait_token += 1
            self.at(self.now + self.costs.checkpoint_read, self._picked_up, ti, ti.token, ti.wait_token)
        else:
            # a node that came back to wait counts its grandparents finished: its trigger saw them so
            parents = ti.run.plan.parents
            near = {g for p in parents[ti.node] for g in parents[p]}
            ti.grandparents_done = near if ti.came_back else set()
            self._read(ti, ti.token)

    def _read(self, ti: Ti, token: int) -> None:
        if ti.token != token:
            return
        run = ti.run
        plan = run.plan
        if not self.policy.reads_one_by_one(len(plan.parents)):
            parents = plan.parents[ti.node]
            tasks = {ti.task, *(run.tis[p].task for p in parents)}
            tasks |= {run.tis[g].task for p in parents for g in plan.parents[p]}
            rows = sum(len(run.tasks[t]) for t in tasks)
        else:
            rows = len(plan.parents[ti.node]) + len(self._grandparents_read(ti))
        self.cpu.submit(
            self.costs.read_cpu + rows * self.costs.read_row_cpu, self._decide, ti, ti.token, rows
        )

    def _decide(self, ti: Ti, token: int, rows: int) -> None:
        if ti.token != token:
            return
        run, plan, now = ti.run, ti.run.plan, self.now
        tis = run.tis
        complete = not self.policy.reads_one_by_one(len(plan.parents))
        if complete:
            parents = plan.parents[ti.node]
            tasks = {ti.task, *(tis[p].task for p in parents)}
            tasks |= {tis[g].task for p in parents for g in plan.parents[p]}
            if len(tasks) == 1:

                def state_of(node: str) -> str | None:
                    return tis[node].state
            else:

                def state_of(node: str) -> str | None:
                    other = tis[node]
                    return other.state if other.task in tasks else None

            pollers = sum(1 for t in tasks for n in run.tasks[t] if tis[n].state == "running")
        else:
            read = self._grandparents_read(ti)
            done = ti.grandparents_done
            done.update(g for g in read if tis[g].state in FINISHED)
            wanted = set(plan.parents[ti.node]) | read

            def state_of(node: str) -> str | None:
                return tis[node].state if node in wanted else "success" if node in done else None

            pollers = sum(1 for p in wanted if tis[p].state == "running")
        view = WaitView(
            node=ti.node,
            parents=plan.parents,
            state_of=state_of,
            queue=run.tasks[ti.task],
            waited=now - ti.began,
            made_way=ti.reschedules,
            task_cap=self.caps.task_cap,
            complete=complete,
            rows=rows,
            pollers=pollers,
            checkpoints=self.checkpoints,
            free_deferral=self._free_deferral(ti),
        )
        move = self.policy.next_move(view)
        yields = self.yields_to_ready
        if move.kind is Wait.WAIT and yields and (yields != "far" or not move.near):
            ready = now - ti.began >= self.yields_after and any(
                t.state == "scheduled"
                and (yields == "scheduled" or all(tis[p].state in FINISHED for p in plan.parents[t.node]))
                for t in tis.values()
            )
            if ready:
                move = Move(Wait.DEFER)
                self.out.moves["yield"] = self.out.moves.get("yield", 0) + 1
        moves = self.out.moves
        moves[move.kind.value] = moves.get(move.kind.value, 0) + 1
        if move.kind is Wait.READY:
            self.out.waiting += now - ti.began
            if any(tis[p].state in FAILED for p in plan.parents[ti.node]):
                self.cpu.submit(self.costs.end_cpu, self._skip, ti, ti.token)
            else:
                self._tool(ti)
        elif move.kind is Wait.WAIT:
            ti.wait_token += 1
            ti.read_at = now + move.after
            self.at(ti.read_at, self._read, ti, ti.token)
            ti.pace = self.policy.checkpoint_poll if move.near and self.checkpoints else None
            if ti.pace is not None:
                ti.origin = now
                ti.awaited = [p for p in plan.parents[ti.node] if tis[p].state not in FINISHED]
                for parent in ti.awaited:
                    watchers = run.watchers.setdefault(parent, [])
                    if ti not in watchers:
                        watchers.append(ti)
                self._look_for_checkpoints(ti)
        elif move.kind in (Wait.DEFER, Wait.STEP_ASIDE):
            self._gave_back(ti)
            self._defer(ti, seen_far=False)
        else:
            self._gave_back(ti)
            ti.reschedules += 1
            ti.came_back = False  # a new start of the task: it may come back once again
            ti.exited_at = now
            self.set_state(ti, "up_for_reschedule")
            self._due(now + move.after, ti)

    def _grandparents_read(self, ti: Ti) -> set[str]:
        """The grandparents a node reading one by one reads besides its parents: while every unfinished
        parent runs (:meth:`~WaitingPolicy.reads_grandparents`), those of them it has not seen finished."""
        plan, tis = ti.run.plan, ti.run.tis
        unfinished = [p for p in plan.parents[ti.node] if tis[p].state not in FINISHED]
        if not self.policy.reads_grandparents(tis[p].state for p in unfinished):
            return set()
        return {g for p in unfinished for g in plan.parents[p]} - ti.grandparents_done

    def _free_deferral(self, ti: Ti) -> bool:
        """Whether ``ti`` deferred holds nothing another instance could wait for, as the node task tells
        its waiting policy: the node tasks' cap cannot fill (the plan's size bounds each task's) and the
        pools count no deferred instance. The same for every node of a run."""
        return deferral_is_free(self.caps.task_cap, len(ti.run.plan.parents), self.caps.pool_counts_deferred)

    def _gave_back(self, ti: Ti) -> None:
        self.out.waiting += self.now - ti.began
        self.out.given_back += ti.began - ti.slot_since

    def _look_for_checkpoints(self, ti: Ti) -> None:
        """A waiting node looks for its running parents' checkpoints every ``pace`` seconds from its
        last read: it starts at the first look after the last of them saved its checkpoint."""
        if ti.pace is None or ti.state != "running" or not all(p in ti.run.tool_done for p in ti.awaited):
            return
        ticks = math.ceil(max(0.0, self.now - ti.origin) / ti.pace - 1e-9)
        self.at(
            ti.origin + ticks * ti.pace + self.costs.checkpoint_read,
            self._picked_up,
            ti,
            ti.token,
            ti.wait_token,
        )

    def _picked_up(self, ti: Ti, token: int, wait_token: int) -> None:
        if ti.token != token or ti.wait_token != wait_token:
            return
        ti.wait_token += 1
        self.out.waiting += self.now - ti.began
        self.out.moves["checkpoint"] = self.out.moves.get("checkpoint", 0) + 1
        self._tool(ti)

    def _trigger(self, ti: Ti, token: int) -> None:
        """A deferred node's trigger reads its parents' states every ``trigger_poll`` seconds from its
        first read. Its answer changes only when a parent's state does, so the read is simulated at the
        first poll after each such change (the same moments, without the reads that change nothing)."""
        if ti.token != token:
            return
        run = ti.run
        ti.read_done = self.now
        parents, tis = run.plan.parents, run.tis
        states = [tis[p].state for p in parents[ti.node]]
        comes_back = self.comes_back and not ti.came_back
        grandparents = [[tis[g].state for g in parents[p]] for p in parents[ti.node]] if comes_back else None
        kind = self.policy.trigger_move(
            states, self._free_deferral(ti), grandparents if ti.seen_far else None
        )
        if grandparents is not None and not self.policy.parents_run_tools(states, grandparents):
            ti.seen_far = True
        if kind is Wait.WAIT and self.near_within is not None:
            seconds, started = run.plan.seconds, run.tool_start
            unfinished = [p for p in parents[ti.node] if tis[p].state not in FINISHED]
            due = max(
                (started[p] + seconds[p] if p in started else math.inf for p in unfinished), default=0.0
            )
            if due - self.now > self.near_within:
                kind = None
                if due < math.inf:
                    self.at(due - self.near_within, self._trigger, ti, ti.token)
        if kind is Wait.WAIT and self._near_gated(run):
            scheduled = 0
            if self.near_if_idle.endswith("+scheduled"):  # type: ignore[union-attr]
                scheduled = sum(n for (index, _), n in self.scheduled_per.items() if index == run.index)
            if run.dag_active + scheduled >= min(self.caps.dag_cap, self.caps.parallelism):
                kind = None
                self.at(self.now + self.policy.trigger_poll, self._trigger, ti, ti.token)
        if kind is Wait.WAIT:
            ti.came_back = True
            self.out.moves["came_back"] = self.out.moves.get("came_back", 0) + 1
        if kind is not None:
            self._resume(ti)
            return
        if ti.origin < 0:  # its first read: from now on it reads every trigger_poll
            ti.origin = self.now
            watched = list(parents[ti.node])
            if comes_back:  # its parents' own parents finishing tells it to come back
                watched += [g for p in parents[ti.node] for g in parents[p]]
            for parent in watched:
                watchers = run.trigger_watchers.setdefault(parent, [])
                if ti not in watchers:
                    watchers.append(ti)
        ti.pace = None
        if self.checkpoints and self.trigger_looks and self.policy.trigger_watches(states):
            ti.pace = self.policy.checkpoint_poll
            ti.awaited = [p for p in run.plan.parents[ti.node] if run.tis[p].state not in FINISHED]
            self._trigger_look(ti)

    def _near_gated(self, run: Run) -> bool:
        """Whether a node of ``run`` comes near its parents only while the run leaves a slot idle."""
        if self.near_if_idle is None:
            return False
        if self.near_if_idle.startswith("all") or run.index not in self.near_runs:
            return True
        if self.gate_long_tools is not None:
            ran = [run.tool_end[n] - run.tool_start[n] for n in run.tool_end]
            return bool(ran) and statistics.median(ran) > self.gate_long_tools
        return False

    def _trigger_look(self, ti: Ti) -> None:
        """A deferred node's trigger that saw every unfinished parent running looks for their
        checkpoints every ``checkpoint_poll`` seconds from its read: once every one of them saved its
        result, the node resumes (``trigger_watches``)."""
        if ti.state != "deferred" or ti.pace is None or not all(p in ti.run.tool_done for p in ti.awaited):
            return
        ticks = math.ceil(max(0.0, self.now - ti.read_done) / ti.pace - 1e-9)
        when = ti.read_done + ticks * ti.pace + self.costs.checkpoint_read
        self.at(when, self._trigger_found, ti, ti.token)

    def _trigger_found(self, ti: Ti, token: int) -> None:
        if ti.token == token and ti.state == "deferred":
            self.out.moves["trigger_checkpoint"] = self.out.moves.get("trigger_checkpoint", 0) + 1
            self._resume(ti)

    def _triggerer_tick(self, at: float) -> float:
        """The triggerer's first tick at or after ``at`` (``Costs.triggerer_tick``; 0: ``at`` itself)."""
        tick = self.costs.triggerer_tick
        return math.ceil(at / tick - 1e-9) * tick if tick > 0 else at

    def _resume(self, ti: Ti) -> None:
        """The node's trigger fired: it is scheduled again at the triggerer's next tick (no read of its
        trigger is due any more)."""
        ti.origin = -1.0
        ti.pace = None
        ti.token += 1
        if self.costs.triggerer_tick > 0:
            self.at(self._triggerer_tick(self.now), self._resumed, ti, ti.token)
        else:
            self._resumed(ti, ti.token)

    def _resumed(self, ti: Ti, token: int) -> None:
        if ti.token != token or ti.state != "deferred":
            return
        if self.resumed_first and ti.key[0] > -(10**6):
            ti.key = (ti.key[0] - 10**6, *ti.key[1:])  # type: ignore[assignment]
        self.set_state(ti, "scheduled")

    def _trigger_tick(self, ti: Ti) -> None:
        if ti.state != "deferred" or ti.origin < 0:
            return
        poll = self.policy.trigger_poll
        tick = ti.origin + math.ceil(max(0.0, self.now - ti.origin) / poll - 1e-9) * poll
        if tick <= ti.read_done:  # the read of this instant is done already: the next one sees it
            tick += poll
        if ti.read_at != tick:
            ti.read_at = tick
            self.at(tick, self._trigger, ti, ti.token)

    def _tool(self, ti: Ti) -> None:
        ti.token += 1  # no read or checkpoint look of its wait is due any more
        ti.wait_token += 1
        ti.pace = None
        seconds = ti.run.plan.seconds[ti.node]
        self.last_change = self.now
        if ti.try_number in ti.run.plan.failing_tries.get(ti.node, ()):
            self.out.tool_seconds += seconds / 2
            self.at(self.now + seconds / 2, self._tool_failed, ti, ti.token)
        else:
            self.out.tool_seconds += seconds
            ti.run.tool_start[ti.node] = self.now
            self.at(self.now + seconds, self._tool_done, ti, ti.token)

    def _tool_done(self, ti: Ti, token: int) -> None:
        if ti.token != token:
            return
        run = ti.run
        run.tool_done.add(ti.node)
        run.tool_end[ti.node] = self.now
        self.last_change = self.now
        for watcher in run.watchers.pop(ti.node, []):
            if ti.node in watcher.awaited:
                self._look_for_checkpoints(watcher)
        for watcher in run.trigger_watchers.get(ti.node, ()):
            if ti.node in watcher.awaited:
                self._trigger_look(watcher)
        self.cpu.submit(self.costs.end_cpu, self._task_end, ti, ti.token)

    def _tool_failed(self, ti: Ti, token: int) -> None:
        if ti.token == token:
            self.cpu.submit(self.costs.end_cpu, self._failed_end, ti, ti.token)

    def _failed_end(self, ti: Ti, token: int) -> None:
        if ti.token == token:
            self._try_failed(ti)

    def _try_failed(self, ti: Ti) -> None:
        ti.exited_at = None
        if ti.try_number <= self.caps.retries:
            ti.try_number += 1
            ti.came_back = False
            ti.reschedules = 0
            self.set_state(ti, "up_for_retry")
            self._due(self.now + self.caps.retry_delay, ti)
        else:
            self._end(ti, "failed")

    def _skip(self, ti: Ti, token: int) -> None:
        if ti.token == token:
            self._end(ti, "skipped")

    def _task_end(self, ti: Ti, token: int) -> None:
        if ti.token != token:
            return
        run = ti.run
        if ti.task == PLAN_TASK:
            self._end(ti, "success")
            run.planned = True
        elif ti.task == FINALIZE_TASK:
            self._end(ti, "success")
            run.end = self.now
            self.open_runs -= 1
        else:
            self._end(ti, "success")

    def _end(self, ti: Ti, state: str) -> None:
        self.set_state(ti, state)
        if ti.run.static:
            self.ended.setdefault(ti.run.index, []).append(self.now)


def chain_cover(plan: SimPlan) -> dict[str, str]:
    """Chains through the plan, from its structure alone: in the run order, each node with parents
    continues the chain of its deepest parent (most hops from a root; the latest in the run order among
    equals) that no earlier node continued, else it heads a chain. Node → the parent it continues."""
    order = plan.order
    place = {n: i for i, n in enumerate(order)}
    depth: dict[str, int] = {}
    for node in order:
        depth[node] = 1 + max((depth[p] for p in plan.parents[node]), default=-1)
    continued: dict[str, str] = {}
    taken: set[str] = set()
    for node in order:
        free = [p for p in plan.parents[node] if p not in taken]
        if free:
            parent = max(free, key=lambda p: (depth[p], place[p]))
            continued[node] = parent
            taken.add(parent)
    return continued


def simulate(
    plan: SimPlan | Sequence[SimPlan],
    policy: Policy,
    caps: Caps = Caps(),  # noqa: B008
    costs: Costs = Costs(),  # noqa: B008
    **options: Any,
) -> Outcome:
    """Run ``plan`` (or several plans, one run each) to its end or to a deadlock."""
    plans = [plan] if isinstance(plan, SimPlan) else list(plan)
    return Simulation(plans, policy, caps, costs, **options).run()


def static_dag(plan: SimPlan, caps: Caps, costs: Costs, policy: Policy, **options: Any) -> Outcome:
    """The same plan as a static DAG: one task per node, scheduled when its upstream finished."""
    return simulate(plan, policy, caps, costs, static=True, **options)
