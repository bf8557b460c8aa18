"""When a node waits for its parents, and how: the waiting policy of barrier-free nodes, as pure rules.

A plan node runs as one instance of a mapped task, and Airflow has no dependencies between instances of
one mapped task, so an instance may get a slot before its parents have finished. It then reads the task
instance states of its parents (and their parents) and asks :meth:`WaitingPolicy.next_move` what to do:

- ``READY``: every parent finished; read their records and run.
- ``WAIT``: every unfinished parent is running (or was queued a moment ago): keep the slot and read
  again after ``Move.after`` seconds. A parent's result is picked up without a scheduler hop or a second
  task start (from the checkpoint it saves when its tool returns: while ``Move.near``, the node looks
  for those every :attr:`WaitingPolicy.checkpoint_poll` seconds between two reads).
- ``DEFER``: the parents have their slots but are slow (the in-slot bound passed, a parent stays
  queued, or a parent waits on the triggerer for a job): wait on the triggerer, holding no worker slot.
- ``STEP_ASIDE``: the parents run, but a node of the same task is ready to run and has no slot while
  nodes that cannot run yet hold them (:func:`steps_aside`): this node defers (as ``DEFER``) and the
  ready node gets the slot, as in a static DAG, where only ready tasks hold slots. A node whose parents
  run their tools steps aside only for a ready node that more of the plan waits on. Only while the task's
  own cap has room: Airflow counts a deferred instance under ``max_active_tis_per_dagrun``, so it is the
  DAG's ``max_active_tasks``, a pool or the executor's parallelism that stepping aside frees.
- ``MAKE_WAY``: a parent has not started (no state yet, scheduled, up for retry or reschedule): it
  needs a slot, so give this one back (the node reschedules itself) and look again after ``Move.after``
  seconds (:meth:`WaitingPolicy.make_way_delay`). A node whose deferral holds nothing
  (``WaitView.free_deferral``: its task's cap cannot fill, its pool counts no deferred instance) defers
  instead, and its trigger waits for that parent too.

A deferred node's trigger asks :meth:`WaitingPolicy.trigger_move` after each read: ``READY`` and
``MAKE_WAY`` end the deferral (the node resumes and asks :meth:`~WaitingPolicy.next_move` again); None
keeps it waiting, and while every unfinished parent runs (:meth:`WaitingPolicy.trigger_watches`) the
trigger looks for their checkpoints until its next read: all found is ``READY`` too. ``WAIT`` ends the
deferral once a try, when the parents start their tools while the node is deferred (a read saw one wait
on its own parents, a later one sees every unfinished parent running with its own parents finished:
:meth:`WaitingPolicy.parents_run_tools`): the node comes back to wait for them in a slot, as a near
waiter, so that its start after their end is the near waiter's pick-up of their checkpoints, not the
triggerer's hand-off and a second task start; the task start this costs happens while the parents'
tools run. A node that deferred on parents already running their tools (past ``slot_wait``) waits on.

A read that fails (the API server restarting, the metadata database away) is a rule of the policy too
(:meth:`WaitingPolicy.after_failed_read`): read again after a growing pause while the in-slot bound
lasts, then wait on the triggerer; a failed read never fails the node.

Why this cannot deadlock, whatever the caps (``max_active_tis_per_dagrun``, pools, the DAG's
``max_active_tasks``, the executor's parallelism) and however parents retry:

1. What a node instance holds. Running, it holds a slot under every cap. Deferred, it holds no worker,
   pool or DAG slot, but Airflow counts it toward its task's ``max_active_tis_per_dagrun``
   (``airflow.ti_deps.dependencies_states.ACTIVE_STATES``). Up for reschedule, it holds nothing.
2. A waiting node holds a slot only while every parent it waits for is running, and for a bounded
   time (``slot_wait``; a queued parent for ``queued_grace`` seconds only); a running parent makes
   progress (its tool, or its own bounded wait) and so does not depend on the waiter's slot.
3. A deferred node holds its task's cap only while its parents have started: the trigger releases it
   (``MAKE_WAY``) as soon as one goes back to waiting for a slot (a retry), and the node then makes way.
   A node with a free deferral holds no cap an instance could wait for (its task's cap is at least the
   plan's size, its pool counts no deferred instance), so it waits on the triggerer throughout. A node
   that comes back to wait (``WAIT``, once a try) asks for a slot again as any scheduled instance does,
   and holds it only as point 2 says; its next deferral waits to the end.
   Deferrals are free for every node of a run or for none (one ``max_active_nodes`` for every node
   task, bounded by the plan's size; one setting for the pools), so no node holds a cap while deferred
   on a parent that waits on the triggerer for a slot of its own ancestor.
4. Every node instance is weighed by its node's place in the plan's run order (a parent before its
   children), less its session's rank (``SessionsInTurn``, the plan DAG's weight rule), and the
   scheduler hands out free slots by weight: within a run, across all its node tasks (the default
   lane's and the pool lanes'), in the plan's order; an earlier session's run before a later one's,
   which only puts whole runs before others. Take the unfinished node ``u`` earliest in that order: its
   parents all finished, and every other unfinished instance of the run comes after it. Every instance
   holding a slot or cap ``u`` needs lets go within a bounded time or when a running instance finishes
   (1 to 3), so a slot frees, and ``u`` gets it before any later instance. ``u`` runs; by induction
   every node runs. One exception: a node task's first instance is the one Airflow created with the
   run, before there was a plan, and keeps that weight (the run's first place) when the task expands.
   Those few instances, one per task, may go before ``u`` as under point 5; the simulator models them,
   and none of its random lane plans starves with them.
5. Under a weight rule that weighs a task's instances alike (``operator_args={"weight_rule": ...}``
   replacing the plan DAG's), the order is each task's map index, which follows the plan's order within
   the task only. Point 4 then holds for one task, and for caps shared by several tasks as long as the
   nodes that cannot run come back boundedly often: a node with a free deferral does so at most twice
   per try of its own (it defers; its trigger resumes it once to wait near its parents, and then only
   once they finished or saved their checkpoints: to run), so ``u`` gets a slot. A node that makes way
   comes back after each delay instead, without bound: with a shared cap of 1 and lanes whose task cap
   can fill or whose pools count deferred instances, nodes that make way again and again can take every
   freed slot before ``u`` (``test_waiting_simulation.py`` keeps the case visible).

Without point 3 a cap of 2 deadlocks: a root retries while two of its children wait deferred; the
deferred children fill the task's cap and the root's retry never gets a slot. The simulator in
``bench/`` checks the argument on random plans, caps and retries, driving these functions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from enum import StrEnum

from airflow_plan_provider.plan.graph import descendant_counts, topological_layers

#: task instance states of a node that has finished, whatever the outcome
FINISHED = frozenset({"success", "failed", "skipped", "upstream_failed", "removed"})
#: states of a parent that has its slot (or is about to run): waiting on it needs no slot of its own
STARTED = frozenset({"running", "queued", "deferred"})
#: states of an instance that waits for a slot
SLOTLESS = frozenset({None, "scheduled"})
#: states Airflow counts under a task's ``max_active_tis_per_dagrun`` (deferred ones too)
ACTIVE = frozenset({"queued", "running", "deferred"})

StateOf = Callable[[str], "str | None"]


class Wait(StrEnum):
    """What a node whose parents have not all finished does next."""

    READY = "ready"
    WAIT = "wait"
    DEFER = "defer"
    STEP_ASIDE = "step_aside"
    MAKE_WAY = "make_way"


@dataclass(frozen=True)
class Move:
    """The policy's answer: ``kind``, and ``after`` seconds (the pause before the next read for
    ``WAIT``, the reschedule delay for ``MAKE_WAY``). ``near``: the parents run their tools (every
    grandparent finished), so their checkpoints are worth looking for between two reads."""

    kind: Wait
    after: float = 0.0
    near: bool = False


@dataclass(frozen=True)
class WaitView:
    """What a node waiting in its slot saw in one read of its run's task instance states.

    :param node: the waiting node.
    :param parents: node id -> its parents' ids, for every node of the plan.
    :param state_of: node id -> its task instance's state in the read; None for an instance without a
        state yet, or one the read did not return.
    :param queue: the nodes of this node's task in map-index order (the order Airflow hands out the
        task's free slots).
    :param waited: seconds this node has waited in its slot so far.
    :param made_way: how many times this node made way already (Airflow's reschedule count).
    :param task_cap: the node task's own cap in the run (``max_active_tis_per_dagrun``); None: none.
    :param complete: whether the read returned every instance of the node's task (False for a large
        plan, whose nodes read their parents' instances one by one).
    :param rows: task states the read returned.
    :param pollers: instances of the run running now (at most that many nodes poll).
    :param checkpoints: whether the DAG keeps checkpoints (the node can pick a parent's result up from
        its checkpoint before the parent's task ends).
    :param free_deferral: whether this node, deferred, holds nothing another instance could wait for:
        its task's cap cannot fill (none, or at least as many as the task has instances) and its pool
        counts no deferred instance (:func:`deferral_is_free`). Such a node waits on the triggerer for a
        parent that needs a slot, instead of making way.
    """

    node: str
    parents: Mapping[str, Sequence[str]]
    state_of: StateOf
    queue: Sequence[str] = ()
    waited: float = 0.0
    made_way: int = 0
    task_cap: int | None = None
    complete: bool = True
    rows: int = 0
    pollers: int = 0
    checkpoints: bool = True
    free_deferral: bool = False


@dataclass(frozen=True)
class WaitingPolicy:
    """Every number of the waiting rules, with the rules that use them (seconds unless said).

    :param slot_wait: the longest a node waits in its slot for running parents before it waits on the
        triggerer (``NodeExecution.slot_wait``: the one a user has reason to change).
    :param queued_grace: how long a node waits in its slot for a parent that is queued but not yet
        running: longer means the executor has no room for it (say, every worker slot is held).
    :param poll_near: pause between two reads of a node whose parents all run their tools (every
        grandparent finished), when the DAG keeps no checkpoints: any parent may finish at any moment.
    :param checkpoint_poll: pause between two looks for the parents' checkpoints by such a node (they
        cost the metadata database nothing); its state reads then pause ``poll_far``, since the states
        only still tell a parent that failed, was skipped or needs a slot again.
    :param poll_far: pause of a node whose parents still wait on their own parents (they cannot finish
        before those do), per generation beyond the first (:func:`generations`) ...
    :param poll_farthest: ... up to this.
    :param state_rows_per_second: task states per second the waiting nodes of one run read together,
        at most, whatever the plan's size (each read returns every instance of the tasks read).
    :param read_all_states_up_to: the most nodes a plan may have for its waiting nodes to read every
        instance's state in one request; larger plans read their parents' instances one by one (and
        their grandparents' while the parents run, :meth:`reads_grandparents`) and neither step aside
        nor count generations (they do not see their whole task). Airflow loads
        each instance with its run's conf and decodes the conf once per instance, so a full read grows
        with the plan's size times the conf's (``bench/conf_decode.py``); one by one, a run's state
        reads stay cheap whatever its conf holds.
    :param make_way_first: the delay after a node's first make-way, doubling after each one ...
    :param make_way_max: ... up to this. Not less than 5 s: Airflow (3.3) fails a rescheduled instance
        that is queued again before the executor's report of its previous exit reaches the scheduler
        (apache/airflow#71172); that report comes 1-2 s after the exit, later under load.
    :param trigger_poll: pause between two reads of a deferred node's trigger (the triggers of one run
        share each read).
    :param read_retry_first: pause after a failed state read, doubling with each failure in a row ...
    :param read_retry_max: ... up to this.
    :param job_timeout_margin: a deferred job's Airflow timeout, as a multiple of the tool's own timeout
        (the trigger ends the job at the tool's timeout; Airflow's is the safety net behind it).
    """

    slot_wait: float = 30.0
    queued_grace: float = 10.0
    poll_near: float = 0.2
    checkpoint_poll: float = 0.2
    poll_far: float = 1.0
    poll_farthest: float = 4.0
    state_rows_per_second: float = 5000.0
    read_all_states_up_to: int = 100
    make_way_first: float = 5.0
    make_way_max: float = 20.0
    trigger_poll: float = 0.5
    read_retry_first: float = 0.5
    read_retry_max: float = 8.0
    job_timeout_margin: float = 2.0

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"WaitingPolicy.{item.name} must be a number >= 0, got {value!r}")
        positive = ("poll_near", "checkpoint_poll", "poll_far", "trigger_poll", "read_retry_first")
        for name in positive:
            if not getattr(self, name):
                raise ValueError(f"WaitingPolicy.{name} must be > 0, got 0")
        if self.poll_farthest < self.poll_far:
            raise ValueError(
                f"WaitingPolicy.poll_farthest ({self.poll_farthest}) must be >= poll_far ({self.poll_far})"
            )
        if self.make_way_max < self.make_way_first or self.read_retry_max < self.read_retry_first:
            raise ValueError("WaitingPolicy: a *_max delay must be >= its *_first delay")
        if self.job_timeout_margin < 1:
            raise ValueError(f"WaitingPolicy.job_timeout_margin must be >= 1, got {self.job_timeout_margin}")

    # -- the node in its slot --------------------------------------------------------------------------

    def next_move(self, view: WaitView) -> Move:
        """What a node waiting in its slot does after reading ``view`` (see the module docstring).

        >>> parents = {"a": [], "b": ["a"]}
        >>> WaitingPolicy().next_move(WaitView("b", parents, {"a": "running"}.get)).kind
        <Wait.WAIT: 'wait'>
        >>> WaitingPolicy().next_move(WaitView("b", parents, {"a": "up_for_retry"}.get))
        Move(kind=<Wait.MAKE_WAY: 'make_way'>, after=5.0, near=False)
        """
        kind = self.parents_wait([view.state_of(p) for p in view.parents[view.node]], view.waited)
        if kind is Wait.MAKE_WAY and view.free_deferral:
            return Move(Wait.DEFER)
        if kind is Wait.MAKE_WAY:
            return Move(kind, self.make_way_delay(view.made_way))
        if kind is not Wait.WAIT:
            return Move(kind)
        if (
            view.complete
            and not task_cap_full(view.queue, view.state_of, view.task_cap)
            and steps_aside(view.node, view.queue, view.parents, view.state_of)
        ):
            return Move(Wait.STEP_ASIDE)
        grandparents = [view.state_of(g) for p in view.parents[view.node] for g in view.parents[p]]
        near = all(state in FINISHED for state in grandparents)
        distance = generations(view.node, view.parents, view.state_of) if view.complete else 2
        pause = self.poll_pause(
            near,
            rows=view.rows,
            pollers=view.pollers,
            checkpoints=view.checkpoints,
            waiting_generations=distance,
        )
        return Move(Wait.WAIT, pause, near)

    def parents_wait(self, states: Iterable[str | None], waited: float) -> Wait:
        """READY, WAIT, DEFER or MAKE_WAY, from the parents' task instance states and the seconds the
        node has waited in its slot (see the module docstring).

        >>> WaitingPolicy().parents_wait(["success", "running"], waited=1.0)
        <Wait.WAIT: 'wait'>
        >>> WaitingPolicy().parents_wait(["up_for_retry", "running"], waited=0.0)
        <Wait.MAKE_WAY: 'make_way'>
        """
        unfinished = [state for state in states if state not in FINISHED]
        if not unfinished:
            return Wait.READY
        if any(state not in STARTED for state in unfinished):
            return Wait.MAKE_WAY
        if waited >= self.slot_wait or "deferred" in unfinished:
            return Wait.DEFER
        if "queued" in unfinished and waited >= self.queued_grace:
            return Wait.DEFER
        return Wait.WAIT

    def poll_pause(
        self,
        near: bool,
        *,
        rows: int = 0,
        pollers: int = 0,
        checkpoints: bool = False,
        waiting_generations: int = 2,
    ) -> float:
        """Seconds a node waiting in its slot pauses before it reads the states again.

        The pickup latency, about half a pause, is paid on every edge, so the node that will run next
        (``near``: every grandparent finished) polls often: its parents' states when the DAG keeps no
        checkpoints, else their checkpoints (every ``checkpoint_poll``), the states then only telling a
        parent that failed, was skipped or needs a slot again. The nodes further down poll seldom: a
        node ``waiting_generations`` away from running cannot run before a tool of every generation in
        between has. Together the run's pollers read at most ``state_rows_per_second`` task states a
        second, whatever the plan's size.

        >>> policy = WaitingPolicy()
        >>> policy.poll_pause(True), policy.poll_pause(True, checkpoints=True), policy.poll_pause(False)
        (0.2, 1.0, 1.0)
        >>> policy.poll_pause(True, rows=100, pollers=100)
        2.0
        """
        if near:
            pause = self.poll_far if checkpoints else self.poll_near
        else:
            pause = min(self.poll_far * max(1, waiting_generations - 1), self.poll_farthest)
        return max(pause, rows * pollers / self.state_rows_per_second)

    def make_way_delay(self, made_way: int) -> float:
        """Seconds before a node that makes way looks again, having made way ``made_way`` times before.

        >>> [WaitingPolicy().make_way_delay(n) for n in range(4)]
        [5.0, 10.0, 20.0, 20.0]
        """
        delay = self.make_way_first
        for _ in range(max(0, made_way)):
            if delay >= self.make_way_max:
                break
            delay *= 2
        return min(delay, self.make_way_max)

    def reads_one_by_one(self, plan_size: int) -> bool:
        """Whether the waiting nodes of a plan of ``plan_size`` nodes read their parents' instances one
        by one (see ``read_all_states_up_to``)."""
        return plan_size > self.read_all_states_up_to

    def reads_grandparents(self, states: Iterable[str | None]) -> bool:
        """Whether a node that reads its parents' instances one by one (:meth:`reads_one_by_one`) reads
        their own parents' too, after a read of the parents' ``states``: when every unfinished parent is
        running, and so may be running its tool. The node then knows when it is near (every grandparent
        finished, :meth:`next_move`) and looks for its parents' checkpoints, as a node of a smaller plan
        does; a grandparent read finished once is not read again.

        >>> policy = WaitingPolicy()
        >>> policy.reads_grandparents(["running", "success"]), policy.reads_grandparents(["queued"])
        (True, False)
        """
        return self.trigger_watches(states)

    def after_failed_read(self, failures: int, waited: float) -> Move:
        """What a node waiting in its slot does when its ``failures``-th read in a row failed, having
        waited ``waited`` seconds: read again after a pause that doubles with each failure (never past
        the in-slot bound), and once the bound passed, wait on the triggerer, whose trigger reads again
        on its own. The node never fails for a failed read.

        >>> policy = WaitingPolicy()
        >>> [policy.after_failed_read(n, waited=0.0).after for n in (1, 2, 3)]
        [0.5, 1.0, 2.0]
        >>> policy.after_failed_read(1, waited=30.0).kind
        <Wait.DEFER: 'defer'>
        """
        if waited >= self.slot_wait:
            return Move(Wait.DEFER)
        return Move(Wait.WAIT, min(self.read_retry_pause(failures), self.slot_wait - waited))

    def read_retry_pause(self, failures: int) -> float:
        """The pause after the ``failures``-th failed read in a row (the node's and the trigger's)."""
        pause = self.read_retry_first
        for _ in range(max(0, failures - 1)):
            if pause >= self.read_retry_max:
                break
            pause *= 2
        return min(pause, self.read_retry_max)

    # -- the node on the triggerer ---------------------------------------------------------------------

    def trigger_move(
        self,
        states: Iterable[str | None],
        free_deferral: bool = False,
        grandparents: Iterable[Iterable[str | None]] | None = None,
    ) -> Wait | None:
        """A deferred node's trigger, after a read of its parents' states: READY (every parent
        finished), MAKE_WAY (one needs a slot again: the node lets go of its task's cap), WAIT (the
        parents run their tools: the node comes back to wait for them in a slot), or None (keep
        waiting; a running, queued or deferred parent holds no slot of this node's). A node whose
        deferral holds nothing (``free_deferral``, see :class:`WaitView`) keeps waiting for a parent
        that needs a slot too.

        ``grandparents``: for each parent (in the order of ``states``), its own parents' states; given
        only while the node may come back to wait (it has not in this try, and an earlier read of this
        trigger saw a parent wait on its own parents). WAIT when the parents run their tools
        (:meth:`parents_run_tools`); in a run without slots to spare, the trigger takes that WAIT only
        while the run leaves a slot idle (:func:`leaves_a_slot_idle`).

        >>> WaitingPolicy().trigger_move(["success", "queued"]) is None
        True
        >>> policy = WaitingPolicy()
        >>> policy.trigger_move(["scheduled"]), policy.trigger_move(["scheduled"], free_deferral=True)
        (<Wait.MAKE_WAY: 'make_way'>, None)
        >>> policy.trigger_move(["running", "success"], grandparents=[["success"], ["running"]])
        <Wait.WAIT: 'wait'>
        >>> policy.trigger_move(["running"], grandparents=[["running"]]) is None
        True
        """
        states = list(states)
        kind = self.parents_wait(states, waited=0.0)
        if kind is Wait.MAKE_WAY and free_deferral:
            return None
        if kind in (Wait.READY, Wait.MAKE_WAY):
            return kind
        if grandparents is not None and self.parents_run_tools(states, grandparents):
            return Wait.WAIT
        return None

    def parents_run_tools(
        self, states: Iterable[str | None], grandparents: Iterable[Iterable[str | None]]
    ) -> bool:
        """Whether every unfinished parent (``states``) runs its tool: it is running and its own parents
        (``grandparents``, per parent in the same order) have finished.

        >>> policy = WaitingPolicy()
        >>> policy.parents_run_tools(["running", "success"], [["success"], ["running"]])
        True
        >>> policy.parents_run_tools(["running"], [["success", "running"]])
        False
        """
        states = list(states)
        if not self.trigger_watches(states):
            return False
        return all(
            g in FINISHED
            for state, gs in zip(states, grandparents, strict=True)
            if state not in FINISHED
            for g in gs
        )

    def trigger_watches(self, states: Iterable[str | None]) -> bool:
        """Whether a deferred node's trigger, waiting on after a read of its parents' states, looks for
        their checkpoints until its next read (every :attr:`checkpoint_poll` seconds): when every
        unfinished parent is running, so may be about to save its result. Every checkpoint of this run
        found then counts as READY, as for a node waiting in its slot, without waiting for the parents'
        records, their tasks' ends and the next read.

        >>> policy = WaitingPolicy()
        >>> policy.trigger_watches(["success", "running"]), policy.trigger_watches(["running", "queued"])
        (True, False)
        """
        unfinished = [state for state in states if state not in FINISHED]
        return bool(unfinished) and all(state == "running" for state in unfinished)

    def job_timeout(self, timeout: float | None) -> float | None:
        """Airflow's timeout of a node deferred on its job whose tool allows ``timeout`` seconds."""
        return None if timeout is None else timeout * self.job_timeout_margin


def generations(node: str, parents: Mapping[str, Iterable[str]], state_of: StateOf) -> int:
    """How many generations of unfinished nodes lie between ``node`` and the nodes that can run now
    (every parent finished): 0 for such a node, 1 for a node whose unfinished parents can all run, 2
    when one of those waits on its own parents, and so on.

    >>> parents = {"a": [], "b": ["a"], "c": ["b"], "d": ["c", "a"]}
    >>> states = {"a": "running", "b": "running", "c": "running", "d": "running"}
    >>> [generations(n, parents, states.get) for n in "abcd"]
    [0, 1, 2, 3]
    >>> generations("d", parents, {"a": "success", "b": "success"}.get)
    1
    """
    seen: dict[str, int] = {}
    # iterative depth-first walk: a chain of thousands of waiting nodes must not exhaust the stack
    stack = [node]
    while stack:
        current = stack[-1]
        if current in seen:
            stack.pop()
            continue
        unfinished = [p for p in parents[current] if state_of(p) not in FINISHED]
        pending = [p for p in unfinished if p not in seen]
        if pending:
            stack.extend(pending)
            continue
        seen[current] = 1 + max(seen[p] for p in unfinished) if unfinished else 0
        stack.pop()
    return seen[node]


def slots_to_spare(nodes: int, layers: int, slots: int) -> bool:
    """Whether a run has slots to spare for nodes that wait near their parents: a plan of ``nodes`` in
    ``layers`` layers (topological generations) on ``slots`` slots runs in no fewer than ``layers`` nor
    ``nodes / slots`` rounds of tools of one length. Where the layers are more, slots idle while the
    front of the plan moves, and a node holding one while its parents run costs nothing; where the slots
    are the bound (more nodes than ``slots`` times ``layers``), a slot held near a running parent may be
    one a ready node waits for. Nodes started on the triggerer come near their parents freely where there
    are slots to spare, elsewhere only while their run leaves a slot idle (:func:`leaves_a_slot_idle`,
    :attr:`~airflow_plan_provider.plan.session.RunContext.near_while_idle`).

    >>> slots_to_spare(nodes=20, layers=10, slots=4), slots_to_spare(nodes=200, layers=10, slots=4)
    (True, False)
    """
    return nodes <= slots * layers


#: states of an instance that holds a slot or is next in line for one (scheduled: waiting for a slot)
IN_LINE = frozenset({"scheduled", "queued", "running"})


def leaves_a_slot_idle(states: Iterable[str | None], slots: int) -> bool:
    """Whether a run whose node instances are in ``states`` leaves one of its ``slots`` idle: fewer of
    them hold a slot or wait for one (:data:`IN_LINE`) than it has. Only then does a node of a run without
    slots to spare (:func:`slots_to_spare`), started on the triggerer, come near its running parents:
    the slot it takes is one no instance of its run would have used. Deferred instances hold none.

    >>> leaves_a_slot_idle(["running", "deferred", "scheduled", "success"], slots=3)
    True
    >>> leaves_a_slot_idle(["running", "queued", "scheduled", "deferred"], slots=3)
    False
    """
    return sum(state in IN_LINE for state in states) < slots


def deferral_is_free(task_cap: int | None, task_size: int, pool_counts_deferred: bool) -> bool:
    """Whether a deferred instance of a task of ``task_size`` instances holds nothing another instance
    could wait for: its task's cap (``task_cap``; None: none) cannot fill, and its pool
    (``pool_counts_deferred``) counts no deferred instance.

    >>> deferral_is_free(None, 40, False), deferral_is_free(40, 40, False), deferral_is_free(5, 40, False)
    (True, True, False)
    >>> deferral_is_free(None, 40, True)
    False
    """
    return (task_cap is None or task_cap >= task_size) and not pool_counts_deferred


def task_cap_full(queue: Iterable[str], state_of: StateOf, cap: int | None) -> bool:
    """Whether the instances of a task (its nodes ``queue``) that Airflow counts under the task's cap
    (:data:`ACTIVE`: deferred ones too) fill ``cap``. While it is full, stepping aside frees no slot
    the ready node could take.

    >>> task_cap_full("abc", {"a": "running", "b": "deferred"}.get, 2)
    True
    """
    return cap is not None and sum(state_of(n) in ACTIVE for n in queue) >= cap


def steps_aside(
    node: str, queue: Iterable[str], parents: Mapping[str, Iterable[str]], state_of: StateOf
) -> bool:
    """Whether waiting node ``node`` gives its slot to a node that is ready to run and has none.

    ``queue`` is the nodes of ``node``'s task in map-index order, the order in which Airflow hands out
    the task's free slots; ``parents`` the whole plan's; ``state_of`` tells a node's task instance state
    (None: none yet). The ready nodes without a slot at the head of the queue (before any node that
    waits for a slot but still waits for its parents too) get the next free slots: for each of them one
    waiting node steps aside, first the *far* waiters (whose parents wait on their own parents) last in
    the queue, then the *near* ones (whose parents run their tools) last in the queue. A near waiter is
    about to run, and stepping aside costs it a round trip through the triggerer (seconds), so it does
    only for a ready node that holds up more of the plan (more descendants,
    :func:`~airflow_plan_provider.plan.graph.descendant_counts`): a static DAG would give its next free
    slot to this node, ready by then, before a ready task of lower weight (Airflow's ``downstream``
    weight rule).

    >>> parents = {"a": [], "b": ["a"], "c": ["b"], "d": []}
    >>> states = {"a": "running", "b": "running", "c": "running", "d": "scheduled"}
    >>> [n for n in "abcd" if steps_aside(n, "abcd", parents, states.get)]
    ['c']
    >>> near = {"a": [], "b": ["a"], "d": [], "e": ["d"]}
    >>> states = {"a": "running", "b": "running", "d": "scheduled"}
    >>> [n for n in "abde" if steps_aside(n, "abde", near, states.get)]
    ['b']
    >>> [n for n in "abd" if steps_aside(n, "abd", {"a": [], "b": ["a"], "d": []}, states.get)]
    []
    """
    queue = list(queue)

    def finished(n: str) -> bool:
        return state_of(n) in FINISHED

    ready: list[str] = []
    for n in queue:
        if state_of(n) in SLOTLESS:
            if not all(map(finished, parents[n])):
                break
            ready.append(n)
    if not ready:
        return False
    waiting = [n for n in reversed(queue) if state_of(n) == "running" and not all(map(finished, parents[n]))]
    far = [n for n in waiting if not all(finished(g) for p in parents[n] for g in parents[p])]
    near = [n for n in waiting if n not in far]
    if node not in (far + near)[: len(ready)]:
        return False
    if node in far:
        return True
    counts = descendant_counts(topological_layers(parents), parents)
    return any(counts[n] > counts[node] for n in ready)
