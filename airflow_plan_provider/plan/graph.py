"""Graph questions about a plan: parents, layers, descendants. Ordering and cycles use stdlib ``graphlib``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from graphlib import CycleError, TopologicalSorter


def node_sort_key(node_id: str) -> tuple[int, int, str]:
    """Numeric ids in numeric order ("2" before "10", "01" before "1"), then the rest alphabetically."""
    return (0, int(node_id), node_id) if node_id.isdecimal() else (1, 0, node_id)


def topological_layers(parents: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Topological generations: each layer holds the nodes whose parents are all in earlier layers.

    Raises :class:`graphlib.CycleError` whose ``args[1]`` is a cycle in edge direction (first node
    repeated at the end); the same plan always reports the same cycle.
    """
    sorter = TopologicalSorter(parents)
    try:
        sorter.prepare()
    except CycleError:
        raise CycleError("nodes are in a cycle", find_cycle(parents)) from None
    layers: list[list[str]] = []
    while sorter.is_active():
        layer = sorted(sorter.get_ready(), key=node_sort_key)
        layers.append(layer)
        sorter.done(*layer)
    return layers


def descendant_counts(layers: list[list[str]], parents: Mapping[str, Iterable[str]]) -> dict[str, int]:
    """Node → how many nodes descend from it, given the plan's layers (one pass from the last layer up,
    each node's descendants kept as the bits of an int).

    >>> descendant_counts([["a", "b"], ["c"], ["d"]], {"a": [], "b": [], "c": ["a"], "d": ["c", "a"]})
    {'a': 2, 'b': 0, 'c': 1, 'd': 0}
    """
    order = [node for layer in layers for node in layer]
    bit = {node: 1 << index for index, node in enumerate(order)}
    below = dict.fromkeys(order, 0)
    for node in reversed(order):
        for parent in parents.get(node, ()):
            below[parent] |= below[node] | bit[node]
    return {node: below[node].bit_count() for node in order}


def run_order(layers: list[list[str]], parents: Mapping[str, Iterable[str]]) -> list[str]:
    """The nodes in the order they are handed slots: layer by layer (a parent before its children), and
    within a layer the nodes with more descendants first, then in the layer's own order. A hand-written
    Airflow DAG ranks its ready tasks the same way (the default ``downstream`` weight rule: one plus the
    number of tasks downstream), so the node that holds up most of the plan runs first.

    >>> run_order([["a", "b"], ["c", "d"], ["e"]], {"a": [], "b": [], "c": ["a"], "d": ["b"], "e": ["d"]})
    ['b', 'a', 'd', 'c', 'e']
    """
    counts = descendant_counts(layers, parents)
    return [node for layer in layers for node in sorted(layer, key=lambda node: -counts[node])]


def descendant_order(layers: list[list[str]], parents: Mapping[str, Iterable[str]]) -> list[str]:
    """The nodes by how many nodes descend from them, most first, ties in :func:`run_order`: a static
    DAG's weight order across the whole plan, not layer by layer. A parent has more descendants than
    each of its children, so a parent still comes before its children.

    >>> layers, parents = [["a", "b", "d"], ["c"], ["e"]], {"a": [], "b": [], "d": [], "c": ["a"], "e": ["c"]}
    >>> run_order(layers, parents), descendant_order(layers, parents)
    (['a', 'b', 'd', 'c', 'e'], ['a', 'c', 'b', 'd', 'e'])
    """
    counts = descendant_counts(layers, parents)
    return sorted(run_order(layers, parents), key=lambda node: -counts[node])


def find_cycle(parents: Mapping[str, Iterable[str]]) -> list[str] | None:
    """A cycle (first node repeated at the end) or None.

    Parents are visited in :func:`node_sort_key` order, so the cycle reported depends on the order of
    the nodes in ``parents`` only, not on how each node's parents are stored (e.g. set order).
    """
    ordered = {node: sorted(node_parents, key=node_sort_key) for node, node_parents in parents.items()}
    try:
        TopologicalSorter(ordered).prepare()
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
