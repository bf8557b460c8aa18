"""Run a plan DAG's whole session (every revision) in the test process, with ``dag.test()``.

::

    from airflow_plan_provider.testing.in_process import run_session

    session = run_session(build_plan_dag("my_plan", planner=..., tools=...), {"goal": "..."})
    assert session.result.status == "completed"
    assert session.runs[-1].node_states == {"1": "success", "2": "success"}

Each revision is a run of its own, as on a real scheduler: revision 0 with the given conf, each next one
with the conf its parent's ``finalize`` prepared (XCom ``replan_conf``) and the run id the ``replan``
task gives it (:func:`~airflow_plan_provider.plan.session.replan_run_id`). On a scheduler the
``replan`` task starts that run and waits for it; ``dag.test()`` runs one run only, so the runner runs
the next revision itself when a ``replan`` task comes up, before that task runs. The ``replan`` task
then finds its revision's run finished (as after a retry) and reports the chain's outcome, failing
when the session failed, exactly as deployed: every task of every run really runs.

Needs an initialised metadata database (``airflow db migrate``), as ``dag.test()`` does. The DAG may be
built inside the test: the runner writes it to the metadata database first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from unittest.mock import patch

from airflow_plan_provider.contract import (
    FINALIZE_TASK,
    PLAN_TASK,
    REPLAN_CONF_KEY,
    REPLAN_TASK,
    RESULT_KEY,
    ReplanConf,
    labelled_node,
    session_outcome,
)
from airflow_plan_provider.plan.result import SessionResult
from airflow_plan_provider.plan.session import replan_run_id

if TYPE_CHECKING:
    from airflow.models.dagrun import DagRun
    from airflow.sdk import DAG

__all__ = ["RevisionRun", "SessionError", "SessionRun", "node_states", "run_plan_dag", "run_session"]


class SessionError(RuntimeError):
    """A session could not be run to its end in-process (too many revisions, or no result)."""


@dataclass(frozen=True)
class RevisionRun:
    """One run of a session: which revision, its run id, conf and final state, and its nodes' states.

    ``node_states`` maps each plan node id to the state of its task instance in this run (``success``,
    ``failed``, ``skipped``, ``upstream_failed``, ...), read from each instance's ``id · action`` label.
    """

    dag_id: str
    run_id: str
    revision: int
    state: str
    node_states: dict[str, str]
    conf: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SessionRun:
    """A whole session run in-process: its outcome and every run, revision 0 first."""

    result: SessionResult
    runs: tuple[RevisionRun, ...]

    @property
    def run_ids(self) -> list[str]:
        return [run.run_id for run in self.runs]


def run_session(
    dag: DAG,
    conf: Mapping[str, Any] | None = None,
    *,
    max_runs: int = 20,
    logical_date: datetime | None = None,
    group: str | None = None,
) -> SessionRun:
    """Run every revision of a plan session in-process and return its outcome.

    :param dag: a plan DAG, as :func:`~airflow_plan_provider.build_plan_dag` builds it.
    :param conf: the first run's conf (``goal``, a ready ``plan``, budgets), as a trigger would give it.
    :param max_runs: stop with :class:`SessionError` if the session needs more runs than this (the DAG's
        ``max_replans`` normally ends it first).
    :param logical_date: the first run's logical date; now when omitted (every run has one).
    :param group: for a plan built with ``plan_task_group`` inside ``dag``, its group id (its tasks are
        ``<group>.plan``, ...; a group never replans, so its session is one run).
    :return: the session's :class:`SessionResult` (what the first run's ``replan`` or ``finalize``
        task reports) and each run's id, state and node states.
    :raises ValueError: ``dag`` is not a plan DAG.
    :raises SessionError: more than ``max_runs`` runs, or the session ended without a result.
    """
    if max_runs < 1:
        raise ValueError(f"max_runs must be at least 1, not {max_runs}")
    prefix = f"{group}." if group else ""
    for task_id in (prefix + PLAN_TASK, prefix + FINALIZE_TASK):
        if task_id not in dag.task_dict:
            raise ValueError(
                f"{dag.dag_id!r} has no plan {f'in group {group!r} ' if group else ''}"
                f"(built by {'plan_task_group' if group else 'build_plan_dag'}): no task {task_id!r}"
            )
    runs: list[DagRun] = []
    problems: list[Exception] = []

    def start_next_revision(ti: Any) -> None:
        """Run the revision the finalize of ``ti``'s run prepared, if any (before its replan task runs)."""
        prepared = _xcom(ti.dag_id, ti.run_id, FINALIZE_TASK, REPLAN_CONF_KEY)
        if not prepared:
            return  # nothing to start: the replan task skips itself
        if 1 + len(runs) >= max_runs:  # the root run, and the revisions started so far
            raise SessionError(f"session of {dag.dag_id!r} needs more than max_runs={max_runs} runs")
        replan = ReplanConf.model_validate(prepared)
        state = replan.state
        run_id = replan_run_id(state.root_run_id, state.revision)
        runs.append(_test(dag, replan.run_conf(), run_id=run_id))  # the conf the replan task gives

    _write_to_db(dag)
    # every revision's dag.test() runs inside the root run's (start_next_revision)
    with _next_revision_first(start_next_revision, problems), _mapped_instances_in_map_index_order():
        root = _test(dag, conf, run_id=None, logical_date=logical_date)
    if problems:
        raise problems[0]
    runs.append(root)
    result = session_outcome(lambda task_id: _xcom(root.dag_id, root.run_id, prefix + task_id, RESULT_KEY))
    if result is None:
        raise SessionError(
            f"run {root.run_id} of {dag.dag_id!r} ended {root.state} without a session result "
            f"(tasks: {_task_states(root.dag_id, root.run_id)})"
        )
    revisions = sorted((_revision_run(run, group) for run in runs), key=lambda run: run.revision)
    return SessionRun(result=result, runs=tuple(revisions))


