"""Sessions in turn: the priority weight of a plan DAG's task instances, so that sessions sharing slots
(a pool, the executor's parallelism) finish one after another instead of all together, late.

Airflow's scheduler hands out free slots by priority weight, then by the run's logical date, then by
map index. The nodes of a run are instances of a few mapped tasks (``nodes``, and one per pool lane),
so under Airflow's default rule a run's nodes share their task's weight. Runs triggered without a
logical date (the REST API's default, asset-triggered runs) then tie on the date too, and the instances
of every session interleave by map index: each session gets its share of the slots and every one of
them ends near the end of the batch. Across the lanes' tasks of one run, the map indexes of one task say
nothing of another's: a lane's instance that cannot run yet may get a slot before a ready one of another
lane, again and again.

:class:`SessionsInTurn` weighs an instance as Airflow's default rule does (``downstream``: the task's
``priority_weight`` plus its descendants'), less its session's *rank* times :data:`RANK_STRIDE`, less
its node's *place* in the plan's run order (a parent before its children):

- The rank is how many of the DAG's unfinished runs (queued or running) began before the session did.
  The oldest session keeps the default weight and each later one ranks a stride lower, so a free slot
  goes to the oldest session with an instance waiting for one (ready or not: see docs/plan-dag.md,
  "Sessions in turn", for what that costs and the cap that pays it back). A replan run continues the
  session its root run began (:func:`~airflow_plan_provider.plan.session.session_root_run_id`): it
  ranks with it.
- The place orders a run's node instances across its tasks as the plan orders them, so the first
  unfinished node in that order gets the next free slot of any cap the tasks share (the argument in
  :mod:`airflow_plan_provider.plan.waiting`). In a run without lanes the place is the map index, and
  the order within the task is Airflow's own; with lanes the planning task publishes every instance's
  place (XCom ``places``, :func:`~airflow_plan_provider.contract.node_places`: in the run order, or
  where nodes start on the triggerer in the plan's descendant order, which also puts parents first).

Against other DAGs' tasks a plan DAG's instance never ranks above what the default rule gives it.

Airflow asks for the weight when it creates an instance (and when one is cleared), in the process
creating it: the scheduler when it expands the node tasks, the API server when it creates a run. The
rank and the places are read there, in the caller's database session when the thread has one open (it
sees the caller's own, not yet committed rows), else in a short session of its own; the instances of a
run created within ``RANK_KEPT`` seconds share one read of each. A database error costs the order only:
the instance keeps the default weight (and its map index for a place).

Plan DAGs built by :func:`~airflow_plan_provider.dag_factory.build_plan_dag` and
:func:`~airflow_plan_provider.dag_factory.plan_task_group` use it (``weight_rule`` in ``operator_args``
replaces it). The provider's plugin registers it, as Airflow requires of a custom weight rule in every
component that reads a serialized DAG.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any, TypeVar

from airflow.task.priority_strategy import PriorityWeightStrategy, validate_and_load_priority_weight_strategy

from airflow_plan_provider.contract import LANE_SEPARATOR, NODES_TASK, PLACES_KEY, PLAN_TASK

if TYPE_CHECKING:
    from airflow.models.taskinstance import TaskInstance
    from sqlalchemy.orm import Session
    from sqlalchemy.sql import Select

log = logging.getLogger(__name__)
T = TypeVar("T")

#: the weight between two sessions' ranks: a session's nodes stay above the next session's in plans of
#: up to this many nodes (a larger plan's last places reach into the next rank, its order within a run
#: stands)
RANK_STRIDE = 10_000


class SessionsInTurn(PriorityWeightStrategy):
    """Airflow's ``downstream`` weight less the instance's session rank (times :data:`RANK_STRIDE`) and
    its node's place in the run order (:mod:`this module <airflow_plan_provider.sessions_in_turn>`)."""

    def get_weight(self, ti: TaskInstance) -> int:
        weight = downstream().get_weight(ti)
        if not ti.run_id:  # Airflow 3.1 also asks while it builds an instance, before it has its run
            return weight
        return weight - RANK_STRIDE * _recent_rank(ti.dag_id, ti.run_id) - place(ti)


def place(ti: TaskInstance) -> int:
    """The place in the plan's run order of the node of ``ti`` (a node task's instance); 0 for any other
    task's instance."""
    map_index = ti.map_index if isinstance(ti.map_index, int) else -1
    prefix, _, local = ti.task_id.rpartition(".")
    if map_index < 0 or not (local == NODES_TASK or local.startswith(NODES_TASK + LANE_SEPARATOR)):
        return 0
    places = _recent_places(ti.dag_id, ti.run_id, f"{prefix}." if prefix else "")
    found = places.get(local) if places else None
    if not found or map_index >= len(found):
        return map_index  # a run without lanes: the map index is the place
    return found[map_index]


