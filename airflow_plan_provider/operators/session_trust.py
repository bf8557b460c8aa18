"""Whether a replan run's conf carries a session this DAG's own replan task prepared.

A conf is user input: a forged session could reuse another run's idempotency keys and checkpoints or pass
off any output as a locked node's. A replan run's conf therefore only names its session; the planning
task reads the session from the parent run's XCom, through :func:`verified_session`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

from pydantic import ValidationError

from airflow_plan_provider.contract import FINALIZE_TASK, REPLAN_CONF_KEY, ReplanConf, SessionRef
from airflow_plan_provider.exceptions import PlanningError
from airflow_plan_provider.plan.session import SessionState, replan_run_id


def verified_session(ti: Any, conf: Mapping[str, Any], run_id: str) -> SessionState:
    """The session a replan run's conf names, read from where this DAG's replan task left it.

    The conf carries ``goal`` and ``session``, a :class:`SessionRef` (root run, parent run, revision);
    the session itself is the one the parent run's finalize task pushed (XCom ``replan_conf``), never
    the conf's. Accepted only when: the conf has no other key (no ready plan); its ``session`` is a
    reference and nothing more; this run's id is the one the replan task gives the revision
    (:func:`replan_run_id`), so one parent starts at most one run per revision; the parent run is a run
    of this DAG; and that run's finalize task prepared exactly this revision of this session, for this
    goal. Raises :class:`PlanningError` (reason ``untrusted_session``) naming the check that failed; the
    conf's content is never echoed.
    """

    def reject(why: str) -> NoReturn:
        raise PlanningError(
            f"untrusted session in the run's conf: {why}. Only this DAG's replan task starts runs that carry "
            "a session; trigger a new run with a goal (or a ready plan) instead",
            reason="untrusted_session",
        )

    if conf.get("plan") is not None:
        reject("a conf with a session may not carry a ready plan")
    others = [key for key in conf if key not in ReplanConf.model_fields]
    if others:
        reject(f"a conf with a session carries only goal and session ({len(others)} other key(s))")
    try:
        ref = SessionRef.model_validate(conf["session"])
    except ValidationError as error:  # its text quotes the input: only the count is reported
        reject(
            f"its session is not a reference to one ({', '.join(SessionRef.model_fields)} only;"
            f" {error.error_count()} invalid field(s))"
        )
    if not ref.parent_run_id:
        reject("the session names no parent run")
    if ref.revision < 1 or run_id != replan_run_id(ref.root_run_id, ref.revision):
        reject(f"this run's id {run_id!r} is not the one the replan task gives the session's revision")
    if ti.get_dr_count(dag_id=ti.dag_id, run_ids=[ref.parent_run_id]) < 1:
        reject(f"the session's parent run is not a run of DAG {ti.dag_id!r}")
    prepared = ti.xcom_pull(
        task_ids=FINALIZE_TASK, key=REPLAN_CONF_KEY, dag_id=ti.dag_id, run_id=ref.parent_run_id
    )
    if not isinstance(prepared, Mapping):
        reject("the session's parent run prepared no replan")
    session = ReplanConf.model_validate(prepared)
    expected = SessionRef.of(session.state)
    differing = [
        f"session.{key}" for key in SessionRef.model_fields if getattr(ref, key) != getattr(expected, key)
    ]
    if conf.get("goal", "") != session.goal:
        differing.append("goal")
    if differing:
        reject(f"it differs from the one the parent run's finalize task prepared (in {', '.join(differing)})")
    return session.state
