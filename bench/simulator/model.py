"""What the simulator is given: plans with their tools' durations and transient failures, the caps of
a deployment, and the costs of Airflow's moves (calibrated on ``bench/``'s real runs)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from airflow_plan_provider.plan.graph import descendant_counts, run_order, topological_layers


@dataclass(frozen=True)
class SimPlan:
    """A plan as the simulator runs it: node → parents, node → tool seconds, node → the tries whose
    tool fails transiently (1 = the first try) and, for a pooled node, its lane (its own mapped task
    with the lane's pool)."""

    parents: Mapping[str, Sequence[str]]
    seconds: Mapping[str, float]
    failing_tries: Mapping[str, frozenset[int]] = field(default_factory=dict)
    lanes: Mapping[str, str] = field(default_factory=dict)

    @property
    def order(self) -> list[str]:
        """The plan's run order: the node tasks' map-index order (``plan/graph.py``)."""
        return run_order(topological_layers(self.parents), self.parents)

    def descendants(self) -> dict[str, int]:
        return descendant_counts(topological_layers(self.parents), self.parents)

    def critical_path(self) -> float:
        finish: dict[str, float] = {}
        for node in self.order:
            finish[node] = max((finish[p] for p in self.parents[node]), default=0.0) + self.seconds[node]
        return max(finish.values(), default=0.0)

    @property
    def work(self) -> float:
        return sum(self.seconds.values())

    def scaled(self, factor: float) -> SimPlan:
        seconds = {n: s * factor for n, s in self.seconds.items()}
        return SimPlan(self.parents, seconds, self.failing_tries, self.lanes)


def list_scheduling_bound(plan: SimPlan, cap: int) -> float:
    """No schedule on ``cap`` slots ends before max(critical path, total work / cap)."""
    return max(plan.critical_path(), plan.work / cap)


@dataclass(frozen=True)
class Caps:
    """The caps of one deployment. ``task_cap``: the node tasks' ``max_active_tis_per_dagrun`` (None:
    none); ``dag_cap``: the DAG's ``max_active_tasks``; ``parallelism``: the executor's; ``pool``: the
    slots of the pool every node task runs in (None: the default pool, unbounded here), and whether it
    counts deferred instances; ``lane_pools``: slots of each lane's own pool; ``max_tis_per_query``:
    ``[scheduler] max_tis_per_query``."""

    task_cap: int | None = None
    dag_cap: int = 16
    parallelism: int = 16
    pool: int | None = None
    pool_counts_deferred: bool = False
    lane_pools: Mapping[str, int] = field(default_factory=dict)
    max_tis_per_query: int = 16
    retries: int = 3
    retry_delay: float = 5.0


@dataclass(frozen=True)
class Costs:
    """Seconds (or CPU-seconds, ``*_cpu``) of Airflow's moves. CPU work is shared by every process of
    the deployment on ``cores`` cores (processor sharing); ``cores`` = 0 turns sharing off (each CPU
    part then takes its own time), which the property tests use.

    - a scheduler loop costs ``loop_cpu`` plus ``loop_ti_cpu`` per unfinished task instance of the runs
      it looks at, then sleeps ``loop_sleep``;
    - a queued instance's process starts ``queue_latency`` later (executor pick-up: its start_date), and
      is ready to act after ``start_cpu`` plus ``start_node_cpu`` per plan node more (process start,
      DAG parse, reading and checking the plan);
    - a state read costs ``read_cpu`` plus ``read_row_cpu`` per task state returned; a checkpoint read
      ``checkpoint_read``; after its tool a node pushes its record and ends: ``end_cpu``;
    - a deferred node's trigger first polls ``trigger_pickup`` after the deferral, at the triggerer's
      next tick: the triggerer starts new triggers and hands their events on once every
      ``triggerer_tick`` seconds (Airflow's ``TriggerRunner`` loop waits a second between two rounds),
      so a node whose trigger fired is scheduled again at the next tick; 0: at once;
    - the executor reports a process's exit ``report_latency`` after it: a rescheduled instance queued
      again before that fails its try (apache/airflow#71172);
    - the plan DAG's ``plan`` and ``finalize`` tasks run ``plan_task`` and ``finalize_task`` seconds;
    - a static DAG's task process costs ``static_start_factor`` of a node's start;
    - a task process that left its slot (ended, deferred) keeps its executor slot ``exit_hold`` longer:
      the executor's worker reports the process's exit once the process is gone, and the scheduler counts
      the slot free only then (it matters where the executor's parallelism is the DAG's cap).
    """

    loop_sleep: float = 1.0
    loop_cpu: float = 0.05
    loop_ti_cpu: float = 0.0
    queue_latency: float = 0.2
    start_cpu: float = 0.5
    start_node_cpu: float = 0.0
    read_cpu: float = 0.02
    read_row_cpu: float = 0.0
    checkpoint_read: float = 0.03
    end_cpu: float = 0.15
    trigger_pickup: float = 1.0
    triggerer_tick: float = 0.0
    report_latency: float = 1.5
    plan_task: float = 0.3
    finalize_task: float = 0.2
    static_start_factor: float = 0.6
    exit_hold: float = 0.0
    cores: float = 0.0


#: the costs fitted to the bench plans' PostgreSQL figures of 2026-11-30 (code 681bc3f; ``python
#: bench/simulate.py --calibrate`` fits them again, to the newest figures): 2 cores as there. The
#: package has since made the 500-node plan several times faster, which these costs do not know
#: (``python bench/simulate.py`` prints each bench plan's simulated makespan beside its newest one)
CALIBRATED = Costs(
    loop_sleep=0.05,
    loop_cpu=0.005,
    loop_ti_cpu=0.001584,
    queue_latency=0.02,
    start_cpu=0.058333,
    start_node_cpu=0.002,
    read_cpu=0.1,
    read_row_cpu=0.000933,
    checkpoint_read=0.03,
    end_cpu=0.1,
    trigger_pickup=2.749999,
    triggerer_tick=1.0,
    report_latency=1.5,
    plan_task=0.35,
    finalize_task=0.5,
    static_start_factor=0.833333,
    cores=2.0,
)
