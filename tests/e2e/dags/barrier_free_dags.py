"""Plan DAGs for tests/e2e/test_barrier_free.py: nodes start when their own parents finish (no layer
barrier), under caps smaller than the plan's width, on the embedded SQLite database."""

from __future__ import annotations

from datetime import timedelta

from airflow_plan_provider import NodeExecution, build_plan_dag
from airflow_plan_provider.testing import CallLog, ScriptedPlanner, ScriptedTool, scripted_registry

CALL_LOG_ENV = "PLAN_E2E_CALL_LOG"  # the folder the test gives every process for call logs


def call_log(dag_id: str) -> CallLog:
    return CallLog.in_folder_of(CALL_LOG_ENV, dag_id)


# a slow root beside a quick chain: b -> c must not wait for a (it would, behind a layer barrier)
UNBALANCED = {
    "goal": "unbalanced",
    "nodes": [
        {"id": "a", "action": "slow root", "tool": "slow"},
        {"id": "b", "action": "quick root", "tool": "quick"},
        {"id": "c", "action": "after b", "tool": "quick", "dependencies": ["b"]},
        {"id": "d", "action": "after a and c", "tool": "quick", "dependencies": ["a", "c"]},
    ],
}

_log = call_log("e2e_unbalanced")
e2e_unbalanced = build_plan_dag(
    "e2e_unbalanced",
    planner=ScriptedPlanner(UNBALANCED),
    tools=scripted_registry(
        ScriptedTool("slow", log=_log, returns="slow", sleep=20),
        ScriptedTool("quick", log=_log, returns="q", sleep=1),
    ),
    execution=NodeExecution(max_active_nodes=4, retries=0),
    replan=False,
)

# ten nodes, six of them children of a root that fails twice before it succeeds: while the root waits
# for its retries, its children hold (or would hold) both of the run's two node slots
RETRYING_ROOT = {
    "goal": "a root that retries under a cap of 2",
    "nodes": [
        {"id": "root", "action": "flaky root", "tool": "flaky"},
        *(
            {"id": f"c{i}", "action": f"child {i}", "tool": "quick", "dependencies": ["root"]}
            for i in range(6)
        ),
        {"id": "g0", "action": "join 0-1", "tool": "quick", "dependencies": ["c0", "c1"]},
        {"id": "g1", "action": "join 2-5", "tool": "quick", "dependencies": ["c2", "c3", "c4", "c5"]},
        {"id": "end", "action": "join all", "tool": "quick", "dependencies": ["g0", "g1"]},
    ],
}


def retrying_root_dag(dag_id: str, max_active_nodes: int, **dag: object) -> object:
    """The retrying-root plan as a DAG whose node tasks run at most ``max_active_nodes`` at once."""
    log = call_log(dag_id)
    return build_plan_dag(
        dag_id,
        planner=ScriptedPlanner(RETRYING_ROOT),
        tools=scripted_registry(
            ScriptedTool("flaky", log=log, returns="root", transient_failures=2, sleep=1),
            ScriptedTool("quick", log=log, returns="q", sleep=0.5),
        ),
        execution=NodeExecution(
            max_active_nodes=max_active_nodes,
            retries=2,
            retry_delay=timedelta(seconds=2),
            retry_exponential_backoff=0,
        ),
        replan=False,
        **dag,
    )


e2e_cap_2_retrying_root = retrying_root_dag("e2e_cap_2_retrying_root", max_active_nodes=2)
# the same plan under the DAG's cap of 2 (max_active_tasks, which counts no deferred instance) with no
# node task cap: waiting nodes also step aside (defer) for ready ones
e2e_dag_cap_2_retrying_root = retrying_root_dag(
    "e2e_dag_cap_2_retrying_root", max_active_nodes=10, max_active_tasks=2
)

# a small diamond run ten times at once: every node polls and writes while the others do
DIAMOND = {
    "goal": "diamond",
    "nodes": [
        {"id": "top", "action": "top", "tool": "quick"},
        *(
            {"id": f"m{i}", "action": f"middle {i}", "tool": "quick", "dependencies": ["top"]}
            for i in range(3)
        ),
        {"id": "bottom", "action": "bottom", "tool": "quick", "dependencies": ["m0", "m1", "m2"]},
    ],
}

e2e_sqlite_diamond = build_plan_dag(
    "e2e_sqlite_diamond",
    planner=ScriptedPlanner(DIAMOND),
    tools=scripted_registry(
        ScriptedTool("quick", log=call_log("e2e_sqlite_diamond"), returns="q", sleep=0.3)
    ),
    execution=NodeExecution(max_active_nodes=3, retries=0),
    replan=False,
)

# three independent nodes whose instances share a pool (created by the test) with the other sessions'
SESSIONS_POOL = "e2e_sessions"
TRIO = {
    "goal": "three roots",
    "nodes": [{"id": node, "action": f"root {node}", "tool": "quick"} for node in ("a", "b", "c")],
}

e2e_sessions_in_turn = build_plan_dag(
    "e2e_sessions_in_turn",
    planner=ScriptedPlanner(TRIO),
    tools=scripted_registry(
        ScriptedTool("quick", log=call_log("e2e_sessions_in_turn"), returns="q", sleep=0.2)
    ),
    execution=NodeExecution(pool=SESSIONS_POOL, retries=0),
    replan=False,
)

