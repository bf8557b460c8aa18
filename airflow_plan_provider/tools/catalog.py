"""The tool catalog as a planner reads it: bounded, however many tools the DAG's sources list.

Every tool is one line: its name, its description on one line (whitespace collapsed, so a description
cannot open a section of its own in the prompt), and its argument schema. Three forms, the first that
fits the budget:

1. *full*: each tool with its whole argument JSON Schema (what a planner needs to write valid params);
2. *compact*: each tool with its params as a signature (``service: str, day?: str``) and the first
   sentence of its description (80 characters at most): about 110 characters a tool, so 500 tools fit in
   60,000 characters;
3. *for the goal*: the compact lines of the tools whose name and description share the most words with
   the goal, as many as fit, and a last line counting the tools left out.

The plan's validation still accepts every listed tool, and checks each node's params against the tool's
full schema; a plan written from a compact line that breaks the schema is sent back to the planner with
the problems, as any invalid plan (the repair loop). ``bench/prompt_size.py`` prints the prompt's size for
10, 100 and 500 tools.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_plan_provider.tools.tool import Tool

COMPACT_DESCRIPTION_CHARS = 80
FULL_DESCRIPTION_CHARS = 1_000
WORD = re.compile(r"[a-z0-9]+")
SHORT_TYPES = {"string": "str", "integer": "int", "boolean": "bool"}  # in compact signatures


def one_line(text: str, limit: int) -> str:
    """``text`` on one line (whitespace collapsed), at most ``limit`` characters."""
    line = " ".join(str(text or "").split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def full_line(tool: Tool) -> str:
    schema = json.dumps(tool.args_schema, sort_keys=True, separators=(",", ":"), default=str)
    return (
        f"- {tool.name}: {one_line(tool.description, FULL_DESCRIPTION_CHARS)}\n  args JSON Schema: {schema}"
    )


def signature(schema: Mapping[str, Any]) -> str:
    """``name: type, other?: type`` from an object schema's properties (``?``: optional; ``str``, ``int``
    and ``bool`` stand for JSON's string, integer and boolean)."""
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    if not isinstance(properties, Mapping):
        return "" if not schema or schema.get("type") == "object" else json.dumps(schema)[:200]
    required = set(schema.get("required") or [])
    parts = []
    for name, spec in properties.items():
        kind: Any = spec.get("type", "any") if isinstance(spec, Mapping) else "any"
        if isinstance(spec, Mapping) and "enum" in spec and isinstance(spec["enum"], list):
            kind = "|".join(json.dumps(v) for v in spec["enum"][:8])
        kinds = kind if isinstance(kind, list) else [kind]
        kind = "/".join(SHORT_TYPES.get(str(k), str(k)) for k in kinds)
        parts.append(f"{one_line(str(name), 64)}{'' if name in required else '?'}: {one_line(kind, 80)}")
    return ", ".join(parts)


def compact_line(tool: Tool) -> str:
    first = re.split(r"(?<=[.!?])\s", one_line(tool.description, 4 * COMPACT_DESCRIPTION_CHARS), maxsplit=1)[
        0
    ]
    return f"- {tool.name}({signature(tool.args_schema)}): {one_line(first, COMPACT_DESCRIPTION_CHARS)}"


def relevance(tool: Tool, goal_words: set[str]) -> int:
    """How many of the goal's words the tool's name and description share."""
    words = set(WORD.findall(f"{tool.name} {tool.description}".lower().replace("_", " ")))
    return len(words & goal_words)


def catalog_text(tools: Sequence[Tool], *, goal: str = "", budget: int) -> str:
    """The catalog section of a planner's prompt, at most about ``budget`` characters (see the module's
    docstring)."""
    ordered = sorted(tools, key=lambda t: t.name)
    full = [full_line(t) for t in ordered]
    if _size(full) <= budget:
        return "\n".join(full)
    compact = [compact_line(t) for t in ordered]
    header = "(compact: each tool's params as name: type, '?' marks an optional one; str/int/bool: JSON)"
    if _size(compact) + len(header) <= budget:
        return "\n".join([header, *compact])
    goal_words = set(WORD.findall(goal.lower()))
    ranked = sorted(ordered, key=lambda t: (-relevance(t, goal_words), t.name))
    kept: list[str] = []
    size = len(header) + 200
    for tool in ranked:
        line = compact_line(tool)
        if size + len(line) + 1 > budget:
            break
        kept.append(line)
        size += len(line) + 1
    left_out = len(ordered) - len(kept)
    return "\n".join(
        [header, *kept, f"({left_out} more tools not shown: those above share the most words with the goal)"]
    )


def _size(lines: list[str]) -> int:
    return sum(len(line) + 1 for line in lines)


def tools_table(tools: Mapping[str, Tool]) -> list[dict[str, Any]]:
    """One row per tool, for ``airflow-plan tools``: name, where it comes from, whether it needs approval,
    its params as a signature, the first line of its description and its argument schema."""
    return [
        {
            "name": name,
            "origin": tools[name].origin.label(),
            "needs_approval": tools[name].needs_approval,
            "params": signature(tools[name].args_schema),
            "description": one_line(tools[name].description, COMPACT_DESCRIPTION_CHARS),
            "args_schema": tools[name].args_schema,
        }
        for name in sorted(tools)
    ]
