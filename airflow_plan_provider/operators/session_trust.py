"""Whether a replan run's conf carries a session this DAG's own replan task prepared.

A conf is user input: a forged session could reuse another run's idempotency keys and checkpoints or pass
off any output as a locked node's. The planning task accepts a session only from
:func:`verified_session`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

from pydantic import ValidationError

from airflow_plan_provider.contract import FINALIZE_TASK, REPLAN_CONF_KEY, ReplanConf
from airflow_plan_provider.exceptions import PlanningError
from airflow_plan_provider.plan.session import SessionState, replan_run_id


def verified_session(ti: Any, conf: Mapping[str, Any], run_id: str) -> SessionState:
    """The session a replan run's conf carries, once shown to be the one this DAG's replan task started.

    Accepted only when: the conf carries no ready plan; this run's id is the one the replan task gives
    the session's revision (:func:`replan_run_id`), so one parent starts at most one run per revision;
    the session's parent run (``session.parent_run_id``) is a run of this DAG; and that run's finalize
    task pushed exactly this conf (XCom ``replan_conf``: ``goal`` and ``session``, compared as JSON
    values, no key more or less). Raises :class:`PlanningError` (reason ``untrusted_session``) naming the
    check that failed; the conf's content is never echoed.
    """

    def reject(why: str) -> NoReturn:
        raise PlanningError(
            f"untrusted session in the run's conf: {why}. Only this DAG's replan task starts runs that carry "
            "a session; trigger a new run with a goal (or a ready plan) instead",
            reason="untrusted_session",
        )

    if conf.get("plan") is not None:
        reject("a conf with a session may not carry a ready plan")
    try:
        state = SessionState.model_validate(conf["session"])
    except ValidationError as error:  # its text quotes the input: only the count is reported
        reject(f"the session is not a valid session state ({error.error_count()} invalid field(s))")
    if not state.parent_run_id:
        reject("the session names no parent run")
    if state.revision < 1 or run_id != replan_run_id(state.root_run_id, state.revision):
        reject(f"this run's id {run_id!r} is not the one the replan task gives the session's revision")
    if ti.get_dr_count(dag_id=ti.dag_id, run_ids=[state.parent_run_id]) < 1:
        reject(f"the session's parent run is not a run of DAG {ti.dag_id!r}")
    prepared = ti.xcom_pull(
        task_ids=FINALIZE_TASK, key=REPLAN_CONF_KEY, dag_id=ti.dag_id, run_id=state.parent_run_id
    )
    if not isinstance(prepared, Mapping):
        reject("the session's parent run prepared no replan")
    differing = _differing_fields(prepared, conf)
    if differing:
        reject(f"it differs from the one the parent run's finalize task prepared (in {', '.join(differing)})")
    return state


def same_json(first: Any, second: Any) -> bool:
    """Whether two decoded JSON documents are the same JSON value.

    Numbers compare by value (a database may hand ``1e+20`` back as ``100000000000000000000``), but a
    boolean is never a number (``true`` is not ``1``), and object keys and array order count. Iterative:
    a deeply nested document cannot exhaust the stack.
    """
    pending = [(first, second)]
    while pending:
        a, b = pending.pop()
        if isinstance(a, bool) or isinstance(b, bool):
            if not (isinstance(a, bool) and isinstance(b, bool) and a == b):
                return False
        elif isinstance(a, int | float) and isinstance(b, int | float):
            if a != b:
                return False
        elif isinstance(a, Mapping) and isinstance(b, Mapping):
            if set(a) != set(b):
                return False
            pending.extend((a[key], b[key]) for key in a)
        elif isinstance(a, list | tuple) and isinstance(b, list | tuple):
            if len(a) != len(b):
                return False
            pending.extend(zip(a, b, strict=True))
        elif not ((a is None and b is None) or (isinstance(a, str) and isinstance(b, str) and a == b)):
            return False
    return True


def _differing_keys(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> list[str]:
    """Keys present in only one of the two mappings, or holding different JSON values."""
    return [
        key
        for key in sorted(set(ours) | set(theirs))
        if key not in ours or key not in theirs or not same_json(ours[key], theirs[key])
    ]


def _differing_fields(prepared: Mapping[str, Any], conf: Mapping[str, Any]) -> list[str]:
    """Where ``conf`` departs from what finalize ``prepared``, as ``goal`` or ``session.<field>``: names
    the provider wrote itself; any other key is only counted, so no forged text is echoed."""
    named: list[str] = []
    others = 0
    for key in _differing_keys(prepared, conf):
        ours, theirs = prepared.get(key), conf.get(key)
        if key in ReplanConf.model_fields and isinstance(ours, Mapping) and isinstance(theirs, Mapping):
            for field in _differing_keys(ours, theirs):
                if field in SessionState.model_fields:
                    named.append(f"session.{field}")
                else:
                    others += 1
        elif key in prepared or key in ReplanConf.model_fields:
            named.append(key)
        else:
            others += 1
    return [*named, f"{others} other key(s)"] if others else named
