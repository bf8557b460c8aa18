"""A planner that fills plan templates chosen by regular expressions over the goal.

::

    planner = TemplatePlanner(
        rules=[PlanRule(r"\\bslow\\b", "latency.json", defaults={"service": "payment-api"})],
        replan_rules=[ReplanRule("latency_replan_deploys.json", when_tool="query_deploys")],
        template_dir=Path(__file__).parent / "templates",
    )

A template is a plan (or, for a replan, a replacement subgraph) given as a dict or as the path of a JSON
file; a relative path is read from ``template_dir``. Its strings may hold ``{{name}}`` placeholders. A
placeholder that is a whole string takes the value with its type; inside a longer string it takes the
value's text. Values come, first match wins, from the rule's named regex groups, ``request.conf``, the
rule's defaults, and finally ``goal`` (the request's goal).

A replan fills its replacement from the values the current plan was made with (read back from it
through the goal's plan rule), then the same sources, then ``failed_node`` and ``error`` (the last
error); so nodes it repeats come out identical. Nodes of the current plan that the replacement
depends on but that are not locked are carried over unchanged (see :func:`carry_over`).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_plan_provider.exceptions import PlanningError
from airflow_plan_provider.plan.model import Plan
from airflow_plan_provider.plan.references import iter_references
from airflow_plan_provider.planners.base import PlanRequest

PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")

Template = str | Path | Mapping[str, Any]


@dataclass(frozen=True)
class PlanRule:
    """Use ``template`` for goals that ``pattern`` matches (``re.search``, case-insensitive)."""

    pattern: str
    template: Template
    defaults: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        re.compile(self.pattern)  # a broken pattern fails when the rule is declared, not on first use

    def match(self, goal: str) -> re.Match[str] | None:
        return re.search(self.pattern, goal, re.IGNORECASE)


@dataclass(frozen=True)
class ReplanRule:
    """Use the replacement ``template`` when the failed (or replan-requesting) node runs ``when_tool``
    and/or the last error matches ``when_error`` (case-insensitive); every condition given must hold."""

    template: Template
    when_tool: str | None = None
    when_error: str | None = None
    defaults: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.when_tool is None and self.when_error is None:
            raise ValueError("a ReplanRule needs when_tool, when_error or both")
        if self.when_error is not None:
            re.compile(self.when_error)

    def matches(self, tool: str | None, error: str | None) -> bool:
        if self.when_tool is not None and tool != self.when_tool:
            return False
        return self.when_error is None or (
            error is not None and re.search(self.when_error, error, re.IGNORECASE) is not None
        )


def _present(values: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}


def fill_template(value: Any, values: Mapping[str, Any], unfilled: set[str] | None = None) -> Any:
    """``value`` with its ``{{name}}`` placeholders replaced; names without a value go to ``unfilled``."""
    unfilled = set() if unfilled is None else unfilled
    if isinstance(value, str):
        whole = PLACEHOLDER.fullmatch(value)
        if whole:
            if whole.group(1) in values:
                return copy.deepcopy(values[whole.group(1)])
            unfilled.add(whole.group(1))
            return value

        def substitute(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in values:
                unfilled.add(name)
                return match.group(0)
            found = values[name]
            return found if isinstance(found, str) else json.dumps(found, default=str)

        return PLACEHOLDER.sub(substitute, value)
    if isinstance(value, Mapping):
        return {key: fill_template(item, values, unfilled) for key, item in value.items()}
    if isinstance(value, list):
        return [fill_template(item, values, unfilled) for item in value]
    return value


def recover_values(template: Any, filled: Any) -> dict[str, Any]:
    """The values a template's whole-string placeholders took in ``filled`` (a plan made from it).

    Nodes are paired by id; a node or field the plan changed since is ignored.
    """
    found: dict[str, Any] = {}

    def walk(tmpl: Any, value: Any) -> None:
        if isinstance(tmpl, str):
            whole = PLACEHOLDER.fullmatch(tmpl)
            if whole and whole.group(1) not in found:
                found[whole.group(1)] = value
        elif isinstance(tmpl, Mapping) and isinstance(value, Mapping):
            for key, item in tmpl.items():
                if key in value:
                    walk(item, value[key])
        elif isinstance(tmpl, list) and isinstance(value, list) and len(tmpl) == len(value):
            for a, b in zip(tmpl, value, strict=True):
                walk(a, b)

    if isinstance(template, Mapping) and isinstance(filled, Mapping):
        by_id = {str(n.get("id")): n for n in filled.get("nodes", []) if isinstance(n, Mapping)}
        for node in template.get("nodes", []):
            if isinstance(node, Mapping) and str(node.get("id")) in by_id:
                walk(node.get("params", {}), by_id[str(node.get("id"))].get("params", {}))
        walk(template.get("goal"), filled.get("goal"))
    return found


def carry_over(replacement: dict[str, Any], current: Plan, locked: set[str]) -> None:
    """Add to ``replacement`` the nodes of ``current`` it depends on that are neither in it nor locked.

    Merging keeps only locked nodes of the current plan, so a node the replacement still needs (say an
    optional parent that failed) would vanish and leave a dangling reference; carried over unchanged,
    it runs again in the new revision instead. Edges into a carried node come with it.
    """
    nodes = replacement.setdefault("nodes", [])
    edges = replacement.setdefault("edges", [])
    have = {str(n.get("id")) for n in nodes if isinstance(n, Mapping)}
    wanted = [
        ref.node_id for n in nodes if isinstance(n, Mapping) for ref in iter_references(n.get("params", {}))
    ]
    wanted += [str(p) for n in nodes if isinstance(n, Mapping) for p in n.get("dependencies") or ()]
    wanted += [str(e.get("from")) for e in edges if isinstance(e, Mapping)]
    known = set(current.node_ids)
    while wanted:
        node_id = wanted.pop()
        if node_id in have or node_id in locked or node_id not in known:
            continue
        node = current.node(node_id)
        nodes.append(node.model_dump(mode="json", exclude_none=True))
        have.add(node_id)
        into = [e for e in current.edges if e.target == node_id]
        edges += [e.model_dump(mode="json", by_alias=True) for e in into]
        wanted += [e.source for e in into] + [ref.node_id for ref in iter_references(node.params)]


class TemplatePlanner:
    """Plans by rule: the first :class:`PlanRule` whose pattern matches the goal picks the template;
    replans use the first matching :class:`ReplanRule`, and return no plan when none matches."""

    def __init__(
        self,
        rules: Sequence[PlanRule],
        replan_rules: Sequence[ReplanRule] = (),
        *,
        template_dir: str | Path | None = None,
    ) -> None:
        self.rules = list(rules)
        self.replan_rules = list(replan_rules)
        self.template_dir = Path(template_dir) if template_dir is not None else None
        templates = [rule.template for rule in self.rules] + [rule.template for rule in self.replan_rules]
        relative = [
            str(template)
            for template in templates
            if not isinstance(template, Mapping) and not Path(template).is_absolute()
        ]
        if relative and self.template_dir is None:
            raise ValueError(
                f"plan templates {relative} are relative paths: pass template_dir (the folder they are "
                "read from) or give absolute paths"
            )

    def plan(self, request: PlanRequest) -> dict[str, Any] | None:
        """A filled plan, a filled replacement subgraph for a replan, or ``None`` for an unmatched replan.

        Raises :class:`PlanningError` when no rule matches the goal or a placeholder has no value.
        """
        if request.is_replan:
            return self._replan(request)
        for rule in self.rules:
            match = rule.match(request.goal)
            if match:
                values = {"goal": request.goal, **_present(rule.defaults), **_present(dict(request.conf))}
                plan = self._fill(rule.template, {**values, **_present(match.groupdict())})
                if not plan.get("goal"):
                    plan["goal"] = request.goal
                return plan
        known = ", ".join(f"/{rule.pattern}/" for rule in self.rules) or "none"
        raise PlanningError(f"no plan rule matches the goal {request.goal!r}; known patterns: {known}")

    def _replan(self, request: PlanRequest) -> dict[str, Any] | None:
        tool = None
        if request.failed_node and request.current_plan is not None:
            try:
                tool = request.current_plan.node(request.failed_node).tool
            except KeyError:
                tool = None
        rule = next((r for r in self.replan_rules if r.matches(tool, request.last_error)), None)
        if rule is None:
            return None
        # The replacement fills from the same values as the plan it replaces, so unchanged nodes come
        # out identical and the revision's diff names only what really changed. A replan run's conf
        # need not repeat the first run's, so the values are also read back from the current plan.
        plan_rule, match = next(((r, m) for r in self.rules if (m := r.match(request.goal))), (None, None))
        values: dict[str, Any] = {
            "goal": request.goal,
            **_present({"failed_node": request.failed_node, "error": request.last_error}),
            **_present(plan_rule.defaults if plan_rule else {}),
            **_present(rule.defaults),
            **_present(dict(request.conf)),
            **_present(match.groupdict() if match else {}),
        }
        if plan_rule is not None and request.current_plan is not None:
            values.update(recover_values(self._load(plan_rule.template), request.current_plan.to_json_dict()))
        replacement = self._fill(rule.template, values)
        if request.current_plan is not None:
            carry_over(replacement, request.current_plan, {node.id for node in request.locked})
        return replacement

    def _load(self, template: Template) -> dict[str, Any]:
        if isinstance(template, Mapping):
            return copy.deepcopy(dict(template))
        path = Path(template)
        if not path.is_absolute() and self.template_dir is not None:
            path = self.template_dir / path
        try:
            loaded = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as error:
            raise PlanningError(f"cannot read plan template {str(path)!r}: {error}") from error
        if not isinstance(loaded, dict):
            raise PlanningError(f"plan template {str(path)!r} is not a JSON object")
        return loaded

    def _fill(self, template: Template, values: Mapping[str, Any]) -> dict[str, Any]:
        unfilled: set[str] = set()
        filled: dict[str, Any] = fill_template(self._load(template), values, unfilled)
        if unfilled:
            names = ", ".join(f"{{{{{name}}}}}" for name in sorted(unfilled))
            raise PlanningError(
                f"plan template {template if not isinstance(template, Mapping) else '<dict>'} has no value "
                f"for {names}; pass it in the run's conf or the rule's defaults"
            )
        return filled
