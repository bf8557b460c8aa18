"""LLMPlanner against hostile or broken endpoints, through the real OpenAI test server and client.

Every reply shape ends as a valid plan or a ``PlanningError`` naming what was wrong; bad token counts
are unknown, never fatal; no 8-character piece of the API key reaches an error, a log record or a
warning; what goes back to the model in a repair request stays small whatever the model sent.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_plan_provider.contract import FINALIZE_TASK, PLAN_TASK, PLANNING_ERROR_KEY
from airflow_plan_provider.exceptions import PlanningError
from airflow_plan_provider.hooks.llm import PlanLLMHook
from airflow_plan_provider.planners.llm import LLMPlanner
from airflow_plan_provider.problems import Problem
from airflow_plan_provider.testing.openai_server import OpenAITestServer, chat_completion
from tests.unit.test_llm_planner import good_plan, planner_for, request, run, wire_node

KEY = "sk-proj-Q7vN2pLx9RkT4wZb8YcJ3mHs6FdG1aEu5KoWqVr0XyIiPl"


def leaked(text: str, key: str = KEY) -> list[str]:
    """Every 8-character piece of ``key`` found in ``text``."""
    return [key[i : i + 8] for i in range(len(key) - 7) if key[i : i + 8] in text]


def completion(**changes: Any) -> dict[str, Any]:
    """A well-formed completion of the good plan, with top-level fields replaced."""
    return {**chat_completion(json.dumps(good_plan()), prompt_tokens=11), **changes}


def with_message(message: Any) -> dict[str, Any]:
    body = completion()
    body["choices"] = [{**body["choices"][0], "message": message}]
    return body


@pytest.fixture
def server() -> Iterator[OpenAITestServer]:
    with OpenAITestServer() as srv:
        yield srv


@pytest.fixture
def debug_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    for name in ("openai", "httpx", "httpx2", "httpcore", "httpcore2", "airflow_plan_provider"):
        logging.getLogger(name).setLevel(logging.DEBUG)
    return caplog


def assert_no_key_in_logs(caplog: pytest.LogCaptureFixture, key: str = KEY) -> None:
    assert caplog.records, "nothing was logged: the check below would prove nothing"
    for record in caplog.records:
        assert not leaked(record.getMessage(), key), record.getMessage()
    assert not leaked(caplog.text, key)


# ------------------------------------------------------------------ malformed replies (status 200)
# On the code before this check each of these escaped as the exception named in its comment.

MALFORMED = [
    # AttributeError: 'str' object has no attribute 'usage' (the client handed back the text)
    pytest.param(
        b"<html><body><h1>502 Bad Gateway</h1></body></html>",
        "text/html",
        "reply is not JSON (text/html, 50 bytes): '<html><body><h1>502 Bad Gateway",
        id="html",
    ),
    # JSONDecodeError: Expecting value: line 1 column 1 (char 0)
    pytest.param(
        b"<html>upstream timed out</html>",
        "application/json",
        "reply is not JSON (application/json, 31 bytes): '<html>upstream timed out</html>'",
        id="html-labelled-json",
    ),
    # AttributeError: 'list' object has no attribute 'usage'
    pytest.param([completion()], "application/json", "reply is not a JSON object (it is a list)", id="list"),
    # AttributeError: 'str' object has no attribute 'message'
    pytest.param(
        completion(choices="abc"),
        "application/json",
        "choices is not a list (it is a string)",
        id="choices-str",
    ),
    # AttributeError: 'NoneType' object has no attribute 'refusal'
    pytest.param(
        with_message(None),
        "application/json",
        "choices[0].message is not an object (it is null)",
        id="message-null",
    ),
    # AttributeError: 'int' object has no attribute 'message'
    pytest.param(
        completion(choices=[7]),
        "application/json",
        "choices[0] is not an object (it is a number)",
        id="choice-int",
    ),
    # RecursionError: maximum recursion depth exceeded while decoding a JSON array from a unicode string
    pytest.param(
        b"[" * 5000 + b"]" * 5000,
        "application/json",
        "reply is nested too deeply to be a chat completion (10000 bytes)",
        id="nested-5000",
    ),
    # RecursionError, the same, from a completion whose "id" is nested 5000 deep
    pytest.param(
        json.dumps(completion(id="DEEP")).replace('"DEEP"', "[" * 5000 + "]" * 5000),
        "application/json",
        "reply is nested too deeply",
        id="nested-id-5000",
    ),
]


@pytest.mark.parametrize(("body", "content_type", "expected"), MALFORMED)
def test_malformed_reply_is_a_planning_error_naming_the_problem(
    server: OpenAITestServer, body: Any, content_type: str, expected: str
) -> None:
    server.raw(body, content_type=content_type)
    with pytest.raises(PlanningError) as caught:
        run(planner_for(server, max_retries=2))

    assert caught.value.reason == "planner_unavailable"
    text = str(caught.value)
    assert f"{server.base_url} (model 'test-model') sent a malformed reply: {expected}" in text
    assert len(server.chat_requests) == 1  # a 200 is an answer: neither retried nor "repaired"


def test_content_of_the_wrong_type_is_named(server: OpenAITestServer) -> None:
    server.raw(with_message({"role": "assistant", "content": {"nodes": []}}))
    with pytest.raises(
        PlanningError, match=r"choices\[0\]\.message\.content is not a string \(it is an object\)"
    ):
        run(planner_for(server))


def test_tokens_of_a_malformed_reply_are_kept(server: OpenAITestServer) -> None:
    server.raw(completion(choices={"0": "x"}, usage={"prompt_tokens": 5, "completion_tokens": 2}))
    with pytest.raises(PlanningError, match=r"choices is not a list \(it is an object\)") as caught:
        run(planner_for(server))
    assert caught.value.usage == [{"prompt_tokens": 5, "completion_tokens": 2}]


@pytest.mark.parametrize(
    ("usage", "known"),
    [
        ([1, 2], {}),  # AttributeError: 'list' object has no attribute 'prompt_tokens'
        ("abc", {}),  # AttributeError: 'str' object has no attribute 'prompt_tokens'
        (None, {}),  # accepted before as well
        ({"prompt_tokens": -3, "completion_tokens": "12"}, {}),  # "12" went on to int(), -3 was summed
        ({"prompt_tokens": 10**30, "completion_tokens": 7}, {"completion_tokens": 7}),
        ({"prompt_tokens": True, "completion_tokens": 2.5}, {}),
        ({"completion_tokens": 9}, {"completion_tokens": 9}),
    ],
    ids=["list", "string", "null", "negative-and-text", "absurd", "bool-and-float", "partial"],
)
def test_bad_usage_is_unknown_and_the_plan_is_kept(server: OpenAITestServer, usage: Any, known: dict) -> None:
    server.raw(completion(usage=usage))
    outcome = run(planner_for(server))

    assert outcome.plan.node_ids == ["1", "2", "3"]
    assert outcome.usage == ([known] if known else [])


def test_refusal_is_no_plan(server: OpenAITestServer) -> None:
    server.raw(with_message({"role": "assistant", "content": None, "refusal": "I cannot help with that."}))
    with pytest.raises(PlanningError) as caught:
        run(planner_for(server))
    assert caught.value.reason == "no_plan"
    assert str(caught.value) == "the model refused to plan: I cannot help with that."


def test_content_parts_and_lone_surrogates_are_read(server: OpenAITestServer) -> None:
    plan = good_plan()
    plan["nodes"][2]["action"] = "report @"
    text = json.dumps(plan).replace("@", "\ud800")  # a lone surrogate: valid JSON, but no UTF-8 carries it
    parts = [{"type": "text", "text": text[:40]}, {"type": "text", "text": text[40:]}]
    server.raw(with_message({"role": "assistant", "content": parts}))
    outcome = run(planner_for(server))
    assert outcome.plan.node("3").action == "report ?"


def test_escaped_lone_surrogate_in_the_plan_does_not_break_the_repair_request(
    server: OpenAITestServer,
) -> None:
    # found by tests/unit/test_fuzz_llm.py; before: "UnicodeEncodeError: 'utf-8' codec can't encode character
    # '\\ud800'" while sending the repair request that quoted the problem "unknown top-level field"
    server.reply('{"\\ud800": null, "nodes": []}').reply(good_plan())
    outcome = run(planner_for(server))

    assert outcome.attempts == 2
    assert "unknown top-level field '?'" in server.chat_requests[1].text


def test_content_nested_5000_deep_is_a_schema_problem_the_model_repairs(server: OpenAITestServer) -> None:
    # before: RecursionError from decode_reply, and again from encode_reply for the repair request
    server.reply("[" * 5000 + "]" * 5000).reply(good_plan())
    outcome = run(planner_for(server))

    assert outcome.attempts == 2
    assert outcome.rejected[0][0]["code"] == "schema"
    assert "nested too deeply" in server.chat_requests[1].messages[-1]["content"]


# ------------------------------------------------------------------------------- the API key
def test_401_quoting_the_key_after_270_characters_leaks_no_piece_of_it(
    server: OpenAITestServer, debug_logs: pytest.LogCaptureFixture
) -> None:
    # before: the message was cut to 300 characters and only then masked, leaving "sk-proj-Q7vN2pLx9..."
    message = "x" * 270 + f" {KEY} is not a valid API key"
    server.error(401, body={"error": {"message": message, "type": "invalid_request_error"}})
    with pytest.raises(PlanningError) as caught:
        run(planner_for(server, api_key=KEY))

    text = str(caught.value)
    assert caught.value.reason == "planner_unavailable"
    assert "HTTP 401: " + "x" * 270 + " ***" in text
    assert not leaked(text) and not leaked(repr(caught.value))
    assert_no_key_in_logs(debug_logs)


def test_401_with_the_key_partly_masked_by_the_endpoint_leaks_no_piece_of_it(
    server: OpenAITestServer, debug_logs: pytest.LogCaptureFixture
) -> None:
    # the form OpenAI itself uses: the key's first and last characters around stars
    message = f"Incorrect API key provided: {KEY[:12]}{'*' * 20}{KEY[-9:]}."
    server.error(401, body={"error": {"message": message, "type": "invalid_request_error"}})
    with pytest.raises(PlanningError) as caught:
        run(planner_for(server, api_key=KEY))

    assert "Incorrect API key provided: ***" in str(caught.value)
    assert not leaked(str(caught.value))
    assert_no_key_in_logs(debug_logs)


def test_400_about_response_format_quoting_the_key_leaks_nothing_into_the_warning(
    server: OpenAITestServer, debug_logs: pytest.LogCaptureFixture
) -> None:
    # before: "... rejected response_format json_schema (... key sk-proj-Q7vN2pLx9...); using json_object"
    message = f"Invalid 'response_format': json_schema is not supported for the key {KEY}"
    server.error(400, body={"error": {"message": message, "param": "response_format"}}).reply(good_plan())
    planner = planner_for(server, api_key=KEY)
    outcome = run(planner)

    assert outcome.attempts == 1 and planner.response_format == "json_object"
    [warning] = [r for r in debug_logs.records if "rejected response_format" in r.getMessage()]
    assert warning.levelno == logging.WARNING
    assert "is not supported for the key ***); using json_object" in warning.getMessage()
    assert_no_key_in_logs(debug_logs)


def test_refusal_and_malformed_replies_quoting_the_key_leak_nothing(
    server: OpenAITestServer, debug_logs: pytest.LogCaptureFixture
) -> None:
    # before: the refusal was cut to 500 characters and never masked
    server.raw(with_message({"role": "assistant", "content": None, "refusal": "r" * 490 + KEY}))
    server.raw(f"<html>{'h' * 100}{KEY}</html>", content_type="text/html")
    planner = planner_for(server, api_key=KEY)
    errors = []
    for _ in range(2):
        with pytest.raises(PlanningError) as caught:
            run(planner)
        errors.append(str(caught.value))

    assert errors[0].startswith("the model refused to plan: rrrr") and errors[1].startswith("LLM planner")
    assert [leaked(text) for text in errors] == [[], []]
    assert_no_key_in_logs(debug_logs)


def test_the_key_is_registered_with_the_secrets_masker(
    server: OpenAITestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.sdk.log import redact as airflow_redact

    given, from_env, in_extra = (f"sk-{kind}-{secrets.token_hex(12)}" for kind in ("given", "env", "extra"))
    LLMPlanner(base_url=server.base_url, api_key=given, model="m")
    assert airflow_redact(f"key={given}") == "key=***"

    monkeypatch.setenv("OPENAI_API_KEY", from_env)
    server.reply(good_plan())
    run(LLMPlanner(base_url=server.base_url, model="test-model", max_retries=0))
    assert server.chat_requests[0].headers["authorization"] == f"Bearer {from_env}"
    assert airflow_redact(f"key={from_env}") == "key=***"

    extra = {"model": "m", "openai_client_kwargs": {"api_key": in_extra}}
    monkeypatch.setenv("AIRFLOW_CONN_LLM_EXTRA_KEY", json.dumps({"conn_type": "plan_llm", "extra": extra}))
    assert PlanLLMHook("llm_extra_key").settings.api_key == in_extra
    assert airflow_redact(f"key={in_extra}") == "key=***"


def test_redact_removes_every_piece_of_the_key_before_cutting() -> None:
    from airflow_plan_provider.hooks.llm import redact

    text = f"{'a' * 295}{KEY} and {KEY[10:30]} and {KEY[-7:]}"
    assert redact(text, KEY, 400) == f"{'a' * 295}*** and *** and {KEY[-7:]}"
    assert redact(text, KEY) == f"{'a' * 295}*** a...[{len(text)} chars, cut]"
    assert redact(f"{KEY[:8]}|{KEY[3:10]}", KEY) == f"***|{KEY[3:10]}"  # 7 characters are not a leak
    assert redact("key=abc123!", "abc123") == "key=***!"  # a short key is redacted whole
    assert redact("key=no-key", "no-key") == "key=no-key"  # the placeholder is no secret
    huge = KEY * 200_000  # only the first 2 * limit + len(key) characters are looked at
    assert redact(huge, KEY, 50) == f"***...[{len(huge)} chars, cut]"


# --------------------------------------------------------------- what a repair request echoes
def test_huge_invalid_reply_is_echoed_by_summary(server: OpenAITestServer) -> None:
    huge = '{"goal": "g", "nodes": "' + "A" * 10_000_000  # 10 MB, not even closed
    server.reply(huge).reply(good_plan())
    outcome = run(planner_for(server, timeout=30.0))

    assert outcome.attempts == 2
    first, repair = server.chat_requests
    assert repair.size < first.size + 8_000  # before: the whole reply went back, 10 MB
    from airflow_plan_provider.planners.llm_prompt import MAX_PREVIOUS

    echoed = repair.messages[2]["content"]
    assert echoed == f"{huge[:MAX_PREVIOUS]}...[{len(huge)} chars, cut]"
    assert f"Your reply was {len(huge)} characters long; only its first {MAX_PREVIOUS}" in repair.text


def test_many_and_long_problems_are_listed_by_the_first_ones_and_a_count(server: OpenAITestServer) -> None:
    previous = json.dumps({"goal": "g", "nodes": [wire_node(f"n{i}", "nope", {}) for i in range(1_000)]})
    problems = [Problem("bad_params", "['" + "S" * 200_000 + "'] is not of type 'string'", ("big",))]
    problems += [
        Problem("unknown_tool", f"node 'n{i}' uses unknown tool 'nope'", (f"n{i}",)) for i in range(1_000)
    ]
    server.reply(good_plan()).reply(good_plan())
    planner = planner_for(server)
    planner.plan(request())
    planner.plan(request(previous_reply=previous, problems=tuple(problems)))

    first, repair = server.chat_requests
    assert repair.size < first.size + 20_000  # before: 140 kB of reply and every problem in full
    prompt = repair.messages[-1]["content"]
    assert prompt.startswith(f"Your reply was {len(previous)} characters long")
    assert "Your reply has 1001 problem(s):" in prompt
    assert "- [bad_params] ['SSSS" in prompt and "S" * 600 not in prompt
    assert prompt.count("\n- [") == 20 and "- [unknown_tool] node 'n18' " in prompt and "'n19'" not in prompt
    assert "- ... and 981 more problem(s)" in prompt


# --------------------------------------------------------------- the planning task (dag.test)
def all_xcom_text(dag_run: Any) -> str:
    """Every XCom value of the run, as one JSON text."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(XComModel).filter_by(dag_id=dag_run.dag_id, run_id=dag_run.run_id).all()
        values = [(row.task_id, row.key, XComModel.deserialize_value(row)) for row in rows]
    assert values, "no XCom at all: the check would prove nothing"
    return json.dumps(values, default=str)


