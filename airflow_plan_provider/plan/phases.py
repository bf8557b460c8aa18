"""Where a node is in its life, in the provider's words: from its task instance's state and its parents'.

Airflow's task state says "running" for a node that waits in its slot for its parents and for one whose
tool runs, and "deferred" for one that waits for its parents on the triggerer and for one that polls
its asynchronous job. A node calls its tool only once every parent has finished, so its parents' states
tell the two apart; a deferred node's resume method names what it waits for.

>>> node_phase("running", None, {"1": "running", "2": "success"})
NodePhase(phase='waiting', waiting_for=('1',), where='in its slot')
>>> node_phase("running", None, {"1": "success"}).phase
'running'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum


class Phase(StrEnum):
    """A node's phase: while its task is live, what it does; once it has ended, its task's final state."""

    QUEUED = "queued"  # its task waits for Airflow to start it (scheduled or queued: a slot, a worker)
    WAITING = "waiting"  # for named parents to finish: in its slot, deferred, or having made way
    RUNNING = "running"  # its tool runs
    POLLING = "polling"  # its asynchronous job runs; the node polls it from the triggerer
    RETRYING = "retrying"  # a try failed; the next waits for its retry delay


#: The node task's resume methods (``PlanNodeOperator``), as a deferred instance names them.
RESUME_AFTER_PARENTS = "resume_after_parents"
RESUME_AFTER_JOB = "resume_after_job"
#: Task states in which a node has ended: its phase is the state itself.
ENDED = frozenset({"success", "failed", "skipped", "upstream_failed", "removed", "not_run"})
_QUEUED = frozenset({"scheduled", "queued", "none", "restarting"})
_WHERE = {"running": "in its slot", "deferred": "deferred", "up_for_reschedule": "made way"}


@dataclass(frozen=True)
class NodePhase:
    """A node's phase; ``waiting_for``: the parents it waits for; ``where``: where it waits."""

    phase: str
    waiting_for: tuple[str, ...] = ()
    where: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "phase", str(self.phase))  # a Phase reads as its plain value


def node_phase(state: str | None, resume_method: str | None, parents: Mapping[str, str | None]) -> NodePhase:
    """The phase of a node whose task instance is in ``state`` (``None``: not created yet), deferred to
    ``resume_method`` when deferred, with ``parents`` mapping each parent node to its state."""
    if state is None:
        return NodePhase(Phase.QUEUED)
    if state in ENDED:
        return NodePhase(state)
    if state == "up_for_retry":
        return NodePhase(Phase.RETRYING)
    if state in _QUEUED:
        return NodePhase(Phase.QUEUED)
    unfinished = tuple(p for p, s in parents.items() if s not in ENDED)
    if state == "deferred":
        if resume_method == RESUME_AFTER_PARENTS or (unfinished and resume_method != RESUME_AFTER_JOB):
            return NodePhase(Phase.WAITING, unfinished, _WHERE[state])
        return NodePhase(Phase.POLLING)  # its parents have finished: what it waits for is its job
    if unfinished or state == "up_for_reschedule":
        return NodePhase(Phase.WAITING, unfinished, _WHERE.get(state))
    return NodePhase(Phase.RUNNING)  # running, every parent finished (a resumed node too)
