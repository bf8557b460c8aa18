"""A single validation problem: a code, a message and the nodes involved, and how lists of them are shown.

The errors that carry problems (:class:`~airflow_plan_provider.exceptions.PlanValidationError`,
:class:`~airflow_plan_provider.exceptions.PlanningError`) import this module, so it imports nothing of
the package."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

ProblemCode = Literal[
    "schema",
    "empty_plan",
    "duplicate_id",
    "dangling_edge",
    "self_loop",
    "cycle",
    "unknown_tool",
    "bad_params",
    "bad_reference",
    "too_many_nodes",
    "too_many_edges",
    "too_nested",
    "param_too_large",
    "too_long",
    "locked_changed",
]

MAX_MESSAGE_CHARS = 2000  # characters kept of a problem's message
MAX_PATH_CHARS = 500  # characters kept of a problem's path
MAX_NODE_CHARS = 100  # characters kept of each node named (a valid node id has at most 64)


def clip(text: str, limit: int) -> str:
    """``text`` itself, or its first ``limit`` characters and how many were cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a plan.

    ``nodes`` lists the node ids involved (for ``cycle``: the cycle in order, first node repeated
    at the end); ``path`` is the location inside the plan or the params (a JSON path).
    """

    code: ProblemCode
    message: str
    nodes: tuple[str, ...] = ()
    path: str = ""
    detail: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        # A problem may quote what a plan holds (an unknown field, an edge end, a param value): clip it
        # so no problem is larger than a few kilobytes, whatever the plan held.
        if len(self.message) > MAX_MESSAGE_CHARS:
            object.__setattr__(self, "message", clip(self.message, MAX_MESSAGE_CHARS))
        if len(self.path) > MAX_PATH_CHARS:
            object.__setattr__(self, "path", clip(self.path, MAX_PATH_CHARS))
        if any(len(node) > MAX_NODE_CHARS for node in self.nodes):
            object.__setattr__(self, "nodes", tuple(clip(node, MAX_NODE_CHARS) for node in self.nodes))

    def __str__(self) -> str:
        where = f" [nodes: {', '.join(self.nodes)}]" if self.nodes else ""
        at = f" at {self.path}" if self.path else ""
        return f"{self.code}: {self.message}{where}{at}"

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "nodes": list(self.nodes), "path": self.path}


MAX_REPORTED_PROBLEMS = 20  # problems listed in messages, logs, XCom and repair prompts; the rest counted


def capped(problems: Sequence[Problem], limit: int = MAX_REPORTED_PROBLEMS) -> tuple[list[Problem], int]:
    """The first ``limit`` problems and how many were left out.

    A plan with 20k bad nodes has 20k problems: every place that echoes problems (error messages, task
    logs, XCom, the repair prompt sent back to the planner) shows the first ones and a count, never all.
    """
    shown = list(problems[:limit])
    return shown, len(problems) - len(shown)


def describe(problems: Sequence[Problem], limit: int = MAX_REPORTED_PROBLEMS) -> str:
    """One line per problem (the first ``limit``), then ``... and N more problem(s)`` when some were cut."""
    shown, more = capped(problems, limit)
    lines = [f"  - {p}" for p in shown]
    if more:
        lines.append(f"  ... and {more} more problem(s)")
    return "\n".join(lines)
