"""The plan as data: nodes, edges and the validated plan with its layers.

A planner writes::

    {"nodes": [{"id": "1", "action": "query latency metrics", "tool": "query_metrics", "params": {}}],
     "edges": [{"from": "1", "to": "5", "optional": true}]}

Nodes may instead list their parents in ``dependencies``; those become hard edges.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any

from pydantic import ConfigDict, Field, model_validator

from airflow_plan_provider.base_model import Model
from airflow_plan_provider.plan.graph import descendant_order, run_order

NODE_ID_PATTERN = r"^[A-Za-z0-9_\-]{1,64}$"


class Node(Model):
    """One step of a plan: a tool called with params."""

    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)

    id: str = Field(
        pattern=NODE_ID_PATTERN, description="Unique id of the step, e.g. '1' or 'fetch_metrics'."
    )
    action: str = Field(description="What the step does, in a few words.")
    tool: str = Field(description="Name of a tool from the catalog.")
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="Tool arguments; a value '${ID}' or '${ID.field}' uses an upstream step's output.",
    )
    expected_outcome: str | None = Field(default=None, description="What a successful result looks like.")
    dependencies: list[str] | None = Field(
        default=None, description="Ids of steps that must finish first (alternative to edges)."
    )


class Edge(Model):
    """``from`` must finish before ``to`` starts; an optional edge does not block ``to`` if ``from`` fails."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, coerce_numbers_to_str=True)

    source: str = Field(alias="from")
    target: str = Field(alias="to")
    optional: bool = False


class Plan(Model):
    """A goal broken into nodes and the edges between them."""

    model_config = ConfigDict(extra="forbid")

    goal: str = ""
    nodes: list[Node]
    edges: list[Edge] = Field(default_factory=list)

    @model_validator(mode="after")
    def _dependencies_to_edges(self) -> Plan:
        with_dependencies = [node for node in self.nodes if node.dependencies is not None]
        if not with_dependencies:
            return self
        existing = {(e.source, e.target) for e in self.edges}
        for node in with_dependencies:
            for parent in node.dependencies or ():
                if (str(parent), node.id) not in existing:
                    self.edges.append(Edge.model_validate({"from": str(parent), "to": node.id}))
                    existing.add((str(parent), node.id))
            node.dependencies = None
        return self

    def node(self, node_id: str) -> Node:
        for node in self.nodes:
            if node.id == node_id:
                return node
        raise KeyError(node_id)

    @property
    def node_ids(self) -> list[str]:
        return [n.id for n in self.nodes]

    def to_json_dict(self) -> dict[str, Any]:
        """The plan in the shape planners write (``from``/``to`` edges, no empty fields)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class ValidatedPlan(Plan):
    """A plan that passed validation, with its layers (topological generations, each sorted).

    ``soft_edges`` lists ``(from, to)`` pairs whose dependency is optional; ``parents`` maps every node
    to its parents, including those implied by ``${...}`` references.
    """

    layers: list[list[str]]
    parents: dict[str, list[str]]
    soft_edges: list[tuple[str, str]] = Field(default_factory=list)

    def is_optional(self, parent: str, child: str) -> bool:
        return (parent, child) in set(map(tuple, self.soft_edges))

    @cached_property
    def nodes_by_id(self) -> dict[str, Node]:
        """Node id → node (a validated plan is never changed)."""
        return {node.id: node for node in self.nodes}

    def node(self, node_id: str) -> Node:
        try:
            return self.nodes_by_id[node_id]
        except KeyError:
            raise KeyError(node_id) from None

    @cached_property
    def run_order(self) -> list[str]:
        """Every node in the order its task instances get slots (:func:`~.graph.run_order`): the map
        indexes of the node tasks, and the order a step budget counts."""
        return run_order(self.layers, self.parents)

    @cached_property
    def descendant_order(self) -> list[str]:
        """Every node by its number of descendants, most first (:func:`~.graph.descendant_order`)."""
        return descendant_order(self.layers, self.parents)

    def layer_of(self, node_id: str) -> int:
        for index, layer in enumerate(self.layers):
            if node_id in layer:
                return index
        raise KeyError(node_id)

    def as_plan(self) -> Plan:
        return Plan(goal=self.goal, nodes=self.nodes, edges=self.edges)

    def around(self, node_id: str) -> ValidatedPlan:
        """Node ``node_id`` and its parents as a plan of their own (:func:`node_and_parents`).

        >>> nodes = [{"id": n, "action": n, "tool": "t"} for n in "abc"]
        >>> plan = ValidatedPlan.model_validate({"nodes": nodes,
        ...     "edges": [{"from": "a", "to": "b", "optional": True}, {"from": "b", "to": "c"}],
        ...     "layers": [["a"], ["b"], ["c"]], "parents": {"a": [], "b": ["a"], "c": ["b"]},
        ...     "soft_edges": [("a", "b")]})
        >>> part = plan.around("b")
        >>> part.node_ids, part.parents, part.soft_edges
        (['a', 'b'], {'a': [], 'b': ['a']}, [('a', 'b')])
        """
        soft = set(map(tuple, self.soft_edges))
        parents = [(self.node(p), (p, node_id) in soft) for p in self.parents[node_id]]
        return node_and_parents(self.node(node_id), parents)


def node_and_parents(node: Node, parents: Sequence[tuple[Node, bool]]) -> ValidatedPlan:
    """``node`` and its ``parents`` (each with whether its edge is optional) as a plan of their own: all
    a node's step needs of its plan (which parents it has and which are optional, their tools and
    params for the keys of their stored outputs, its own spec), whatever the size of the whole plan.
    Edges between the parents are not kept: the node does not wait on them."""
    ids = [parent.id for parent, _ in parents]
    return ValidatedPlan(
        nodes=[parent for parent, _ in parents] + [node],
        edges=[Edge(source=parent.id, target=node.id, optional=optional) for parent, optional in parents],
        layers=[ids, [node.id]] if ids else [[node.id]],
        parents={**{p: [] for p in ids}, node.id: ids},
        soft_edges=[(parent.id, node.id) for parent, optional in parents if optional],
    )
