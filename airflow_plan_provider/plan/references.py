"""Param references to upstream outputs.

Syntax: ``"${ID}"`` is the whole output of node ``ID``; ``"${ID.field.0.name}"`` walks into it
(dict keys and list indexes, separated by dots). A param that is exactly one reference takes the
referenced value with its type; a reference inside a longer string is replaced by its text
(JSON for non-strings). ``$${`` writes a literal ``${``.

Precisely, a reference is ``${``, an id of ``A-Z a-z 0-9 _ -``, any number of ``.segment`` (a segment is
one or more characters other than ``.``, ``}`` and whitespace), then ``}``; a ``$`` right after another
``$`` never starts one. Every other character is literal text, and each ``$${`` in that text becomes
``${``. Upstream output inserted into a string is inserted as it is: escapes apply to the param's own
text only.

One scanner (:func:`_scan`) reads this syntax for :func:`iter_references`, :func:`references_in`,
:func:`contains_reference` and :func:`resolve`. It reads each character a bounded number of times, so
its time is linear in the length of the string, whatever the string holds. The walks through params
stop at ``max_depth`` levels of dicts and lists (:data:`MAX_DEPTH` unless told) with
:class:`ParamsTooNested`, and :func:`resolve` stops a string growing past ``max_chars``
(:data:`MAX_RESOLVED_CHARS`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_plan_provider.problems import clip

MAX_DEPTH = 100
"""Nesting of dicts and lists that :func:`iter_references` and :func:`resolve` accept (the params
object itself is level 1). Validation applies its own, lower limit (``Limits.max_param_depth``); this
one is the ceiling that keeps every walk far from Python's recursion limit."""

MAX_RESOLVED_CHARS = 16 * 1024 * 1024
"""Characters a string with references may resolve to (:func:`resolve`): a 64 KiB param can name a
large output thousands of times."""

MAX_FIELD_CHARS = 200  # characters of a reference's path quoted in an error

_ID = re.compile(r"[A-Za-z0-9_\-]*")
# The dot-separated segments after the id; possessive, so matching never backtracks.
_PATH = re.compile(r"(?:\.[^.}\s]+)*+")


