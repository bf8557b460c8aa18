"""Time and peak memory of ``validate_plan`` on large random plans, next to networkx.

Each plan is a random layered DAG: nodes are spread over ``LAYERS`` layers and every node outside the
first layer gets two parents (one in the layer just before, one in any earlier layer); one node in ten
also reads a parent's output through a ``${ID.field}`` reference. The same graph is handed to networkx
(``DiGraph`` build, then ``topological_generations``) as a baseline for the ordering part alone.

Columns: ``ours ms`` is the whole ``validate_plan`` (parsing, tool and param checks, references, layers,
the ``ValidatedPlan``); ``layers ms`` is ``topological_layers`` alone, the part comparable to networkx's
``topological_generations`` (``nx gen``); ``nx build`` is building the ``DiGraph``. Times are the best of
``--repeat`` runs, memory is the tracemalloc peak of one run. Timings of ``layers`` and networkx run with
the cyclic garbage collector paused, as ``validate_plan`` pauses it itself.

Run::

    PYTHONPATH=. .venv/bin/python bench/validate.py [--sizes 1000 10000 100000] [--repeat 3] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import random
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import networkx as nx

from airflow_plan_provider.plan.graph import topological_layers
from airflow_plan_provider.plan.validate import Limits, validate_plan
from airflow_plan_provider.tools.registry import ToolRegistry

LAYERS = 20
TOOLS = ("fetch", "transform", "report")
TARGET_10K_MS = 100.0


def make_registry() -> ToolRegistry:
    registry = ToolRegistry()
    for name in TOOLS:

        def tool(source: Any = None, limit: int = 10) -> dict[str, Any]:
            return {}

        registry.tool(tool, name=name, description=f"{name} something")
    return registry


def make_plan(size: int, seed: int = 0) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """A plan of ``size`` nodes in ``LAYERS`` layers, ~2 edges per node, and its edge list."""
    rng = random.Random(seed)
    ids = [str(i) for i in range(size)]
    rng.shuffle(ids)
    layer_of = [min(LAYERS - 1, i * LAYERS // size) for i in range(size)]
    first_of_layer = {layer: layer_of.index(layer) for layer in sorted(set(layer_of))}
    nodes: list[dict[str, Any]] = []
    edges: list[tuple[str, str]] = []
    for index, node_id in enumerate(ids):
        params: dict[str, Any] = {"limit": index % 50}
        layer = layer_of[index]
        if layer > 0:
            # one parent in the previous layer (so the plan has exactly LAYERS layers), one anywhere before
            previous = ids[rng.randrange(first_of_layer[layer - 1], first_of_layer[layer])]
            parents = {previous, ids[rng.randrange(first_of_layer[layer])]}
            edges += [(parent, node_id) for parent in sorted(parents)]
            if index % 10 == 0:
                params["source"] = f"${{{min(parents)}.rows}}"
        nodes.append(
            {"id": node_id, "action": f"step {node_id}", "tool": TOOLS[index % len(TOOLS)], "params": params}
        )
    plan = {
        "goal": f"benchmark plan of {size} nodes",
        "nodes": nodes,
        "edges": [{"from": s, "to": t} for s, t in edges],
    }
    return plan, edges


def measure(func: Callable[[], Any], repeat: int, *, gc_paused: bool = False) -> tuple[float, float, Any]:
    """Best wall time (s) over ``repeat`` runs, peak traced memory (MiB) of one run, and the result.

    ``gc_paused`` runs ``func`` with the cyclic garbage collector off, as ``validate_plan`` does itself.
    """
    best = float("inf")
    result: Any = None
    for _ in range(repeat):
        gc.collect()
        if gc_paused:
            gc.disable()
        start = time.perf_counter()
        result = func()
        best = min(best, time.perf_counter() - start)
        gc.enable()
    gc.collect()
    tracemalloc.start()
    func()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return best, peak / 2**20, result


def bench_size(size: int, registry: ToolRegistry, repeat: int, profile: bool) -> str:
    """One table row for a plan of ``size`` nodes (plus a cProfile listing when ``profile``)."""
    plan, edges = make_plan(size)
    limits = Limits(max_nodes=size)
    ours, ours_mib, validated = measure(lambda: validate_plan(plan, registry, limits), repeat)
    layers_s, _, _ = measure(lambda: topological_layers(validated.parents), repeat, gc_paused=True)

    def build() -> nx.DiGraph:
        graph = nx.DiGraph()
        graph.add_nodes_from(node["id"] for node in plan["nodes"])
        graph.add_edges_from(edges)
        return graph

    build_s, _, graph = measure(build, repeat, gc_paused=True)
    gen_s, _, generations = measure(
        lambda: [sorted(g) for g in nx.topological_generations(graph)], repeat, gc_paused=True
    )
    _, nx_mib, _ = measure(lambda: list(nx.topological_generations(build())), 1)
    if [sorted(layer) for layer in validated.layers] != generations:
        raise AssertionError(f"layers differ from networkx for {size} nodes")

    nx_total = build_s + gen_s
    row = (
        f"{size:>7} {len(edges):>7} {len(validated.layers):>6} | "
        f"{ours * 1e3:>9.1f} {layers_s * 1e3:>9.1f} {ours_mib:>8.1f} | "
        f"{build_s * 1e3:>8.1f} {gen_s * 1e3:>7.1f} {nx_total * 1e3:>8.1f} {nx_mib:>6.1f} | "
        f"{ours / nx_total:>12.1f} {layers_s / gen_s:>14.2f}"
    )
    if size == 10_000:
        verdict = "meets" if ours * 1e3 < TARGET_10K_MS else "MISSES"
        target = f"{TARGET_10K_MS:.0f} ms"
        row += f"\n{'':>7} 10k nodes: validate_plan {ours * 1e3:.1f} ms {verdict} the {target} target"
    if profile:
        profiler = cProfile.Profile()
        profiler.runcall(validate_plan, plan, registry, limits)
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(25)
        row += "\n" + out.getvalue()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per figure; the best is shown")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of validate_plan per size")
    args = parser.parse_args()
    header = (
        f"{'nodes':>7} {'edges':>7} {'layers':>6} | {'ours ms':>9} {'layers ms':>9} {'ours MiB':>8} | "
        f"{'nx build':>8} {'nx gen':>7} {'nx total':>8} {'nx MiB':>6} | "
        f"{'ours/nx total':>12} {'layers/nx gen':>14}"
    )
    print(header)
    print("-" * len(header))
    registry = make_registry()
    for size in args.sizes:
        print(bench_size(size, registry, args.repeat, args.profile), flush=True)


if __name__ == "__main__":
    main()