@cache
def downstream() -> PriorityWeightStrategy:
    """Airflow's default weight rule, as Airflow loads it (loaded on first use: the plugin imports this
    module while Airflow loads its plugins)."""
    return validate_and_load_priority_weight_strategy("downstream")


#: (dag id, run id) -> (when, rank): the scheduler asks once per instance (twice on some releases) as it
#: expands a node task, so a run's instances created within ``RANK_KEPT`` seconds share one read
_ranks: dict[tuple[str, str], tuple[float, int]] = {}
RANK_KEPT = 2.0


def _recent_rank(dag_id: str, run_id: str) -> int:
    return _kept(_ranks, (dag_id, run_id), lambda: session_rank(dag_id, run_id))


#: (dag id, run id, task group prefix) -> (when, places): a run's places, read once per ``RANK_KEPT``
_places: dict[tuple[str, str, str], tuple[float, dict[str, list[int]] | None]] = {}


def _recent_places(dag_id: str, run_id: str, prefix: str) -> dict[str, list[int]] | None:
    return _kept(_places, (dag_id, run_id, prefix), lambda: node_places_of_run(dag_id, run_id, prefix))


def _kept(cache: dict[Any, tuple[float, T]], key: tuple[str, ...], read: Callable[[], T]) -> T:
    """``read()``, kept in ``cache`` under ``key`` for ``RANK_KEPT`` seconds (the cache cleared past
    1,024 keys)."""
    now = time.monotonic()
    kept = cache.get(key)
    if kept is not None and now - kept[0] < RANK_KEPT:
        return kept[1]
    if len(cache) > 1024:
        cache.clear()
    value = read()
    cache[key] = (now, value)
    return value


def node_places_of_run(dag_id: str, run_id: str, prefix: str = "") -> dict[str, list[int]] | None:
    """The places the planning task (``<prefix>plan``) of run ``run_id`` published for its node tasks
    (XCom ``places``); None without them (a run without lanes) or when the database cannot say."""
    from sqlalchemy.exc import SQLAlchemyError

    from airflow_plan_provider import compat

    def read(session: Session) -> Any:
        found = compat.read_xcoms(session, dag_id, [run_id], [(prefix + PLAN_TASK, PLACES_KEY)])
        return next((value for *_, value in found), None)

    try:
        value = _in_session(read)
    except (SQLAlchemyError, compat.AirflowCompatError) as error:
        log.warning("Priority weight of run %r of %r without its nodes' places: %s", run_id, dag_id, error)
        return None
    if not isinstance(value, dict):
        return None
    return {
        str(task): [int(p) for p in places]
        for task, places in value.items()
        if isinstance(places, list) and all(isinstance(p, int) for p in places)
    }


def session_rank(dag_id: str, run_id: str) -> int:
    """How many unfinished runs of ``dag_id`` began before the session of run ``run_id``; 0 when the
    database cannot say."""
    from sqlalchemy.exc import SQLAlchemyError

    try:
        return _count(_rank_query(dag_id, run_id))
    except SQLAlchemyError as error:
        log.warning("Priority weight of run %r of %r without its session rank: %s", run_id, dag_id, error)
        return 0


def _rank_query(dag_id: str, run_id: str) -> Select[int]:
    """The unfinished runs of ``dag_id`` created before the session's root run, counted; the session's
    own runs excluded. A root run not visible yet (being created in another database session) began
    after every run the query sees."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.state import DagRunState
    from sqlalchemy import func, or_, select

    from airflow_plan_provider.plan.session import session_root_run_id

    root = session_root_run_id(run_id)
    began = select(DagRun.id).where(DagRun.dag_id == dag_id, DagRun.run_id == root).scalar_subquery()
    return (
        select(func.count())
        .select_from(DagRun)
        .where(
            DagRun.dag_id == dag_id,
            DagRun.state.in_((DagRunState.QUEUED, DagRunState.RUNNING)),
            DagRun.run_id.not_in((root, run_id)),
            or_(began.is_(None), DagRun.id < began),
        )
    )


def _count(query: Select[int]) -> int:
    """``query``'s count (0 without a database)."""

    def count(session: Session) -> int:
        return int(session.scalar(query) or 0)

    return _in_session(count) or 0


def _in_session(work: Callable[[Session], T]) -> T | None:
    """``work`` done in the thread's open database session (the caller's transaction) or else in a
    session of its own, closed at once so that it holds no lock; None without a database."""
    from airflow import settings
    from airflow.utils.session import create_session

    scoped = getattr(settings, "Session", None)
    if scoped is None:
        return None
    if scoped.registry.has() and scoped().in_transaction():
        session = scoped()
        with session.no_autoflush:
            return work(session)
    with create_session(scoped=False) as session:
        return work(session)
