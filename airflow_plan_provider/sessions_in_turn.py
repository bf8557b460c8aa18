"""Sessions in turn: the priority weight of a plan DAG's task instances, so that sessions sharing slots
(a pool, the executor's parallelism) finish one after another instead of all together, late.

Airflow's scheduler hands out free slots by priority weight, then by the run's logical date, then by
map index. Every node of a run is an instance of one mapped task, so a run's nodes share one weight.
Runs triggered without a logical date (the REST API's default, asset-triggered runs) then tie on the
date too, and the instances of every session interleave by map index: each session gets its share of
the slots and every one of them ends near the end of the batch.

:class:`SessionsInTurn` weighs an instance as Airflow's default rule does (``downstream``: the task's
``priority_weight`` plus its descendants'), less its session's *rank*: how many of the DAG's unfinished
runs (queued or running) began before the session did. The oldest session keeps the default weight and
each later one ranks one lower, so a free slot goes to the oldest session with an instance waiting for
one (ready or not: see docs/plan-dag.md, "Sessions in turn", for what that costs and the cap that pays it
back). Within a run nothing changes (every task of it is lowered by the same rank), and against other
DAGs' tasks a plan DAG's instance never ranks above what the default rule gives it. A replan run
continues the session its root run began
(:func:`~airflow_plan_provider.plan.session.session_root_run_id`): it ranks with it.

Airflow asks for the weight when it creates an instance (and when one is cleared), in the process
creating it: the scheduler when it expands the node tasks, the API server when it creates a run. The
rank is read there, in the caller's database session when the thread has one open (it sees the
caller's own, not yet committed rows), else in a short session of its own; the instances of a run
created within ``RANK_KEPT`` seconds share one read. A database error costs the order only: the instance
keeps the default weight.

Plan DAGs built by :func:`~airflow_plan_provider.dag_factory.build_plan_dag` and
:func:`~airflow_plan_provider.dag_factory.plan_task_group` use it (``weight_rule`` in ``operator_args``
replaces it). The provider's plugin registers it, as Airflow requires of a custom weight rule in every
component that reads a serialized DAG.
"""

from __future__ import annotations

import logging
import time
from functools import cache
from typing import TYPE_CHECKING

from airflow.task.priority_strategy import PriorityWeightStrategy, validate_and_load_priority_weight_strategy

if TYPE_CHECKING:
    from airflow.models.taskinstance import TaskInstance
    from sqlalchemy.sql import Select

log = logging.getLogger(__name__)


class SessionsInTurn(PriorityWeightStrategy):
    """Airflow's ``downstream`` weight less the instance's session rank (:mod:`this module
    <airflow_plan_provider.sessions_in_turn>`)."""

    def get_weight(self, ti: TaskInstance) -> int:
        weight = downstream().get_weight(ti)
        # Airflow 3.1 also asks while it builds an instance, before the instance has its run
        return weight - _recent_rank(ti.dag_id, ti.run_id) if ti.run_id else weight


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
    key, now = (dag_id, run_id), time.monotonic()
    kept = _ranks.get(key)
    if kept is not None and now - kept[0] < RANK_KEPT:
        return kept[1]
    if len(_ranks) > 1024:
        _ranks.clear()
    rank = session_rank(dag_id, run_id)
    _ranks[key] = (now, rank)
    return rank


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
    """``query``'s count, in the thread's open database session (the caller's transaction) or else in a
    session of its own, closed at once so that it holds no lock."""
    from airflow import settings
    from airflow.utils.session import create_session

    scoped = getattr(settings, "Session", None)
    if scoped is None:
        return 0
    if scoped.registry.has() and scoped().in_transaction():
        session = scoped()
        with session.no_autoflush:
            return int(session.scalar(query) or 0)
    with create_session(scoped=False) as session:
        return int(session.scalar(query) or 0)