def run_plan_dag(
    dag: DAG,
    conf: Mapping[str, Any] | None = None,
    *,
    run_id: str | None = None,
    logical_date: datetime | None = None,
    run_after: datetime | None = None,
    without_logical_date: bool = False,
) -> DagRun:
    """Run one run of a plan DAG in-process, without starting any next revision.

    Its ``replan`` task, if it is due, is marked success without running (it would wait for a run that
    nobody starts); the run's finalize has prepared that revision's conf (XCom ``replan_conf``).
    Use :func:`run_session` for a whole session.

    :param run_id: the run's id (as a REST API trigger or the ``replan`` task may give it); by default
        ``dag.test()`` makes one.
    :param without_logical_date: make a run with no logical date (as a REST API trigger with
        ``"logical_date": null`` does), at ``run_after`` (now by default). ``dag.test()`` then clears the
        task instances of every earlier run of the DAG first.
    """
    _write_to_db(dag)
    with _mapped_instances_in_map_index_order():
        return _test(
            dag,
            conf,
            run_id=run_id,
            logical_date=logical_date,
            run_after=run_after,
            mark_success_pattern=f"^{REPLAN_TASK}$",
            without_logical_date=without_logical_date,
        )


def node_states(dag_id: str, run_id: str, group: str | None = None) -> dict[str, str]:
    """Plan node id → state of its task instance in one run, from each instance's ``id · action`` label.

    Reads the metadata database of this process (as ``dag.test()`` writes it); instances that never
    started have no label and are not listed. ``group``: only the nodes of the plan in that task group.
    """
    prefix = f"{group}." if group else ""
    states: dict[str, str] = {}
    for ti in _task_instances(dag_id, run_id):
        labelled = ti.map_index >= 0 and ti.task_id.startswith(prefix)
        node_id = labelled_node(ti.rendered_map_index) if labelled else None
        if node_id is not None:
            states[node_id] = str(ti.state)
    return states


# ------------------------------------------------------------------------------------------ internals


