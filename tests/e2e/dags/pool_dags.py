"""Plan DAGs with a pooled tool for tests/e2e/test_celery_load.py.

``limited_api`` stands for a rate-limited service: it declares the Airflow pool ``rate_limited_api``
and measures its own concurrency in Redis (``$PLAN_E2E_GAUGE_URL``, keys under
``$PLAN_E2E_GAUGE_PREFIX``): every call increments a counter of calls in progress, records the highest
value seen, and decrements it when done — across every worker process and machine.

A node task holds its pool slot from queued through start-up to its end, seconds in all, while the
call itself lasts under a second; so that calls running together are seen together, a call first
waits (at most 1 s) until ``GATHER`` calls are in progress. Without the pool, far more than ``GATHER``
calls would be seen at once.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

from airflow_plan_provider import NodeExecution, ToolRegistry, build_plan_dag
from airflow_plan_provider.testing import ScriptedPlanner

POOL = "rate_limited_api"
GAUGE_URL_ENV = "PLAN_E2E_GAUGE_URL"
GAUGE_PREFIX_ENV = "PLAN_E2E_GAUGE_PREFIX"
API_NODES = 6
LOCAL_NODES = 10
SUM_NODES = 4  # 20 nodes per session
GATHER = 3

# one atomic step: one more call in progress, the highest count seen, one more call made
_ENTER = """
local now = redis.call('INCR', KEYS[1])
if now > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], now) end
redis.call('INCR', KEYS[3])
return now
"""


def gauge_keys(prefix: str) -> dict[str, str]:
    return {name: f"{prefix}:{name}" for name in ("current", "max", "calls")}


registry = ToolRegistry()


@registry.tool(description="Call the rate-limited API (3 calls at a time at most)", pool=POOL)
def limited_api(session: int, n: int) -> dict[str, int]:
    import redis

    keys = gauge_keys(os.environ[GAUGE_PREFIX_ENV])
    client = redis.Redis.from_url(os.environ[GAUGE_URL_ENV], socket_timeout=10)
    try:
        client.eval(_ENTER, 3, keys["current"], keys["max"], keys["calls"])
        try:
            deadline = time.monotonic() + 1.0
            while int(client.get(keys["current"]) or 0) < GATHER and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.2 + 0.1 * (n % 5))  # 0.2 to 0.6 s
        finally:
            client.decr(keys["current"])
    finally:
        client.close()
    return {"session": session, "n": n, "value": session * 100 + n}


@registry.tool(description="A local step")
def local_step(session: int, n: int) -> dict[str, int]:
    time.sleep(0.2)
    return {"session": session, "n": n, "value": session * 1000 + n}


@registry.tool(description="Add numbers")
def add(parts: list[int]) -> int:
    return sum(parts)


def load_plan(session: int) -> dict[str, Any]:
    """20 nodes: 6 calls of the limited API and 10 local steps, then 4 sums each reading 2 of each."""
    nodes: list[dict[str, Any]] = [
        {
            "id": f"api{i}",
            "action": f"call the API ({i})",
            "tool": "limited_api",
            "params": {"session": session, "n": i},
        }
        for i in range(API_NODES)
    ]
    nodes += [
        {
            "id": f"local{i}",
            "action": f"local step {i}",
            "tool": "local_step",
            "params": {"session": session, "n": i},
        }
        for i in range(LOCAL_NODES)
    ]
    for j in range(SUM_NODES):
        parts = [
            f"${{api{2 * j % API_NODES}.value}}",
            f"${{api{(2 * j + 1) % API_NODES}.value}}",
            f"${{local{2 * j}.value}}",
            f"${{local{2 * j + 1}.value}}",
        ]
        nodes.append({"id": f"sum{j}", "action": f"add pair {j}", "tool": "add", "params": {"parts": parts}})
    return {"goal": f"load session {session}", "nodes": nodes}


def expected_outputs(session: int) -> dict[str, Any]:
    outputs: dict[str, Any] = {}
    for i in range(API_NODES):
        outputs[f"api{i}"] = {"session": session, "n": i, "value": session * 100 + i}
    for i in range(LOCAL_NODES):
        outputs[f"local{i}"] = {"session": session, "n": i, "value": session * 1000 + i}
    for j in range(SUM_NODES):
        apis = (2 * j % API_NODES, (2 * j + 1) % API_NODES)
        locals_ = (2 * j, 2 * j + 1)
        outputs[f"sum{j}"] = sum(session * 100 + i for i in apis) + sum(session * 1000 + i for i in locals_)
    return outputs


def _plan_for(request: Any) -> dict[str, Any]:
    return load_plan(int(request.goal.rsplit(" ", 1)[1]))


#: the node tasks' settings every DAG here starts from
NODES: dict[str, Any] = {"retry_delay": timedelta(seconds=1), "max_retry_delay": timedelta(seconds=2)}
COMMON: dict[str, Any] = {"tools": registry, "replan": False, "tags": ["e2e"]}

e2e_pool_load = build_plan_dag(
    "e2e_pool_load",
    planner=ScriptedPlanner(_plan_for),
    execution=NodeExecution(**NODES),
    **COMMON,
)

# lanes wait for parents in other lanes (api0 -> local0 -> api1, and sum0 reads both lanes)
CROSS_LANES_PLAN = {
    "goal": "cross lanes",
    "nodes": [
        {
            "id": "api0",
            "action": "call the API first",
            "tool": "limited_api",
            "params": {"session": 7, "n": 0},
        },
        {
            "id": "local0",
            "action": "after the API",
            "tool": "local_step",
            "params": {"session": 7, "n": "${api0.n}"},
        },
        {
            "id": "api1",
            "action": "API after local",
            "tool": "limited_api",
            "params": {"session": 7, "n": "${local0.value}"},
        },
        {
            "id": "local1",
            "action": "independent local",
            "tool": "local_step",
            "params": {"session": 7, "n": 1},
        },
        {
            "id": "sum0",
            "action": "add both lanes",
            "tool": "add",
            "params": {"parts": ["${api1.value}", "${local1.value}"]},
        },
    ],
}
e2e_pool_cross_lanes = build_plan_dag(
    "e2e_pool_cross_lanes",
    planner=ScriptedPlanner(CROSS_LANES_PLAN),
    execution=NodeExecution(**NODES),
    **COMMON,
)
