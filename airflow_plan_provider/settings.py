"""Settings of a plan DAG: a few validated, immutable objects, each with its defaults stated once.

- ``Limits`` (:mod:`~airflow_plan_provider.plan.validate`): the size of a plan. The planning task,
  ``airflow-plan validate`` and ``freeze``, and :func:`validate_plan` use the same defaults.
- ``Budgets`` (:mod:`~airflow_plan_provider.plan.budgets`): node executions and replans of a session;
  the trigger form's defaults.
- :class:`NodeExecution`: how the node tasks run (retries, timeout, cap, pool, waiting in a slot).
- :class:`ArtifactStore`: where large outputs and checkpoints go, and from what size.
- :class:`ControlRetries`: how the other tasks (plan, approve, select, finalize, replan) retry.
- :class:`ApprovalPolicy`: when the ``approve`` task asks, who answers, how long it waits.
- ``operator_args``: a mapping passed to every task the factory builds (``owner``, ``queue``,
  callbacks, ...), minus the arguments the settings above own (:data:`OWNED_OPERATOR_ARGS`), checked
  by :func:`check_operator_args`.

None of them imports Airflow: the command line reads the same defaults as the DAG. Each checks its
values when it is made and raises ``ValueError`` naming the field (``NodeExecution.retries must be an
integer >= 0, got -1``); a DAG built from them carries only plain values on its tasks, so a DAG file
parsed again serializes the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from airflow_plan_provider.artifacts import DEFAULT_THRESHOLD
from airflow_plan_provider.plan.approval import APPROVAL_MODES, ApprovalMode

#: How long a node waits in its slot for running parents, by default (then on the triggerer).
DEFAULT_SLOT_WAIT = timedelta(seconds=30)

#: An approver: a user id, or a mapping with ``id`` (and ``name``).
Approver = str | Mapping[str, str]


def _count(owner: str, name: str, value: Any, minimum: int, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        what = f"an integer >= {minimum}{' or None' if optional else ''}"
        raise ValueError(f"{owner}.{name} must be {what}, got {value!r}")


def _duration(owner: str, name: str, value: Any, *, optional: bool = False, positive: bool = False) -> None:
    if optional and value is None:
        return
    if not isinstance(value, timedelta) or value < timedelta(0) or (positive and not value):
        what = "a timedelta > 0" if positive else "a timedelta >= 0"
        raise ValueError(f"{owner}.{name} must be {what}{' or None' if optional else ''}, got {value!r}")


@dataclass(frozen=True)
class NodeExecution:
    """How the node tasks run.

    :param retries: Airflow retries of a node (a transient tool error, a lost worker).
    :param retry_delay: the first retry's delay; later ones grow by ``retry_exponential_backoff``
        (a multiplier, 0 for a constant delay) up to ``max_retry_delay``.
    :param timeout: a node task's ``execution_timeout`` (and an asynchronous tool's default job timeout);
        ``None``: no limit.
    :param max_active_nodes: nodes running at once in one run, in each node task; ``None``: no cap of
        the node task's own (the DAG's ``max_active_tasks``, a pool and ``parallelism`` still apply).
    :param pool: an Airflow pool shared across runs by the nodes whose tool declares none (a tool's own
        pool wins for its nodes).
    :param slot_wait: how long a node whose parents are running waits for them in its slot (polling
        their states) before it waits on the triggerer instead.
    :param pools_count_deferred: whether a pool the node tasks run in (``pool``, a tool's pool) may
        count deferred task instances (Airflow's pool ``include_deferred``). Set it to False when none
        does (Airflow's default for a pool): then, while ``max_active_nodes`` is None or at least the
        plan's size, a node whose parent waits for a slot waits for it on the triggerer, holding
        nothing, instead of making way (:mod:`airflow_plan_provider.plan.waiting`), which keeps lanes
        from starving at a shared cap of 1. Under ``dag.test()``, which runs a trigger inline to its
        event before any other task, such a node makes way all the same.
    :param start_on_triggerer: a node that has parents starts on the triggerer, where Airflow offers it
        for mapped tasks (3.3 and later; elsewhere nodes start in a slot, as without it): its instance
        is deferred the moment it is scheduled, takes no task start and no slot while its parents have
        not begun their tools, and comes to a slot when they run them or have finished
        (:class:`~airflow_plan_provider.triggers.start.NodeStartTrigger`). A lane's nodes with parents
        then run in a task of their own (``nodes__after``, ``nodes__<lane>__after``). Airflow counts a
        deferred instance under its task's cap and, with ``include_deferred``, its pool, and bounds its
        deferral by the task's ``execution_timeout``: so it needs ``max_active_nodes=None`` (cap the run
        with the DAG's ``max_active_tasks``, which counts no deferred instance),
        ``pools_count_deferred=False`` and ``timeout=None``.

    >>> NodeExecution(retries=-1)
    Traceback (most recent call last):
    ...
    ValueError: NodeExecution.retries must be an integer >= 0, got -1
    """

    retries: int = 2
    retry_delay: timedelta = timedelta(seconds=5)
    retry_exponential_backoff: float = 2.0
    max_retry_delay: timedelta = timedelta(minutes=5)
    timeout: timedelta | None = None
    max_active_nodes: int | None = 5
    pool: str | None = None
    slot_wait: timedelta = DEFAULT_SLOT_WAIT
    pools_count_deferred: bool = True
    start_on_triggerer: bool = False

    def __post_init__(self) -> None:
        _count("NodeExecution", "retries", self.retries, 0)
        _count("NodeExecution", "max_active_nodes", self.max_active_nodes, 1, optional=True)
        _duration("NodeExecution", "retry_delay", self.retry_delay)
        _duration("NodeExecution", "max_retry_delay", self.max_retry_delay)
        _duration("NodeExecution", "timeout", self.timeout, optional=True, positive=True)
        _duration("NodeExecution", "slot_wait", self.slot_wait)
        if not isinstance(self.pools_count_deferred, bool):
            raise ValueError(
                f"NodeExecution.pools_count_deferred must be a bool, got {self.pools_count_deferred!r}"
            )
        backoff = self.retry_exponential_backoff
        if isinstance(backoff, bool) or not isinstance(backoff, int | float) or backoff < 0:
            raise ValueError(
                f"NodeExecution.retry_exponential_backoff must be a number >= 0, got {backoff!r}"
            )
        if self.pool is not None and (not isinstance(self.pool, str) or not self.pool.strip()):
            raise ValueError(f"NodeExecution.pool must be a pool name or None, got {self.pool!r}")
        self._check_start_on_triggerer()

    def _check_start_on_triggerer(self) -> None:
        """Nodes started on the triggerer hold nothing while deferred: no task cap, no pool counting
        deferred instances, no timeout that would count their wait for their parents."""
        if not isinstance(self.start_on_triggerer, bool):
            raise ValueError(
                f"NodeExecution.start_on_triggerer must be a bool, got {self.start_on_triggerer!r}"
            )
        if not self.start_on_triggerer:
            return
        held = {
            "max_active_nodes": (
                self.max_active_nodes,
                "None (Airflow counts deferred instances under a task's cap; cap the run with the DAG's "
                "max_active_tasks)",
            ),
            "pools_count_deferred": (
                self.pools_count_deferred,
                "False (a pool counting deferred instances would be filled by nodes waiting for their "
                "parents)",
            ),
            "timeout": (
                self.timeout,
                "None (Airflow bounds a deferral the scheduler starts by the task's execution_timeout: "
                "the wait for the parents would count)",
            ),
        }
        for name, (value, needed) in held.items():
            if value not in (None, False):
                raise ValueError(
                    f"NodeExecution(start_on_triggerer=True) needs {name}={needed}, got {value!r}"
                )

    def task_kwargs(self) -> dict[str, Any]:
        """The operator arguments every node task gets from these settings."""
        kwargs: dict[str, Any] = {
            "retries": self.retries,
            "retry_delay": self.retry_delay,
            "retry_exponential_backoff": float(self.retry_exponential_backoff),
            "max_retry_delay": self.max_retry_delay,
            "execution_timeout": self.timeout,
            "max_active_tis_per_dagrun": self.max_active_nodes,
            "slot_wait": self.slot_wait.total_seconds(),
            "pools_count_deferred": self.pools_count_deferred,
        }
        if self.pool:
            kwargs["pool"] = self.pool
        return kwargs


@dataclass(frozen=True)
class ArtifactStore:
    """Where node outputs over ``threshold`` bytes and the nodes' checkpoints are written.

    :param url: an ``ObjectStoragePath`` URL (``s3://bucket/plans``, ``file:///shared/plans``);
        ``None``: ``$PLAN_ARTIFACT_STORE``, else a folder under ``AIRFLOW_HOME`` (one machine only).
    :param threshold: an output larger than this many bytes (as JSON) is stored, and XCom carries a
        reference to it.
    :param checkpoints: whether a node that succeeded saves a checkpoint, so that a cleared or retried
        task does not call its tool again.
    """

    url: str | None = None
    threshold: int = DEFAULT_THRESHOLD
    checkpoints: bool = True

    def __post_init__(self) -> None:
        if self.url is not None and (not isinstance(self.url, str) or not self.url.strip()):
            raise ValueError(f"ArtifactStore.url must be a URL or None, got {self.url!r}")
        _count("ArtifactStore", "threshold", self.threshold, 0)
        if not isinstance(self.checkpoints, bool):
            raise ValueError(f"ArtifactStore.checkpoints must be True or False, got {self.checkpoints!r}")

    def task_kwargs(self) -> dict[str, Any]:
        """The node operator's arguments for this store."""
        return {
            "artifact_store": self.url,
            "artifact_threshold": self.threshold,
            "checkpoints": self.checkpoints,
        }


@dataclass(frozen=True)
class ControlRetries:
    """How the tasks around the nodes (``plan``, ``approve``, ``select_*``, ``finalize``, ``replan``) retry.

    They fail for good on their own verdicts (an invalid plan, a failed session); a retry is for a
    lost worker (killed, evicted, out of memory) or an unexpected error, and every one of them is safe
    to run again: planning plans again (see :class:`~airflow_plan_provider.operators.plan_task.PlanOperator`
    for the plan it reuses), select and finalize recompute from what the earlier tasks recorded, and
    replan waits for the run an earlier try started. The default retries three times, five seconds
    apart: a lost task costs the heartbeat timeout that notices it plus a few seconds, not Airflow's
    default five minutes. Kept apart from :class:`NodeExecution`: a node's retries are for its tool's
    failures, these only for losing the task.

    >>> ControlRetries(retries=1, delay=timedelta(seconds=2)).task_kwargs()
    {'retries': 1, 'retry_delay': datetime.timedelta(seconds=2)}
    """

    retries: int = 3
    delay: timedelta = timedelta(seconds=5)

    def __post_init__(self) -> None:
        _count("ControlRetries", "retries", self.retries, 0)
        _duration("ControlRetries", "delay", self.delay)

    def task_kwargs(self) -> dict[str, Any]:
        """The operator arguments of a control task."""
        return {"retries": self.retries, "retry_delay": self.delay}


@dataclass(frozen=True)
class ApprovalPolicy:
    """The ``approve`` task between ``plan`` and the first node tasks.

    :param mode: ``"risky"``: ask when the plan would run a node whose tool has ``needs_approval`` (no
        task at all when no tool has); ``"always"``: ask for every plan; ``"never"``: no task.
    :param timeout: no answer within this is a rejection; ``None``: wait for ever.
    :param approvers: user ids (or ``{"id", "name"}`` mappings) who may answer; ``None``: any user
        allowed to answer this DAG's requests.
    """

    mode: ApprovalMode = "risky"
    timeout: timedelta | None = timedelta(days=1)
    approvers: tuple[Approver, ...] | None = None

    def __init__(
        self,
        mode: ApprovalMode = "risky",
        timeout: timedelta | None = timedelta(days=1),
        approvers: Sequence[Approver] | str | None = None,
    ) -> None:
        if mode not in APPROVAL_MODES:
            raise ValueError(f"ApprovalPolicy.mode must be one of {APPROVAL_MODES}, got {mode!r}")
        _duration("ApprovalPolicy", "timeout", timeout, optional=True, positive=True)
        if isinstance(approvers, str):
            approvers = (approvers,)
        elif approvers is not None:
            if not isinstance(approvers, Sequence) or not approvers:
                raise ValueError(
                    f"ApprovalPolicy.approvers must be user ids (a non-empty list) or None, got {approvers!r}"
                )
            approvers = tuple(approvers)
            for approver in approvers:
                named = (
                    isinstance(approver, Mapping) and isinstance(approver.get("id"), str) and approver["id"]
                )
                if not named and not (isinstance(approver, str) and approver.strip()):
                    raise ValueError(
                        "ApprovalPolicy.approvers: an approver is a user id or a mapping with 'id' "
                        f"(and 'name'), not {approver!r}"
                    )
        object.__setattr__(self, "mode", mode)
        object.__setattr__(self, "timeout", timeout)
        object.__setattr__(self, "approvers", approvers)


#: Operator arguments the factory sets itself, and what sets them instead; ``operator_args`` may not
#: name them.
OWNED_OPERATOR_ARGS: dict[str, str] = {
    "task_id": "the factory (the plan's task layout)",
    "task_group": "the factory (the plan's task layout)",
    "dag": "the factory (the plan's task layout)",
    "trigger_rule": "the factory (the plan's task layout)",
    "do_xcom_push": "the factory (the plan's tasks hand over through XCom)",
    "map_index_template": "the factory (each node is labelled 'id · action')",
    "retry_policy": "the factory (a node's tool errors decide its retries)",
    "retries": "NodeExecution(retries=...) for the nodes, ControlRetries(retries=...) for the others",
    "retry_delay": "NodeExecution(retry_delay=...) for the nodes, ControlRetries(delay=...) for the others",
    "retry_exponential_backoff": "NodeExecution(retry_exponential_backoff=...)",
    "max_retry_delay": "NodeExecution(max_retry_delay=...)",
    "execution_timeout": "NodeExecution(timeout=...)",
    "max_active_tis_per_dagrun": "NodeExecution(max_active_nodes=...)",
    "pool": "NodeExecution(pool=...), or a tool's own pool=",
    "pool_slots": "a tool's own pool_slots=",
    "slot_wait": "NodeExecution(slot_wait=...)",
    "pools_count_deferred": "NodeExecution(pools_count_deferred=...)",
}


def check_operator_args(operator_args: Mapping[str, Any] | None) -> dict[str, Any]:
    """``operator_args`` as a dict, once shown to name no argument the factory owns.

    >>> check_operator_args({"owner": "data-team"})
    {'owner': 'data-team'}
    >>> check_operator_args({"execution_timeout": None})
    Traceback (most recent call last):
    ...
    ValueError: operator_args may not set 'execution_timeout': it is set by NodeExecution(timeout=...)
    """
    if operator_args is None:
        return {}
    if not isinstance(operator_args, Mapping) or not all(isinstance(k, str) for k in operator_args):
        raise ValueError(f"operator_args must be a mapping of argument names, got {operator_args!r}")
    for name in operator_args:
        if name in OWNED_OPERATOR_ARGS:
            raise ValueError(f"operator_args may not set {name!r}: it is set by {OWNED_OPERATOR_ARGS[name]}")
    return dict(operator_args)


__all__ = [
    "ApprovalPolicy",
    "ArtifactStore",
    "ControlRetries",
    "NodeExecution",
    "check_operator_args",
]
