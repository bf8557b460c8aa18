"""The reference scanner on its own: the exact syntax, escapes, hostile strings, nesting and sizes.

Every case here goes through the public functions (``iter_references``, ``references_in``,
``contains_reference``, ``resolve``), which share one scanner.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from airflow_plan_provider.exceptions import PlanValidationError
from airflow_plan_provider.plan.references import (
    MAX_DEPTH,
    MissingInput,
    ParamsTooNested,
    UnresolvedReference,
    contains_reference,
    iter_references,
    references_in,
    resolve,
)
from airflow_plan_provider.plan.validate import validate_plan

OUTPUTS: dict[str, Any] = {"a": {"b": 1, "c": {"d": "deep"}, "$x": 2}, "t": "text", "n": [10, 20]}


def found(text: str) -> list[tuple[str, tuple[str, ...]]]:
    return [(ref.node_id, ref.path) for ref in references_in(text)]


# --- syntax ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "references"),
    [
        ("${a}", [("a", ())]),
        ("${a.b}", [("a", ("b",))]),
        ("${a.c.d}", [("a", ("c", "d"))]),
        ("${n.-1}", [("n", ("-1",))]),
        ("${A-z_9}", [("A-z_9", ())]),
        ("x ${a} y ${t}", [("a", ()), ("t", ())]),
        ("${a}${t}", [("a", ()), ("t", ())]),
        ("${a.$x}", [("a", ("$x",))]),  # a segment is anything but ".", "}" and whitespace
        ("${a.b{c}", [("a", ("b{c",))]),
        ("${a.${t}", [("a", ("${t",))]),
        ("${a..b} ${t}", [("t", ())]),  # an empty segment spoils only its own reference
        ("${a.b ${t}", [("t", ())]),
        ("${a,${t}", [("t", ())]),
        ("${}", []),
        ("${a.}", []),
        ("${.b}", []),
        ("${a b}", []),
        ("${a.b\u00a0c}", []),  # Unicode whitespace ends a segment too
        ("${é}", []),  # ids are ASCII
        ("${a", []),
        ("$a}", []),
        ("{a}", []),
        ("$${a}", []),  # escaped
        ("$$${a}", []),  # a "$" right after another "$" never starts a reference
        ("$ ${a}", [("a", ())]),
        ("", []),
    ],
)
def test_what_is_a_reference(text: str, references: list[tuple[str, tuple[str, ...]]]) -> None:
    assert found(text) == references
    assert [(r.node_id, r.path) for r in iter_references({"p": [text]})] == references
    assert contains_reference({"p": text}) is bool(references)


def test_iter_references_names_where_each_sits() -> None:
    params = {"q": "${a}", "list": ["x", {"deep": "${t.x} ${n.0}"}], "n": 3}
    assert [(r.node_id, r.location) for r in iter_references(params)] == [
        ("a", "params.q"),
        ("t", "params.list[1].deep"),
        ("n", "params.list[1].deep"),
    ]


@pytest.mark.parametrize(
    ("text", "resolved"),
    [
        ("$${a}", "${a}"),
        ("$$${a}", "$${a}"),  # only the last "$$" of a run before "{" is the escape
        ("$$a", "$$a"),
        ("cost $${a.b} is ${a.b}", "cost ${a.b} is 1"),
        ("${a.b ${a.b}", "${a.b 1"),
        ("${a.b$${x ${a.b}", "${a.b${x 1"),  # an escape inside a broken reference is still an escape
        ("${a.$x}", 2),
        ("[${n}]", "[[10, 20]]"),
        ("${a.c}", {"d": "deep"}),
        ("${a.c.d}!", "deep!"),
    ],
)
def test_escapes_and_substitution(text: str, resolved: Any) -> None:
    assert resolve(text, OUTPUTS) == resolved


def test_output_text_is_inserted_as_it_is() -> None:
    """Escapes belong to the param's own text: an output that holds "$${" is not rewritten."""
    outputs = {"p": "price $${x} and $", "q": "{y}"}
    assert resolve("says: ${p}", outputs) == "says: price $${x} and $"
    assert resolve("${p}${q}", outputs) == "price $${x} and ${y}"


def test_missing_output_inside_text_and_whole() -> None:
    assert resolve("x ${gone.b}", OUTPUTS) == "x <missing output of node gone>"
    assert isinstance(resolve("${gone.b}", OUTPUTS), MissingInput)


def test_unresolved_field_in_the_error_is_clipped() -> None:
    path = "x" * 10_000
    with pytest.raises(UnresolvedReference) as caught:
        resolve({"q": f"${{a.{path}}}"}, OUTPUTS)
    message = str(caught.value)
    assert message.startswith("params.q: output of node 'a' has no field 'xxx")
    assert len(message) < 400
    assert "more characters" in message


