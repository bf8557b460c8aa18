"""Hypothesis: whatever an endpoint sends back, LLMPlanner ends with a valid plan or a PlanningError.

Reply bodies (arbitrary JSON values, mutations of a valid completion, random bytes) are served by one
real OpenAI test server per test, scripted per example, and read by the real ``openai`` client.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from airflow_plan_provider.exceptions import PlanningError
from airflow_plan_provider.hooks.llm import redact
from airflow_plan_provider.plan.model import ValidatedPlan
from airflow_plan_provider.testing.openai_server import OpenAITestServer, chat_completion
from tests.unit.test_llm_planner import good_plan, planner_for, request, run

KEY = "sk-fuzz-Hq3Lm8Zt2Vb6Nc1Xw9Pk4Rj7Ys5Df0Ga"
PIECES = [KEY, KEY[:12], KEY[6:30], KEY[-9:], KEY[3:11]]
DEEP = "@@deep@@"  # replaced by a deeply nested array once the body is encoded
# No deadline: a timing is no test here (on a busy 2-core machine an example once took more than 5 s,
# and the failure report of an example holding a lone surrogate cannot cross pytest-xdist's channel,
# so a whole `make test` ended in an internal error instead).
FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

texts = st.one_of(
    st.text(max_size=40),
    st.sampled_from([*PIECES, "", "```json\n", "{", "\ud800", "null", DEEP]),
    st.integers(1_000, 100_000).map(lambda n: "x" * n),
    st.builds(lambda a, piece, b: a + piece + b, st.text(max_size=300), st.sampled_from(PIECES), st.text()),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80) | st.floats() | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12,
)
PLAN_TEXT = json.dumps(good_plan())
contents = st.one_of(
    st.just(PLAN_TEXT),
    st.just(f"Here it is:\n```json\n{PLAN_TEXT}\n```"),
    texts,
    json_values.map(lambda value: json.dumps(value)),
    st.builds(
        lambda field, value: json.dumps({**good_plan(), field: value}),
        st.sampled_from(["nodes", "edges", "goal"]),
        json_values,
    ),
)
PATHS: list[tuple[Any, ...]] = [
    (),
    ("choices",),
    ("choices", 0),
    ("choices", 0, "message"),
    ("choices", 0, "message", "content"),
    ("choices", 0, "message", "refusal"),
    ("choices", 0, "message", "role"),
    ("choices", 0, "finish_reason"),
    ("usage",),
    ("usage", "prompt_tokens"),
    ("usage", "completion_tokens"),
    ("id",),
    ("model",),
]
mutations = st.lists(
    st.tuples(st.sampled_from(PATHS), st.sampled_from(["remove", "retype", "nest", "deep"]), json_values),
    max_size=3,
)


_MISSING = object()


def _child(container: Any, step: Any) -> Any:
    if isinstance(container, dict) and isinstance(step, str):
        return container.get(step, _MISSING)
    if isinstance(container, list) and isinstance(step, int) and step < len(container):
        return container[step]
    return _MISSING


def mutate(body: Any, path: tuple[Any, ...], how: str, value: Any) -> Any:
    """``body`` with the value at ``path`` removed, replaced by ``value``, wrapped, or made deep
    (unchanged when an earlier mutation already took ``path`` away)."""
    if not path:
        return {"remove": {}, "retype": value, "nest": [body], "deep": DEEP}[how]
    *steps, last = path
    parent = body
    for step in steps:
        parent = _child(parent, step)
    if _child(parent, last) is _MISSING:
        return body
    if how == "remove":
        del parent[last]
    else:
        parent[last] = {"retype": value, "nest": {"value": parent[last]}, "deep": DEEP}[how]
    return body


@st.composite
def completions(draw: st.DrawFn) -> bytes:
    body: Any = chat_completion(draw(contents), prompt_tokens=draw(st.integers(0, 5000)))
    body["choices"][0]["message"]["refusal"] = draw(st.none() | st.none() | st.none() | texts)
    for path, how, value in draw(mutations):
        body = mutate(copy.deepcopy(body), path, how, value)
    depth = draw(st.integers(1, 6000))
    return json.dumps(body).replace(json.dumps(DEEP), "[" * depth + "]" * depth).encode()


bodies = st.one_of(
    completions(),
    json_values.map(lambda value: json.dumps(value).encode()),
    st.binary(max_size=400),
)


def leaked(text: str) -> list[str]:
    return [KEY[i : i + 8] for i in range(len(KEY) - 7) if KEY[i : i + 8] in text]


def test_every_reply_ends_as_a_valid_plan_or_a_planning_error() -> None:
    with OpenAITestServer() as server:
        good = chat_completion(PLAN_TEXT)
        planners = [
            planner_for(server, api_key=KEY)
        ]  # one client for all examples: creating one costs ~0.1 s

        @FUZZ
        @given(
            body=bodies,
            status=st.sampled_from([200] * 6 + [400, 401, 404, 422, 500]),
            content_type=st.sampled_from(["application/json", "text/html", "text/plain", ""]),
        )
        def check(body: bytes, status: int, content_type: str) -> None:
            # the reply under test, then a good plan for a repair (or a response_format fallback)
            server.reset().raw(body, status=status, content_type=content_type).raw(good)
            if planners[-1].response_format != "json_schema":  # an earlier 400 made it fall back
                planners.append(planner_for(server, api_key=KEY))
            try:
                outcome = run(planners[-1], request(), repairs=1)
            except PlanningError as error:
                event(f"PlanningError {error.reason}")
                text = str(error)
                assert not leaked(text), text
                if error.reason == "no_plan":
                    assert text.startswith("the model refused to plan: ")
                else:
                    assert error.reason == "planner_unavailable", text
                    # from the reply under test: a malformed 200, or the error status itself
                    said = "sent a malformed reply: " if status == 200 else f"HTTP {status}: "
                    assert said in text, text
                usage = error.usage
            else:
                event(f"valid plan after {outcome.attempts} attempt(s)")
                assert isinstance(outcome.plan, ValidatedPlan) and outcome.plan.node_ids
                usage = outcome.usage
            for counts in usage:
                assert set(counts) <= {"prompt_tokens", "completion_tokens"}
                assert all(type(n) is int and n >= 0 for n in counts.values())
            first, *later = server.chat_requests
            assert all(r.size < first.size + 30_000 for r in later)  # a repair echoes a bounded summary

        check()


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(st.one_of(st.text(max_size=60), st.sampled_from(PIECES)), max_size=12),
    limit=st.integers(1, 400),
)
def test_redact_leaves_no_piece_of_the_key_and_respects_the_limit(parts: list[str], limit: int) -> None:
    text = "".join(parts)
    shown = redact(text, KEY, limit)
    assert not leaked(shown)
    note = f"...[{len(text)} chars, cut]"
    assert len(shown) <= limit or (shown.endswith(note) and len(shown) <= limit + len(note))
