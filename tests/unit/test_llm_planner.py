"""LLMPlanner against a real HTTP server speaking the OpenAI wire format, through the real openai client."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_plan_provider.exceptions import PlanningError
from airflow_plan_provider.hooks.llm import NO_KEY, PlanLLMHook, base_url_from
from airflow_plan_provider.plan.model import Plan, ValidatedPlan
from airflow_plan_provider.plan.validate import Limits, validate_plan
from airflow_plan_provider.planners.base import LockedNode, PlanningOutcome, PlanRequest, plan_with_repairs
from airflow_plan_provider.planners.llm import LLMPlanner
from airflow_plan_provider.planners.llm_prompt import decode_reply
from airflow_plan_provider.planners.llm_reply import strip_fence
from airflow_plan_provider.problems import Problem
from airflow_plan_provider.testing.openai_server import OpenAITestServer, count_tokens
from airflow_plan_provider.tools.registry import ToolRegistry

API_KEY = "sk-test-5ecr3t-Zq81xK"
LIMITS = Limits(max_nodes=10)


def make_tools() -> ToolRegistry:
    tools = ToolRegistry()

    @tools.tool(description="Latency percentiles of a service for one day")
    def query_metrics(service: str, day: str) -> dict[str, Any]:
        return {}

    @tools.tool(description="Write a report from findings")
    def write_report(findings: Any, title: str = "report") -> str:
        return ""

    return tools


TOOLS = make_tools()


def wire_node(
    node_id: str, tool: str, params: dict[str, Any], deps: list[str] | None = None
) -> dict[str, Any]:
    """A node as a model writes it under the strict schema (params JSON-encoded)."""
    return {
        "id": node_id,
        "action": f"step {node_id}",
        "tool": tool,
        "params": json.dumps(params),
        "expected_outcome": None,
        "dependencies": deps,
    }


def good_plan() -> dict[str, Any]:
    return {
        "goal": "find the slow service",
        "nodes": [
            wire_node("1", "query_metrics", {"service": "api", "day": "2024-05-01"}),
            wire_node("2", "query_metrics", {"service": "db", "day": "2024-05-01"}),
            wire_node("3", "write_report", {"findings": ["${1}", "${2.p99}"]}),
        ],
        "edges": [{"from": "1", "to": "3", "optional": False}, {"from": "2", "to": "3", "optional": True}],
    }


def cyclic_plan() -> dict[str, Any]:
    return {
        "goal": "find the slow service",
        "nodes": [
            wire_node("alpha", "query_metrics", {"service": "api", "day": "x"}, deps=["gamma"]),
            wire_node("beta", "query_metrics", {"service": "db", "day": "x"}, deps=["alpha"]),
            wire_node("gamma", "write_report", {"findings": "${beta}"}),
        ],
        "edges": [],
    }


def request(**changes: Any) -> PlanRequest:
    base: dict[str, Any] = {"goal": "find the slow service", "tools": TOOLS, "limits": LIMITS}
    return PlanRequest(**{**base, **changes})


def run(planner: LLMPlanner, req: PlanRequest | None = None, repairs: int = 2) -> PlanningOutcome:
    def finish(raw: Any) -> ValidatedPlan:
        return validate_plan(raw, TOOLS, LIMITS)

    return plan_with_repairs(planner, req or request(), finish=finish, repair_attempts=repairs)


@pytest.fixture
def server() -> Iterator[OpenAITestServer]:
    with OpenAITestServer() as srv:
        yield srv


def planner_for(server: OpenAITestServer, **kwargs: Any) -> LLMPlanner:
    options: dict[str, Any] = {"base_url": server.base_url, "api_key": API_KEY, "model": "test-model"}
    options.update(max_retries=0, timeout=5.0)
    return LLMPlanner(**{**options, **kwargs})


def test_valid_plan_on_first_reply(server: OpenAITestServer) -> None:
    server.reply(good_plan())
    outcome = run(planner_for(server), request(conf={"day": "2024-05-01", "team": "payments"}))

    assert outcome.attempts == 1
    assert outcome.plan.layers == [["1", "2"], ["3"]]
    assert outcome.plan.node("3").params == {"findings": ["${1}", "${2.p99}"]}
    assert outcome.plan.soft_edges == [("2", "3")]
    [sent] = server.chat_requests
    body = sent.body
    assert body["model"] == "test-model"
    assert body["temperature"] == 0
    fmt = body["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
    schema = fmt["json_schema"]["schema"]
    node_schema = schema["properties"]["nodes"]["items"]
    assert node_schema["additionalProperties"] is False
    assert set(node_schema["required"]) == set(node_schema["properties"])
    assert node_schema["properties"]["params"]["type"] == "string"
    assert node_schema["properties"]["tool"]["enum"] == ["query_metrics", "write_report"]
    assert schema["properties"]["edges"]["items"]["required"] == ["from", "to", "optional"]
    system, user = sent.messages
    assert system["role"] == "system" and user["role"] == "user"
    assert "query_metrics: Latency percentiles of a service for one day" in system["content"]
    assert '"service":{"title":"Service","type":"string"}' in system["content"]
    assert "at most 10 nodes" in system["content"] and "layers" not in system["content"]
    assert "${ID.field" in system["content"] and '"optional": true' in system["content"]
    assert "Goal: find the slow service" in user["content"]
    assert '"team": "payments"' in user["content"]


def test_fenced_reply_is_accepted(server: OpenAITestServer) -> None:
    server.reply("Here is the plan:\n```json\n" + json.dumps(good_plan(), indent=2) + "\n```\n")
    outcome = run(planner_for(server))
    assert outcome.attempts == 1
    assert outcome.plan.node_ids == ["1", "2", "3"]


def test_malformed_json_is_repaired(server: OpenAITestServer) -> None:
    server.reply('{"nodes": [{"id": "1", "action": "q"').reply(good_plan())
    outcome = run(planner_for(server))

    assert outcome.attempts == 2
    assert outcome.rejected[0][0]["code"] == "schema"
    first, second = server.chat_requests
    assert len(first.messages) == 2
    assistant, problems = second.messages[2:]
    assert assistant == {"role": "assistant", "content": '{"nodes": [{"id": "1", "action": "q"'}
    assert problems["role"] == "user"
    assert "[schema] plan is not valid JSON" in problems["content"]
    assert "corrected full plan" in problems["content"]


def test_cycle_is_repaired_and_the_repair_names_the_cycle(server: OpenAITestServer) -> None:
    server.reply(cyclic_plan()).reply(good_plan())
    outcome = run(planner_for(server))

    assert outcome.attempts == 2
    assert [p["code"] for p in outcome.rejected[0]] == ["cycle"]
    repair = server.chat_requests[1].messages[-1]["content"]
    assert "[cycle]" in repair
    for node_id in ("alpha", "beta", "gamma"):
        assert node_id in repair
    # the previous reply goes back in the wire form (params JSON-encoded), as the model wrote it
    previous = json.loads(server.chat_requests[1].messages[2]["content"])
    assert previous["nodes"][2]["params"] == json.dumps({"findings": "${beta}"})


def test_exhausted_repairs_raise_with_every_problem(server: OpenAITestServer) -> None:
    bad = {"nodes": [wire_node("1", "no_such_tool", {}), wire_node("2", "query_metrics", {"service": 1})]}
    for _ in range(3):
        server.reply(bad)
    with pytest.raises(PlanningError) as caught:
        run(planner_for(server), repairs=2)

    assert caught.value.reason == "invalid_plan"
    codes = sorted(p.code for p in caught.value.problems)
    assert codes == ["bad_params", "bad_params", "unknown_tool"]
    assert "no_such_tool" in str(caught.value) and "3 attempt(s)" in str(caught.value)
    assert len(server.chat_requests) == 3
    assert "[unknown_tool]" in server.chat_requests[2].messages[-1]["content"]


def test_rate_limit_with_retry_after_is_retried(server: OpenAITestServer) -> None:
    server.error(429, retry_after=0.4).reply(good_plan())
    started = time.monotonic()
    outcome = run(planner_for(server, max_retries=2))

    assert outcome.attempts == 1
    assert len(server.chat_requests) == 2
    assert time.monotonic() - started >= 0.4


def test_rate_limit_exhausted_names_status_and_endpoint(server: OpenAITestServer) -> None:
    body = {"error": {"message": "Rate limit reached for test-model", "type": "rate_limit"}}
    for _ in range(2):
        server.error(429, body=body, retry_after=0.05)
    with pytest.raises(PlanningError) as caught:
        run(planner_for(server, max_retries=1))

    assert caught.value.reason == "planner_unavailable"
    text = str(caught.value)
    assert server.base_url in text and "HTTP 429" in text and "Rate limit reached" in text
    assert "retried up to 1 time(s)" in text
    assert len(server.chat_requests) == 2


def test_slow_server_times_out_with_clear_error(server: OpenAITestServer) -> None:
    server.delay(3).reply(good_plan())
    with pytest.raises(PlanningError) as caught:
        run(planner_for(server, timeout=0.5))

    assert caught.value.reason == "planner_unavailable"
    assert "timed out after 0.5s" in str(caught.value) and server.base_url in str(caught.value)


def test_planning_timeout_bounds_the_client_retries(server: OpenAITestServer) -> None:
    server.error(429, retry_after=5).reply(good_plan())
    with pytest.raises(PlanningError) as caught:
        run(planner_for(server, max_retries=1, planning_timeout=1.0))

    # the client would have retried after 5 s and got the plan: the planning timeout ended the call first
    assert "planning timeout of 1s" in str(caught.value)


def test_falls_back_to_json_object_when_json_schema_is_rejected() -> None:
    with OpenAITestServer(reject_json_schema=True) as server:
        server.reply("{not json").reply(good_plan())
        planner = planner_for(server)
        outcome = run(planner)

    assert outcome.attempts == 2
    formats = [r.body.get("response_format", {}).get("type") for r in server.chat_requests]
    assert formats == ["json_schema", "json_object", "json_object"]
    assert planner.response_format == "json_object"


def test_other_bad_requests_do_not_fall_back(server: OpenAITestServer) -> None:
    server.error(400, body={"error": {"message": "model 'test-model' does not exist", "type": "invalid"}})
    planner = planner_for(server)
    with pytest.raises(PlanningError) as caught:
        run(planner)
    assert "HTTP 400: model 'test-model' does not exist" in str(caught.value)
    assert planner.response_format == "json_schema" and len(server.chat_requests) == 1


def test_replan_prompt_has_locked_summaries_and_error_but_not_large_outputs(server: OpenAITestServer) -> None:
    huge = "ROW," * 5000
    current = Plan.model_validate(
        {
            "goal": "find the slow service",
            "nodes": [
                {"id": "1", "action": "query api", "tool": "query_metrics", "params": {"service": "api"}},
                {"id": "2", "action": "report", "tool": "write_report", "params": {"findings": huge}},
            ],
            "edges": [{"from": "1", "to": "2"}],
        }
    )
    replan = request(
        current_plan=current,
        locked=(LockedNode("1", "query api", "query_metrics", "p99=840ms over 1440 samples"),),
        failed_node="2",
        last_error="PermanentToolError: report template 'weekly' not found",
        affected=("2",),
        revision=1,
    )
    replacement = {"nodes": [wire_node("2b", "write_report", {"findings": "${1}"}, deps=["1"])], "edges": []}
    server.reply(replacement)
    reply = planner_for(server).plan(replan)

    assert json.loads(str(reply.plan))["nodes"][0]["params"] == {"findings": "${1}"}
    prompt = server.chat_requests[0].text
    assert "p99=840ms over 1440 samples" in prompt
    assert "report template 'weekly' not found" in prompt
    assert "Failed node: 2" in prompt and "Affected nodes, to be replaced: 2" in prompt
    assert "replacement subgraph" in prompt and "revision 1" in prompt
    assert huge not in prompt and "ROW," * 100 not in prompt
    assert "[20000 chars, cut]" in prompt
    assert len(prompt) < 10_000


def test_replan_repair_asks_for_the_replacement_subgraph(server: OpenAITestServer) -> None:
    current = Plan.model_validate({"nodes": [{"id": "1", "action": "a", "tool": "query_metrics"}]})
    problem = Problem("empty_plan", "plan has no nodes", path="nodes")
    req = request(current_plan=current, affected=("1",), previous_reply='{"nodes": []}', problems=(problem,))
    server.reply({"nodes": []})
    planner_for(server).plan(req)

    messages = server.chat_requests[0].messages
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[2]["content"] == '{"nodes": []}'
    assert "[empty_plan] plan has no nodes; at nodes" in messages[3]["content"]
    assert "corrected full replacement subgraph" in messages[3]["content"]


def test_usage_is_returned(server: OpenAITestServer) -> None:
    content = json.dumps(good_plan())
    server.reply("not json at all").reply(content)
    outcome = run(planner_for(server))

    first, second = server.chat_requests
    assert outcome.usage == [
        {"prompt_tokens": count_tokens(first.text), "completion_tokens": 4},
        {"prompt_tokens": count_tokens(second.text), "completion_tokens": count_tokens(content)},
    ]
    assert outcome.usage[1]["prompt_tokens"] > outcome.usage[0]["prompt_tokens"] > 100


def test_api_key_never_leaks(server: OpenAITestServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    for name in ("openai", "httpx", "httpx2", "httpcore", "httpcore2", "airflow_plan_provider"):
        logging.getLogger(name).setLevel(logging.DEBUG)
    server.reply("{broken").reply(good_plan())
    # the server echoes the key in its error body, as some proxies do
    echo = {"error": {"message": f"upstream refused key {API_KEY}", "type": "server_error"}}
    server.error(500, body=echo).error(500, body=echo)
    planner = planner_for(server, max_retries=1)
    run(planner)
    with pytest.raises(PlanningError) as caught:
        run(planner)

    assert len(server.chat_requests) == 4
    # the key was sent where it belongs, and only there
    assert all(r.headers.get("authorization") == f"Bearer {API_KEY}" for r in server.chat_requests)
    for sent in server.chat_requests:
        assert API_KEY not in json.dumps(sent.body)
    assert "upstream refused key ***" in str(caught.value)
    assert API_KEY not in str(caught.value) and API_KEY not in repr(caught.value)
    assert API_KEY not in repr(planner)
    assert caplog.records, "nothing was logged: the check below would prove nothing"
    for record in caplog.records:
        assert API_KEY not in record.getMessage()
    assert API_KEY not in caplog.text


def test_planner_is_built_without_network_or_secret_and_reads_the_connection_late(
    monkeypatch: pytest.MonkeyPatch, server: OpenAITestServer
) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_PLAN_LLM_DEFAULT", raising=False)
    planner = LLMPlanner()  # what a DAG file does at parse time
    assert planner.uses_connection and server.requests == []
    with pytest.raises(PlanningError) as caught:
        planner.plan(request())
    assert caught.value.reason == "planner_unavailable" and "plan_llm_default" in str(caught.value)

    conn = {"conn_type": "plan_llm", "host": server.base_url, "password": API_KEY, "extra": {"model": "m-1"}}
    monkeypatch.setenv("AIRFLOW_CONN_PLAN_LLM_DEFAULT", json.dumps(conn))
    server.reply(good_plan())
    outcome = run(LLMPlanner(max_retries=0))
    assert outcome.plan.node_ids == ["1", "2", "3"]
    [sent] = server.chat_requests
    assert sent.body["model"] == "m-1" and sent.headers["authorization"] == f"Bearer {API_KEY}"


def test_connection_without_model_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_LLM_NO_MODEL", json.dumps({"conn_type": "plan_llm", "host": "h.invalid"})
    )
    with pytest.raises(PlanningError, match="no model"):
        LLMPlanner(conn_id="llm_no_model").plan(request())


def test_hook_reads_the_connection_and_tests_it_for_free(
    monkeypatch: pytest.MonkeyPatch, server: OpenAITestServer
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    conn = {
        "conn_type": "plan_llm",
        "host": server.base_url,
        "extra": {"model": "test-model", "project": "p"},
    }
    monkeypatch.setenv("AIRFLOW_CONN_LLM_A", json.dumps(conn))
    hook = PlanLLMHook("llm_a")
    assert hook.settings.base_url == server.base_url and hook.settings.api_key == NO_KEY
    assert hook.get_conn() is hook.get_conn()
    ok, message = hook.test_connection()
    assert ok, message
    assert "'test-model' is available" in message
    assert [r.path for r in server.requests] == ["/v1/models"]  # no completion, no tokens

    monkeypatch.setenv("AIRFLOW_CONN_LLM_B", json.dumps({**conn, "extra": {"model": "other"}}))
    ok, message = PlanLLMHook("llm_b").test_connection()
    assert not ok and "does not list model 'other'" in message


def test_base_url_from_connection_fields() -> None:
    assert base_url_from("https://api.example.com/v1/") == "https://api.example.com/v1"
    assert base_url_from("llm.internal", "http", 8000) == "http://llm.internal:8000/v1"
    assert base_url_from("llm.internal/openai/v1") == "https://llm.internal/openai/v1"
    assert base_url_from("") is None


def test_strip_fence_and_decode() -> None:
    assert strip_fence('```\n{"a": 1}\n```') == '{"a": 1}'
    assert strip_fence('  {"a": "```"}  ') == '{"a": "```"}'
    assert strip_fence("no json here") == "no json here"
    decoded = json.loads(decode_reply(json.dumps({"nodes": [{"id": "1", "params": ""}, {"params": "[1"}]})))
    assert decoded["nodes"] == [{"id": "1", "params": {}}, {"params": "[1"}]


def test_script_exhausted_answers_500(server: OpenAITestServer) -> None:
    with pytest.raises(PlanningError) as caught:
        run(planner_for(server))
    assert "HTTP 500" in str(caught.value) and "script is exhausted" in str(caught.value)


def test_server_runs_as_a_separate_process(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"delay": 0.1}, {"reply": good_plan()}]))
    record = tmp_path / "requests.jsonl"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "airflow_plan_provider.testing.openai_server",
            "--script",
            str(script),
            "--record",
            str(record),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        base_url = process.stdout.readline().strip()
        assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")
        planner = LLMPlanner(base_url=base_url, api_key=API_KEY, model="test-model", max_retries=0)
        outcome = run(planner)
        assert outcome.plan.node_ids == ["1", "2", "3"]
        lines = [json.loads(line) for line in record.read_text().splitlines()]
        assert [line["path"] for line in lines] == ["/v1/chat/completions"]
        assert "Goal: find the slow service" in lines[0]["body"]["messages"][1]["content"]
    finally:
        process.terminate()
        assert process.wait(timeout=10) == 0
