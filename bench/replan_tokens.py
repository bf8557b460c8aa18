"""Replan cost in prompt tokens versus a full plan, as the completed (locked) outputs grow.

The session is the demo's: goal "find why the payment API got slow yesterday", the demo tool catalog,
the 6-node payment-latency plan. Nodes 1-4 completed and are locked; node 5 failed, so 5 and 6 are to
be replanned. The four locked outputs together weigh 1 KB, 100 KB, 1 MB or 10 MB (log-like rows:
text with spaces, so whitespace tokens grow with size). For each size, three requests go through
``LLMPlanner`` to an ``OpenAITestServer`` (which counts prompt tokens as whitespace-separated words):

- full plan:  the first ``PlanRequest`` (goal, catalog, run conf) — independent of the outputs;
- replan:     the replan ``PlanRequest`` with ``LockedNode.summary = plan.result.summarize(output)``
              and the same run conf as the full plan;
- replan (operator): the request as ``PlanOperator._replan_request`` builds it in a replan run, whose
              run conf also carries the session (locked outputs included); the prompt shows that conf
              cut to 4,000 characters.

For contrast, a naive replan that pastes the full outputs into the prompt (the replan prompt plus a
"full outputs" section) is sent with the same client settings. Printed per size: prompt tokens (server
count) and prompt characters of each request, the time to build the messages, and the replan/full ratio.
Target: the replan prompt stays flat as the outputs grow.

Run::

    .venv/bin/python bench/replan_tokens.py [--sizes 1e3 1e5 1e6 1e7]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dags"))  # the demo's tools: plan_demo

from _planbench import load_note

from airflow_plan_provider.dag_factory import plan_params
from airflow_plan_provider.plan.budgets import Budgets
from airflow_plan_provider.plan.model import Plan
from airflow_plan_provider.plan.result import summarize
from airflow_plan_provider.plan.session import LockedOutput, SessionState
from airflow_plan_provider.plan.validate import Limits
from airflow_plan_provider.planners.base import LockedNode, PlanRequest
from airflow_plan_provider.planners.llm import LLMPlanner
from airflow_plan_provider.planners.llm_prompt import build_messages, encode_reply
from airflow_plan_provider.testing.openai_server import OpenAITestServer, count_tokens
from plan_demo.tools import registry

GOAL = "find why the payment API got slow yesterday"
SVC = {"service": "payment-api", "day": "yesterday"}
PLAN = {
    "goal": GOAL,
    "nodes": [
        {"id": "1", "action": "query latency metrics", "tool": "query_metrics", "params": SVC},
        {"id": "2", "action": "query dependency health", "tool": "query_service_health", "params": SVC},
        {"id": "3", "action": "query deploy records", "tool": "query_deploys", "params": SVC},
        {"id": "4", "action": "query error logs", "tool": "query_error_logs", "params": SVC},
        {
            "id": "5",
            "action": "correlate latency with the deploy",
            "tool": "analyze_correlation",
            "params": {"latency": "${1}", "against": "${3}", "label": "deploys"},
        },
        {
            "id": "6",
            "action": "write the report",
            "tool": "write_report",
            "params": {"goal": GOAL, "finding": "${5}", "metrics": "${1}", "errors": "${4}"},
        },
    ],
    "edges": [{"from": "2", "to": "5", "optional": True}, {"from": "4", "to": "6", "optional": True}],
}
REPLACEMENT = {
    "goal": GOAL,
    "nodes": [
        {
            "id": "5",
            "action": "correlate latency with dependency health",
            "tool": "analyze_correlation",
            "params": {"latency": "${1}", "against": "${2}", "label": "dependency health"},
        },
        PLAN["nodes"][5],
    ],
    "edges": [],
}
LOCKED = ("1", "2", "3", "4")
ERROR = "node 5 requested a replan: query_deploys found no deploy on that day"


def output_of(node: str, size: int) -> dict[str, Any]:
    """A log-like output of about ``size`` characters of JSON."""
    rows: list[str] = []
    total, i = 40, 0
    while total < size:
        row = (
            f"2026-11-28T{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z payment-api node {node} "
            f"GET /v1/charge p99 {800 + i % 97} ms upstream fraud-check status 200 trace {i:08x}"
        )
        rows.append(row)
        total += len(row) + 4
        i += 1
    return {"node": node, "rows": rows}


def requests_for(total: int, tools: Any) -> tuple[PlanRequest, PlanRequest, PlanRequest, dict[str, Any], int]:
    outputs = {n: output_of(n, total // len(LOCKED)) for n in LOCKED}
    limits = Limits(max_nodes=200)
    params = {k: p.value for k, p in plan_params(GOAL, Budgets()).items()}  # the DAG's Params (defaults)
    first_conf = {**params, "goal": GOAL}
    full = PlanRequest(goal=GOAL, tools=tools, limits=limits, conf=first_conf)
    current = Plan.model_validate(PLAN)
    summaries = {n: summarize(outputs[n]) for n in LOCKED}
    locked = tuple(
        LockedNode(id=n, action=current.node(n).action, tool=current.node(n).tool, summary=summaries[n])
        for n in LOCKED
    )
    replan_fields = {
        "current_plan": current,
        "locked": locked,
        "failed_node": "5",
        "last_error": ERROR,
        "affected": ("5", "6"),
        "revision": 1,
    }
    replan = PlanRequest(goal=GOAL, tools=tools, limits=limits, conf=first_conf, **replan_fields)
    # What a replan run's PlanOperator sees: conf = {goal, session} (finalize's replan_conf) over the Params.
    session = SessionState(
        goal=GOAL,
        root_run_id="manual__2026-11-29T00:00:00+00:00",
        run_ids=["manual__2026-11-29T00:00:00+00:00", "manual__2026-11-29T00:00:00+00:00__replan_1"],
        revision=1,
        locked={
            n: LockedOutput(
                action=current.node(n).action,
                tool=current.node(n).tool,
                params=current.node(n).params,
                output=outputs[n],
                summary=summaries[n],
            )
            for n in LOCKED
        },
        current_plan=PLAN,
        replan_requested=["5"],
        last_error=ERROR,
    )
    session_json = session.model_dump(mode="json")
    operator_conf = {**params, "goal": GOAL, "session": session_json}
    replan_op = PlanRequest(goal=GOAL, tools=tools, limits=limits, conf=operator_conf, **replan_fields)
    return full, replan, replan_op, outputs, len(json.dumps(session_json))


def human(size: float, digits: int = 0) -> str:
    return f"{size / 1e6:.{digits}f} MB" if size >= 1e6 else f"{size / 1e3:.{digits}f} KB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[1e3, 1e5, 1e6, 1e7])
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes]

    for name in ("airflow_plan_provider", "httpx", "httpx2", "openai"):  # keep the table readable
        logging.getLogger(name).setLevel(logging.WARNING)
    plan_reply = json.loads(encode_reply(json.dumps(PLAN)))
    replan_reply = json.loads(encode_reply(json.dumps(REPLACEMENT)))
    rows = []
    with OpenAITestServer() as server:
        planner = LLMPlanner(base_url=server.base_url, api_key="sk-bench", model="test-model", timeout=120)
        client = openai.OpenAI(base_url=server.base_url, api_key="sk-bench", timeout=120, max_retries=0)
        for size in sizes:
            full, replan, replan_op, outputs, session_chars = requests_for(size, registry)
            measured: dict[str, tuple[int, int, float]] = {}
            for name, request, reply in (
                ("full", full, plan_reply),
                ("replan", replan, replan_reply),
                ("replan_op", replan_op, replan_reply),
            ):
                t0 = time.perf_counter()
                messages = build_messages(request)
                build_ms = (time.perf_counter() - t0) * 1000
                server.reply(reply)
                usage = planner.plan(request).usage
                chars = len(server.chat_requests[-1].text)
                measured[name] = (usage["prompt_tokens"], chars, build_ms)
                assert usage["prompt_tokens"] == sum(count_tokens(m["content"]) for m in messages)
            # naive: the replan prompt plus every locked output in full
            t0 = time.perf_counter()
            naive = build_messages(replan)
            naive[-1] = {
                **naive[-1],
                "content": naive[-1]["content"]
                + "\n\nFull outputs of the locked nodes:\n"
                + "\n".join(f"- {n}: {json.dumps(outputs[n])}" for n in LOCKED),
            }
            build_ms = (time.perf_counter() - t0) * 1000
            server.reply(replan_reply)
            completion = client.chat.completions.create(model="test-model", messages=naive, temperature=0)  # type: ignore[arg-type]
            assert completion.usage is not None
            measured["naive"] = (completion.usage.prompt_tokens, len(server.chat_requests[-1].text), build_ms)
            output_chars = sum(len(json.dumps(o)) for o in outputs.values())
            rows.append((size, output_chars, session_chars, measured))

    print(
        f"\nReplan prompt vs. full-plan prompt as the locked outputs grow (4 locked nodes of the demo plan, "
        f"demo tool catalog); {time.strftime('%Y-%m-%d')}, 2-core machine; {load_note()}"
    )
    print(
        "tokens = the OpenAI test server's count (whitespace-separated words); chars = prompt characters; "
        "ms = time to build the messages\n"
    )
    head = "  {:>8} {:>10} | {:>15} | {:>15} | {:>15} | {:>19} | {:>8} {:>8} {:>9}"
    print(
        head.format(
            "outputs",
            "out chars",
            "full plan",
            "replan",
            "replan (operator)",
            "naive replan",
            "replan/",
            "naive/",
            "op. build",
        )
    )
    print(
        head.format(
            "",
            "",
            "tokens   chars",
            "tokens   chars",
            "tokens   chars",
            "tokens      chars",
            "full",
            "full",
            "ms",
        )
    )
    for size, output_chars, _session, m in rows:
        label = human(size)
        cells = []
        for name in ("full", "replan", "replan_op"):
            tokens, chars, _ms = m[name]
            cells.append(f"{tokens:>6} {chars:>8}")
        print(
            f"  {label:>8} {output_chars:>10} | {cells[0]:>15} | {cells[1]:>15} | {cells[2]:>15} | "
            f"{m['naive'][0]:>8} {m['naive'][1]:>10} | {m['replan'][0] / m['full'][0]:>8.2f} "
            f"{m['naive'][0] / m['full'][0]:>8.1f} {m['replan_op'][2]:>9.1f}"
        )
    first, last = rows[0][3], rows[-1][3]
    print(
        f"\n  replan tokens from {human(rows[0][0])} to {human(rows[-1][0])} of outputs: "
        f"{first['replan'][0]} → {last['replan'][0]} "
        f"({(last['replan'][0] - first['replan'][0]) / first['replan'][0]:+.1%}); "
        f"operator-built: {first['replan_op'][0]} → {last['replan_op'][0]} "
        f"({(last['replan_op'][0] - first['replan_op'][0]) / first['replan_op'][0]:+.1%}); "
        f"naive: {first['naive'][0]} → {last['naive'][0]} (x{last['naive'][0] / first['naive'][0]:.0f})"
    )
    print(
        "  session JSON carried in the replan run's conf (outputs → conf size): "
        + ", ".join(f"{human(s)} → {human(c, 2)}" for s, _o, c, _m in rows)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