class MissingInput:
    """Placeholder for the output of an optional parent that did not succeed."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id

    def __repr__(self) -> str:
        return f"<missing output of node {self.node_id}>"


@dataclass(frozen=True)
class Reference:
    node_id: str
    path: tuple[str, ...]
    location: str  # JSON path of the param holding the reference, e.g. "params.window"


class UnresolvedReference(LookupError):
    """A reference could not be resolved against the outputs it was given."""


class ParamsTooNested(UnresolvedReference):
    """Params nest dicts and lists deeper than allowed; ``location`` is the first container too deep.

    A subclass of :class:`UnresolvedReference`, so a caller that fails a node on an unresolved
    reference fails it the same way here.
    """

    def __init__(self, location: str, limit: int) -> None:
        self.location = location
        self.limit = limit
        super().__init__(f"{location}: params nest dicts and lists deeper than {limit} levels")


@dataclass(frozen=True)
class _Match:
    """One reference in a string: its node id, path, and where it starts and ends."""

    node_id: str
    path: tuple[str, ...]
    start: int
    end: int


def _run_end(run: re.Pattern[str], text: str, pos: int) -> int:
    """Where the run of characters matched by ``run`` (a single repeated class) from ``pos`` ends."""
    match = run.match(text, pos)
    return match.end() if match else pos


def _reference_at(text: str, start: int) -> _Match | int:
    """The reference that starts at ``text[start]`` (a ``$`` followed by ``{``), or where reading failed.

    On failure the returned position ``f`` is such that no reference starts between ``start`` and ``f``:
    a ``${`` in between reads the same dot-separated segments up to ``f`` and fails there too.
    """
    id_end = _run_end(_ID, text, start + 2)
    if id_end == start + 2:
        return id_end
    end = _run_end(_PATH, text, id_end)
    if end == len(text) or text[end] != "}":
        return end
    path = tuple(text[id_end + 1 : end].split(".")) if end > id_end else ()
    return _Match(text[start + 2 : id_end], path, start, end + 1)


def _scan(text: str) -> Iterator[str | _Match]:
    """The pieces of ``text`` in order: literal text (escapes already turned into ``${``) and references."""
    pos = 0  # everything before pos has been yielded
    search = 0  # where to look for the next "${"
    no_reference_before = 0  # a failed read proved that no reference starts before this position
    while (found := text.find("${", search)) >= 0:
        if found > 0 and text[found - 1] == "$":  # "$${": an escape, never a reference
            if found - 1 > pos:
                yield text[pos : found - 1]
            yield "${"
            pos = search = found + 2
            continue
        if found < no_reference_before:
            search = found + 1
            continue
        read = _reference_at(text, found)
        if isinstance(read, int):
            no_reference_before = read
            search = found + 1
            continue
        if found > pos:
            yield text[pos:found]
        yield read
        pos = search = read.end
    if pos < len(text):
        yield text[pos:]


def references_in(text: str, location: str = "params") -> Iterator[Reference]:
    """Every reference in one string, in order (``location`` is where the string sits)."""
    if "${" not in text:
        return
    for piece in _scan(text):
        if isinstance(piece, _Match):
            yield Reference(piece.node_id, piece.path, location)


def _too_deep(location: str, depth: int, max_depth: int) -> None:
    if depth > max_depth:
        raise ParamsTooNested(location, max_depth)


def iter_strings(
    value: Any, location: str = "params", *, max_depth: int = MAX_DEPTH
) -> Iterator[tuple[str, str]]:
    """Every string inside a params structure with its JSON path, in order (dict keys are not included).

    Raises :class:`ParamsTooNested` on reaching a dict or list more than ``max_depth`` levels deep.
    """
    yield from _iter_strings(value, location, 1, max_depth)


def _iter_strings(value: Any, location: str, depth: int, max_depth: int) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield location, value
    elif isinstance(value, Mapping):
        _too_deep(location, depth, max_depth)
        for key, item in value.items():
            yield from _iter_strings(item, f"{location}.{key}", depth + 1, max_depth)
    elif isinstance(value, list):
        _too_deep(location, depth, max_depth)
        for index, item in enumerate(value):
            yield from _iter_strings(item, f"{location}[{index}]", depth + 1, max_depth)


def iter_references(
    value: Any, location: str = "params", *, max_depth: int = MAX_DEPTH
) -> Iterator[Reference]:
    """Every reference inside a params structure, with where it sits.

    Raises :class:`ParamsTooNested` on reaching a dict or list more than ``max_depth`` levels deep.
    """
    for where, text in iter_strings(value, location, max_depth=max_depth):
        yield from references_in(text, where)


def contains_reference(value: Any, *, max_depth: int = MAX_DEPTH) -> bool:
    return next(iter_references(value, max_depth=max_depth), None) is not None


def _walk(output: Any, ref: Reference) -> Any:
    value = output
    for step in ref.path:
        if isinstance(value, Mapping) and step in value:
            value = value[step]
        elif isinstance(value, list) and step.lstrip("-").isdigit() and -len(value) <= int(step) < len(value):
            value = value[int(step)]
        else:
            field = clip(repr(".".join(ref.path)), MAX_FIELD_CHARS)
            raise UnresolvedReference(f"{ref.location}: output of node {ref.node_id!r} has no field {field}")
    return value


def _lookup(match: _Match, outputs: Mapping[str, Any], location: str) -> Any:
    """The referenced value, or a :class:`MissingInput` when the node has no output."""
    if match.node_id not in outputs or isinstance(outputs[match.node_id], MissingInput):
        return MissingInput(match.node_id)
    return _walk(outputs[match.node_id], Reference(match.node_id, match.path, location))


def _as_text(value: Any, location: str) -> str:
    if isinstance(value, MissingInput):
        return f"<missing output of node {value.node_id}>"
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, default=str)
    except RecursionError:
        raise UnresolvedReference(
            f"{location}: referenced output nests too deeply to write as text"
        ) from None


def _resolve_text(text: str, outputs: Mapping[str, Any], location: str, max_chars: int) -> Any:
    if "${" not in text:
        return text
    pieces = list(_scan(text))
    if len(pieces) == 1 and isinstance(pieces[0], _Match):  # the whole string is one reference
        return _lookup(pieces[0], outputs, location)
    parts: list[str] = []
    size = 0
    for piece in pieces:
        part = _as_text(_lookup(piece, outputs, location), location) if isinstance(piece, _Match) else piece
        size += len(part)
        if size > max_chars:  # a short param can repeat a large output many times
            raise UnresolvedReference(f"{location}: the text would be longer than {max_chars} characters")
        parts.append(part)
    return "".join(parts)


def resolve(
    value: Any,
    outputs: Mapping[str, Any],
    location: str = "params",
    *,
    max_depth: int = MAX_DEPTH,
    max_chars: int = MAX_RESOLVED_CHARS,
) -> Any:
    """Replace references in ``value`` with upstream outputs (``outputs`` maps node id to output).

    A reference to a node missing from ``outputs`` resolves to a :class:`MissingInput`. Raises
    :class:`UnresolvedReference` when a path does not exist in an output or a string with references
    would resolve to more than ``max_chars`` characters, and :class:`ParamsTooNested` when ``value``
    nests dicts and lists deeper than ``max_depth``.
    """
    return _resolve(value, outputs, location, 1, (max_depth, max_chars))


def _resolve(
    value: Any, outputs: Mapping[str, Any], location: str, depth: int, bounds: tuple[int, int]
) -> Any:
    if isinstance(value, str):
        return _resolve_text(value, outputs, location, bounds[1])
    if isinstance(value, Mapping):
        _too_deep(location, depth, bounds[0])
        return {
            key: _resolve(item, outputs, f"{location}.{key}", depth + 1, bounds)
            for key, item in value.items()
        }
    if isinstance(value, list):
        _too_deep(location, depth, bounds[0])
        return [
            _resolve(item, outputs, f"{location}[{i}]", depth + 1, bounds) for i, item in enumerate(value)
        ]
    return value