# --- hostile strings --------------------------------------------------------------------------------------

# Each string made these functions quadratic: 64 KiB of "${a.b" took ~19 s in validate_plan and as long
# again in resolve. The bound below is a guard against a catastrophic regression only (a linear scan
# takes milliseconds), measured as CPU time around one call.
GUARD_SECONDS = 5.0
HOSTILE = ["${a.b", "${a,", "${a..", "${a.}", "${", "$${", "${a.b ", "${a.$"]


def cpu_seconds(call: Any) -> tuple[float, Any]:
    start = time.process_time()
    result = call()
    return time.process_time() - start, result


@pytest.mark.parametrize("unit", HOSTILE)
def test_hostile_64k_strings_resolve_in_linear_time(unit: str) -> None:
    text = unit * (64 * 1024 // len(unit))
    seconds, resolved = cpu_seconds(lambda: resolve({"q": text}, OUTPUTS))
    assert seconds < GUARD_SECONDS, f"resolve took {seconds:.1f} s on {unit!r} * {len(text) // len(unit)}"
    assert resolved == {"q": text.replace("$${", "${")}  # nothing in them is a reference
    seconds, references = cpu_seconds(lambda: list(iter_references({"q": text})))
    assert seconds < GUARD_SECONDS
    assert references == []


def test_64k_of_unclosed_references_validates_and_128k_is_too_large() -> None:
    node = {"id": "a", "action": "x", "tool": "t"}
    seconds, validated = cpu_seconds(
        lambda: validate_plan({"nodes": [{**node, "params": {"q": "${a.b" * 12800}}]})
    )
    assert seconds < GUARD_SECONDS
    assert validated.parents == {"a": []}
    with pytest.raises(PlanValidationError) as caught:
        validate_plan({"nodes": [{**node, "params": {"q": "${a.b" * 25600}}]})
    assert [(p.code, p.path) for p in caught.value.problems] == [("param_too_large", "nodes[0].params.q")]


def test_many_references_in_one_string() -> None:
    text = "${a.b}" * 10_000
    assert len(found(text)) == 10_000
    assert resolve(text, OUTPUTS) == "1" * 10_000


# --- nesting and size -------------------------------------------------------------------------------------


def nested(depth: int, leaf: Any = "${a}") -> Any:
    """``depth`` containers, alternately a dict (outermost) and a list, around ``leaf``."""
    value = leaf
    for level in reversed(range(depth)):
        value = [value] if level % 2 else {"k": value}
    return value


def test_params_at_the_depth_ceiling_resolve() -> None:
    params = nested(MAX_DEPTH - 1)  # MAX_DEPTH containers counting this one
    assert len(list(iter_references({"p": params}))) == 1
    assert resolve({"p": params}, OUTPUTS) == {"p": nested(MAX_DEPTH - 1, OUTPUTS["a"])}


@pytest.mark.parametrize("depth", [MAX_DEPTH, 10_000])
def test_params_too_nested_raise_a_documented_error(depth: int) -> None:
    params = {"p": nested(depth)}
    with pytest.raises(ParamsTooNested) as caught:
        resolve(params, OUTPUTS)
    assert isinstance(caught.value, UnresolvedReference)  # the node runner fails the node on it
    assert caught.value.limit == MAX_DEPTH
    assert caught.value.location.startswith("params.p.k[0].k[0]")
    assert str(caught.value).endswith(f"params nest dicts and lists deeper than {MAX_DEPTH} levels")
    with pytest.raises(ParamsTooNested):
        list(iter_references(params))
    with pytest.raises(ParamsTooNested):
        contains_reference(params)


def test_max_depth_is_a_parameter() -> None:
    assert resolve({"a": {"b": 1}}, {}, max_depth=2) == {"a": {"b": 1}}
    with pytest.raises(ParamsTooNested) as caught:
        resolve({"a": {"b": 1}}, {}, max_depth=1)
    assert caught.value.location == "params.a"


def test_resolved_text_has_a_size_limit() -> None:
    outputs = {"big": "x" * 1000}
    assert resolve("${big}${big}", outputs, max_chars=2000) == "x" * 2000
    with pytest.raises(UnresolvedReference) as caught:
        resolve({"q": "${big} " * 3}, outputs, max_chars=2000)
    assert str(caught.value) == "params.q: the text would be longer than 2000 characters"
    # a whole-value reference is the output itself, not a copy: no limit applies
    assert resolve("${big}", outputs, max_chars=10) == "x" * 1000


def test_output_nested_too_deeply_for_json_is_an_unresolved_reference() -> None:
    outputs = {"deep": nested(100_000, 1)}
    with pytest.raises(UnresolvedReference) as caught:
        resolve("text ${deep}", outputs)
    assert str(caught.value) == "params: referenced output nests too deeply to write as text"