@pytest.mark.airflow
@pytest.mark.parametrize(
    ("dag_id", "script", "reason", "expected"),
    [
        # before: the planning task failed with AttributeError; finalize said "planning did not finish"
        (
            "llm_choices_str",
            {"raw": completion(choices="abc")},
            "planner_unavailable",
            "choices is not a list",
        ),
        # before: "sk-proj-Q7vN2pLx9RkT4wZb" in the error, the planning_error XCom and the result
        (
            "llm_401_key",
            {"error": 401, "body": {"error": {"message": "x" * 270 + f" {KEY} is not valid"}}},
            "planner_unavailable",
            "HTTP 401: " + "x" * 270 + " ***",
        ),
    ],
)
def test_planning_task_records_the_reason_and_no_piece_of_the_key(
    server: OpenAITestServer,
    debug_logs: pytest.LogCaptureFixture,
    tmp_path: Path,
    dag_id: str,
    script: dict[str, Any],
    reason: str,
    expected: str,
) -> None:
    from airflow_plan_provider.dag_factory import build_plan_dag
    from airflow_plan_provider.testing import CallLog, scripted_registry
    from airflow_plan_provider.testing.in_process import run_plan_dag
    from harness.seed import seed_tools
    from tests.airflow.support import xcom

    server.add(script)
    planner = LLMPlanner(base_url=server.base_url, api_key=KEY, model="test-model", max_retries=0)
    dag = build_plan_dag(
        dag_id, planner=planner, tools=scripted_registry(*seed_tools(CallLog(tmp_path))), replan=False
    )
    dag_run = run_plan_dag(dag, {"goal": "find the slow service"})

    assert str(dag_run.state) == "failed"
    error = xcom(dag_run, PLAN_TASK, key=PLANNING_ERROR_KEY)
    assert error["reason"] == reason and expected in error["message"]
    result = xcom(dag_run, FINALIZE_TASK)
    assert (result["status"], result["reason"]) == ("failed", reason)
    assert expected in result["message"]
    assert not leaked(all_xcom_text(dag_run))
    assert_no_key_in_logs(debug_logs)
