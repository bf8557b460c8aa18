"""Graph questions about a plan: parents, layers, descendants. Ordering uses stdlib ``graphlib``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from graphlib import CycleError, TopologicalSorter


def node_sort_key(node_id: str) -> tuple[int, int, str]:
    """Numeric ids in numeric order ("2" before "10"), then the rest alphabetically."""
    return (0, int(node_id), "") if node_id.isdigit() else (1, 0, node_id)


def topological_layers(parents: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Topological generations: each layer holds the nodes whose parents are all in earlier layers.

    Raises :class:`graphlib.CycleError` (``args[1]`` is the cycle, first node repeated at the end).
    """
    sorter = TopologicalSorter(parents)
    sorter.prepare()
    layers: list[list[str]] = []
    while sorter.is_active():
        ready = sorted(sorter.get_ready(), key=node_sort_key)
        layers.append(ready)
        sorter.done(*ready)
    return layers


def find_cycle(parents: Mapping[str, Iterable[str]]) -> list[str] | None:
    try:
        TopologicalSorter(parents).prepare()
    except CycleError as error:
        # each node in graphlib's list is a parent of the next: the cycle in edge direction
        return [str(node) for node in error.args[1]]
    return None


def children_of(parents: Mapping[str, Iterable[str]]) -> dict[str, list[str]]:
    children: dict[str, list[str]] = {node: [] for node in parents}
    for node, node_parents in parents.items():
        for parent in node_parents:
            children.setdefault(parent, []).append(node)
    return children


def descendants(parents: Mapping[str, Iterable[str]], roots: Iterable[str]) -> set[str]:
    """Every node reachable from ``roots`` (the roots themselves excluded)."""
    children = children_of(parents)
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in seen:
                seen.add(child)
                stack.append(child)
    return seen