def _write_to_db(dag: DAG) -> None:
    """Serialise ``dag`` to the metadata database (a DAG built inside a test is in no bundle)."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager

    from airflow_plan_provider.airflow_features import dag_bag

    DagBag, sync_bag_to_db = dag_bag()
    DagBundlesManager().sync_bundles_to_db()
    bag = DagBag(dag_folder="/nonexistent", collect_dags=False)
    bag.bag_dag(dag)
    sync_bag_to_db(bag, "dags-folder", None)


def _test(
    dag: DAG,
    conf: Mapping[str, Any] | None,
    *,
    run_id: str | None,
    logical_date: datetime | None = None,
    run_after: datetime | None = None,
    mark_success_pattern: str | None = None,
    without_logical_date: bool = False,
) -> DagRun:
    """``dag.test()`` once, the run named ``run_id`` when given.

    A run gets a logical date (now by default) unless ``without_logical_date``: ``dag.test()`` clears
    the task instances of every run at its logical date first, and with none, of every run of the DAG.
    """
    with _next_run_id(run_id), _hitl_triggers_in_process():
        run: DagRun = dag.test(
            run_conf=dict(conf or {}),
            logical_date=None if without_logical_date else logical_date or datetime.now(UTC),
            run_after=run_after,
            mark_success_pattern=mark_success_pattern,
        )
        return run


@contextmanager
def _next_run_id(run_id: str | None) -> Iterator[None]:
    """Give the next run ``dag.test()`` creates the id ``run_id``.

    ``dag.test()`` (Airflow 3.3) takes no run id: it names its run with ``DagRun.generate_run_id``. A
    replan run must carry the id its parent's replan task gives it (the planning task checks), so that
    one call is answered with ``run_id``; later calls get generated ids as usual.
    """
    if run_id is None:
        yield
        return
    from airflow.models.dagrun import DagRun

    generate = DagRun.generate_run_id
    pending = [run_id]

    def generate_run_id(**kwargs: Any) -> str:
        return pending.pop() if pending else generate(**kwargs)

    with patch.object(DagRun, "generate_run_id", staticmethod(generate_run_id)):
        yield


@contextmanager
def _mapped_instances_in_map_index_order() -> Iterator[None]:
    """Run a mapped task's scheduled instances in map-index order, as the scheduler hands out their slots.

    ``dag.test()`` runs each pass's scheduled instances in the order of a set. A node that runs before
    a parent still scheduled finds it not started and gives its slot back (a reschedule of seconds,
    which ``dag.test()`` waits out in 1 s sleeps); on a scheduler the parent, lower in the plan's run
    order and so in map index, gets its slot first. So when ``dag.test()`` comes to an instance, the
    scheduled instances of the same task and run below it run first, and an instance run that way is
    not run again when its own turn comes.
    """
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from airflow.utils.state import TaskInstanceState

    from airflow_plan_provider.compat import wrap_in_process_task_runner

    def scheduled_up_to(ti: Any) -> list[Any]:
        """The scheduled instances of ``ti``'s task and run up to ``ti``'s map index, in that order."""
        with create_session() as session:
            rows = (
                session.query(TaskInstance)
                .filter_by(dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id)
                .filter(TaskInstance.map_index <= ti.map_index)
                .filter(TaskInstance.state == TaskInstanceState.SCHEDULED)
                .order_by(TaskInstance.map_index)
                .all()
            )
            session.expunge_all()
        return rows

    def in_map_index_order(run_task: Callable[..., Any]) -> Callable[..., Any]:
        def run_in_map_index_order(*, ti: Any, task: Any, **kwargs: Any) -> Any:
            if ti.map_index < 0:
                return run_task(ti=ti, task=task, **kwargs)
            scheduled = scheduled_up_to(ti)
            if not scheduled or scheduled[-1].map_index != ti.map_index:
                return None  # it ran already, before an instance above it
            for earlier in scheduled[:-1]:
                run_task(ti=earlier, task=task, **kwargs)
            return run_task(ti=ti, task=task, **kwargs)

        return run_in_map_index_order

    with wrap_in_process_task_runner(in_map_index_order):
        yield


@contextmanager
def _hitl_triggers_in_process() -> Iterator[None]:
    """Let an approval task that waits deferred (no ``awaiting_input`` state in this Airflow) get its
    answer: ``dag.test()`` runs the HITL trigger inline, and the trigger reads the response record."""
    from airflow_plan_provider import airflow_features

    if airflow_features.awaiting_input():
        yield  # the task parks in awaiting_input; an answer through the REST API resumes it
        return
    from airflow_plan_provider.compat import hitl_trigger_requests_in_process

    with hitl_trigger_requests_in_process():
        yield


@contextmanager
def _next_revision_first(start: Any, problems: list[Exception]) -> Iterator[None]:
    """While active, every ``replan`` task ``dag.test()`` runs is preceded by ``start(ti)``.

    ``dag.test()`` logs and swallows a task's exception: a failure of ``start`` is kept in ``problems``
    (raised when ``dag.test()`` returns) and fails the replan task instead of letting it wait for a run
    that was never started.
    """
    from airflow.utils.state import TaskInstanceState

    from airflow_plan_provider.compat import wrap_in_process_task_runner

    def after_its_revision(run_task: Callable[..., Any]) -> Callable[..., Any]:
        def run_task_after_its_revision(*, ti: Any, task: Any, **kwargs: Any) -> Any:
            if task.task_id == REPLAN_TASK and not problems:
                try:
                    start(ti)
                except Exception as error:
                    problems.append(error)
            if task.task_id == REPLAN_TASK and problems:
                ti.set_state(TaskInstanceState.FAILED)
                return None
            return run_task(ti=ti, task=task, **kwargs)

        return run_task_after_its_revision

    with wrap_in_process_task_runner(after_its_revision):
        yield


def _xcom(dag_id: str, run_id: str, task_id: str, key: str) -> Any:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = (
            session.query(XComModel)
            .filter_by(dag_id=dag_id, run_id=run_id, task_id=task_id, key=key, map_index=-1)
            .one_or_none()
        )
        return None if row is None else XComModel.deserialize_value(row)


def _task_instances(dag_id: str, run_id: str) -> list[Any]:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        tis = session.query(TaskInstance).filter_by(dag_id=dag_id, run_id=run_id).all()
        session.expunge_all()
        return tis


def _task_states(dag_id: str, run_id: str) -> dict[str, str]:
    return {
        (ti.task_id if ti.map_index < 0 else f"{ti.task_id}[{ti.map_index}]"): str(ti.state)
        for ti in _task_instances(dag_id, run_id)
    }


def _revision_run(dag_run: DagRun, group: str | None) -> RevisionRun:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.query(DagRun).filter_by(dag_id=dag_run.dag_id, run_id=dag_run.run_id).one()
        state, conf = str(row.state), row.conf or {}
    return RevisionRun(
        dag_id=dag_run.dag_id,
        run_id=dag_run.run_id,
        revision=int((conf.get("session") or {}).get("revision", 0)),
        state=state,
        node_states=node_states(dag_run.dag_id, dag_run.run_id, group),
        conf=dict(conf),
    )