# a chain whose last node defers while its parent still waits on the root, and comes back to wait in a
# slot once that parent starts its tool; the middle node defers on a root that runs its tool already,
# and waits on the triggerer to the end
CHAIN = {
    "goal": "a chain of three",
    "nodes": [
        {"id": "a", "action": "long root", "tool": "long"},
        {"id": "b", "action": "after a", "tool": "middle", "dependencies": ["a"]},
        {"id": "c", "action": "after b", "tool": "quick", "dependencies": ["b"]},
    ],
}

_log = call_log("e2e_comes_back")
e2e_comes_back = build_plan_dag(
    "e2e_comes_back",
    planner=ScriptedPlanner(CHAIN),
    tools=scripted_registry(
        ScriptedTool("long", log=_log, returns="a", sleep=12),
        ScriptedTool("middle", log=_log, returns="b", sleep=4),
        ScriptedTool("quick", log=_log, returns="c", sleep=0.2),
    ),
    # deferrals hold nothing (no pool counts them, the cap is the plan's size): c's trigger waits through
    # b's return from the triggerer (scheduled again) instead of making way for it
    execution=NodeExecution(
        max_active_nodes=3, retries=0, slot_wait=timedelta(seconds=4), pools_count_deferred=False
    ),
    replan=False,
)

# nodes in two tasks: the default lane's and the pooled tool's lane (``nodes__e2e_lane``), their places
# in the run order interleaved across the two
LANE_POOL = "e2e_lane"
LANES = {
    "goal": "two lanes",
    "nodes": [
        {"id": "r1", "action": "root in the default lane", "tool": "quick"},
        {"id": "r2", "action": "root in the pool's lane", "tool": "pooled"},
        {"id": "m1", "action": "after both roots", "tool": "quick", "dependencies": ["r1", "r2"]},
        {"id": "m2", "action": "pooled, after r1", "tool": "pooled", "dependencies": ["r1"]},
        {"id": "m3", "action": "after r2", "tool": "quick", "dependencies": ["r2"]},
        {"id": "end", "action": "after all", "tool": "pooled", "dependencies": ["m1", "m2", "m3"]},
    ],
}

_log = call_log("e2e_lanes_in_order")
e2e_lanes_in_order = build_plan_dag(
    "e2e_lanes_in_order",
    planner=ScriptedPlanner(LANES),
    tools=scripted_registry(
        ScriptedTool("quick", log=_log, returns="q", sleep=0.2),
        ScriptedTool("pooled", log=_log, returns="p", sleep=0.2, pool=LANE_POOL),
    ),
    execution=NodeExecution(retries=0),
    replan=False,
)

# nodes with parents started on the triggerer, two slots for the run (the DAG's max_active_tasks, which
# counts no deferred instance): b, c and d wait there, holding no slot, while a runs
STARTED_ON_TRIGGERER = {
    "goal": "started on the triggerer",
    "nodes": [
        {"id": "a", "action": "long root", "tool": "long"},
        {"id": "r", "action": "quick root", "tool": "quick"},
        {"id": "b", "action": "after a", "tool": "middle", "dependencies": ["a"]},
        {"id": "c", "action": "after b", "tool": "quick", "dependencies": ["b"]},
        {"id": "d", "action": "after r and c", "tool": "quick", "dependencies": ["r", "c"]},
    ],
}

_log = call_log("e2e_started_on_triggerer")
e2e_started_on_triggerer = build_plan_dag(
    "e2e_started_on_triggerer",
    planner=ScriptedPlanner(STARTED_ON_TRIGGERER),
    tools=scripted_registry(
        ScriptedTool("long", log=_log, returns="a", sleep=15),
        ScriptedTool("middle", log=_log, returns="b", sleep=3),
        ScriptedTool("quick", log=_log, returns="q", sleep=0.2),
    ),
    execution=NodeExecution(
        max_active_nodes=None, retries=0, pools_count_deferred=False, start_on_triggerer=True
    ),
    replan=False,
    max_active_tasks=2,
)

# the same start on two slots, in a run without slots to spare (7 nodes > 2 slots x 3 layers): b, second
# by descendants, waits on the triggerer while the roots take or wait for both slots, and comes near a
# (still running its tool) once the last root ended and a slot is idle
WITHOUT_SPARE = {
    "goal": "started on the triggerer without slots to spare",
    "nodes": [
        {"id": "a", "action": "long root", "tool": "long"},
        *({"id": f"r{i}", "action": f"root {i}", "tool": "root"} for i in range(1, 5)),
        {"id": "b", "action": "after a", "tool": "quick", "dependencies": ["a"]},
        {"id": "c", "action": "after b", "tool": "quick", "dependencies": ["b"]},
    ],
}

_log = call_log("e2e_started_without_spare")
e2e_started_without_spare = build_plan_dag(
    "e2e_started_without_spare",
    planner=ScriptedPlanner(WITHOUT_SPARE),
    tools=scripted_registry(
        ScriptedTool("long", log=_log, returns="a", sleep=30),
        ScriptedTool("root", log=_log, returns="r", sleep=2),
        ScriptedTool("quick", log=_log, returns="q", sleep=0.2),
    ),
    execution=NodeExecution(
        max_active_nodes=None, retries=0, pools_count_deferred=False, start_on_triggerer=True
    ),
    replan=False,
    max_active_tasks=2,
)
