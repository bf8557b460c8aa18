"""Param references to upstream outputs.

Syntax: ``"${ID}"`` is the whole output of node ``ID``; ``"${ID.field.0.name}"`` walks into it
(dict keys and list indexes, separated by dots). A param that is exactly one reference takes the
referenced value with its type; a reference inside a longer string is replaced by its text
(JSON for non-strings). ``$${`` writes a literal ``${``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

REFERENCE = re.compile(r"(?<!\$)\$\{([A-Za-z0-9_\-]+)((?:\.[^.}\s]+)*)\}")


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


def iter_references(value: Any, location: str = "params") -> Iterator[Reference]:
    """Every reference inside a params structure, with where it sits."""
    if isinstance(value, str):
        for match in REFERENCE.finditer(value):
            path = tuple(p for p in match.group(2).split(".") if p)
            yield Reference(match.group(1), path, location)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from iter_references(item, f"{location}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from iter_references(item, f"{location}[{index}]")


def contains_reference(value: Any) -> bool:
    return next(iter_references(value), None) is not None


class UnresolvedReference(LookupError):
    """A reference could not be resolved against the outputs it was given."""


def _walk(output: Any, ref: Reference) -> Any:
    value = output
    for step in ref.path:
        if isinstance(value, Mapping) and step in value:
            value = value[step]
        elif isinstance(value, list) and step.lstrip("-").isdigit() and -len(value) <= int(step) < len(value):
            value = value[int(step)]
        else:
            raise UnresolvedReference(
                f"{ref.location}: output of node {ref.node_id!r} has no field {'.'.join(ref.path)!r}"
            )
    return value


def resolve(value: Any, outputs: Mapping[str, Any], location: str = "params") -> Any:
    """Replace references in ``value`` with upstream outputs (``outputs`` maps node id to output).

    A reference to a node missing from ``outputs`` resolves to a :class:`MissingInput`.
    """
    if isinstance(value, str):
        whole = REFERENCE.fullmatch(value)
        if whole:
            ref = next(iter_references(value, location))
            if ref.node_id not in outputs or isinstance(outputs[ref.node_id], MissingInput):
                return MissingInput(ref.node_id)
            return _walk(outputs[ref.node_id], ref)

        def substitute(match: re.Match[str]) -> str:
            ref = next(iter_references(match.group(0), location))
            if ref.node_id not in outputs or isinstance(outputs[ref.node_id], MissingInput):
                return f"<missing output of node {ref.node_id}>"
            found = _walk(outputs[ref.node_id], ref)
            return found if isinstance(found, str) else json.dumps(found, default=str)

        return REFERENCE.sub(substitute, value).replace("$${", "${")
    if isinstance(value, Mapping):
        return {key: resolve(item, outputs, f"{location}.{key}") for key, item in value.items()}
    if isinstance(value, list):
        return [resolve(item, outputs, f"{location}[{i}]") for i, item in enumerate(value)]
    return value
