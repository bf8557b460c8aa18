"""The package's import graph (files as nodes, imports as edges, those inside functions too) keeps its floors.

Each rule forbids edges from one set of files to another; a rule is one more line in :data:`RULES`. Every
file stands on one of :data:`FLOORS` and imports nothing on a floor above its own, and no files import
each other in a loop.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "airflow_plan_provider"


@dataclass(frozen=True)
class Rule:
    """No file matching ``sources`` imports a file matching ``targets`` (paths inside the package, glob
    patterns)."""

    name: str
    sources: tuple[str, ...]
    targets: tuple[str, ...]


RULES = [
    Rule("the plugin and freeze read runs through the contract, not the operators",
         ("plugins/*", "freeze.py"), ("operators/*",)),
    Rule("the pure core knows neither the settings nor the planners",
         ("plan/*",), ("settings.py", "planners/*")),
]  # fmt: skip
#: all the pure core (``plan/``) may import of the package: itself, the tools, the models' base, the
#: exceptions and the problems they carry
CORE_MAY_IMPORT = ("plan/*", "tools/*", "base_model.py", "exceptions.py", "problems.py")
#: the package's files by floor, the ground first: a file imports files of its own floor or below
FLOORS = [
    ("exceptions.py", "problems.py", "provider_info.py", "airflow_features.py", "base_model.py"),
    ("compat.py",),
    ("tools/*", "hooks/*"),
    ("plan/*",),
    ("contract.py", "artifacts.py", "planners/*"),
    ("settings.py", "trigger_form.py", "triggers/*", "sessions_in_turn.py", "freeze.py", "testing/*"),
    ("operators/*", "local_runner.py"),
    ("dag_factory.py", "cli.py"),
    ("__init__.py", "preload.py"),
    ("plugins/*", "celery_imports.py"),
]  # fmt: skip


def module_file(module: str) -> str | None:
    """The package file (path inside the package) of a dotted module name, or None when not ours."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    base = ROOT.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate.relative_to(ROOT / PACKAGE).as_posix()
    return None


def imported_modules(source: str, package: tuple[str, ...]) -> set[str]:
    """Every module a file of ``package`` (its dotted parts) with this source imports, anywhere in the
    file: ``import a.b``; ``from a import b`` gives ``a.b`` (kept when it is a module) and ``a``, unless
    every name it takes is a module of ours (``from airflow_plan_provider import artifacts`` uses the
    package only as the path to ``artifacts``); relative imports resolved."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            anchor = package[: len(package) - node.level + 1] if node.level else ()
            base = ".".join([*anchor, *(node.module.split(".") if node.module else [])])
            names = [f"{base}.{alias.name}" for alias in node.names]
            found.update(names)
            if not all(module_file(name) for name in names):
                found.add(base)
    return found


def import_graph() -> dict[str, set[str]]:
    """File → the package files it imports (paths inside the package)."""
    graph: dict[str, set[str]] = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        package = path.relative_to(ROOT).parts[:-1]
        modules = imported_modules(path.read_text(encoding="utf-8"), package)
        targets = {module_file(module) for module in modules}
        graph[path.relative_to(ROOT / PACKAGE).as_posix()] = {t for t in targets if t is not None}
    return graph


def matches(path: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch(path, pattern) for pattern in patterns)


def floor(path: str) -> int:
    """The floor of a package file (0 is the ground)."""
    return next(number for number, patterns in enumerate(FLOORS) if matches(path, patterns))


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Each import of a file on a floor above the importer's."""
    return sorted(
        (source, target)
        for source, targets in graph.items()
        for target in targets
        if floor(target) > floor(source)
    )


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import loops, each as the sorted files that all reach one another."""
    reach = {source: _reachable(graph, source) for source in graph}
    loops = {
        frozenset({source} | {other for other in reach[source] if source in reach[other]})
        for source in graph
        if source in reach[source]
    }
    return sorted(sorted(loop) for loop in loops)


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """The files ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for target in graph.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def violations(graph: dict[str, set[str]], rule: Rule) -> list[tuple[str, str]]:
    return sorted(
        (source, target)
        for source, targets in graph.items()
        if matches(source, rule.sources)
        for target in targets
        if matches(target, rule.targets)
    )


def test_the_graph_sees_every_kind_of_import() -> None:
    graph = import_graph()
    assert "contract.py" in graph["freeze.py"]  # a module-level ``from ... import``
    assert "plugins/app.py" in graph["plugins/plugin.py"]  # an import inside a function
    assert "operators/layout.py" in graph["operators/node.py"]
    assert {"plan/model.py", "plan/session.py"} <= graph["contract.py"]
    for rule in RULES:  # a rule whose patterns match no file would hold for nothing
        assert any(matches(path, rule.sources) for path in graph), rule.name
        assert any(matches(path, rule.targets) for path in graph), rule.name


def test_a_forbidden_edge_is_found() -> None:
    graph = {"plugins/data.py": {"operators/layout.py", "contract.py"}, "freeze.py": {"contract.py"}}
    assert violations(graph, RULES[0]) == [("plugins/data.py", "operators/layout.py")]


def test_relative_and_function_level_imports_are_found() -> None:
    source = "def f():\n    from .layout import pull_plan\n    from .. import contract\n    import json\n"
    modules = imported_modules(source, (PACKAGE, "operators"))
    assert {f"{PACKAGE}.operators.layout", f"{PACKAGE}.contract", "json"} <= modules
    assert module_file(f"{PACKAGE}.operators.layout.pull_plan") is None  # a name, not a module
    assert module_file(f"{PACKAGE}.operators.layout") == "operators/layout.py"
    assert module_file(f"{PACKAGE}.plugins") == "plugins/__init__.py"


def test_no_import_breaks_a_rule() -> None:
    graph = import_graph()
    broken = {rule.name: found for rule in RULES if (found := violations(graph, rule))}
    assert broken == {}


def test_the_core_imports_only_itself_the_tools_and_the_exceptions() -> None:
    """Never the settings, the planners, the local runner, the contract or an Airflow adapter."""
    graph = import_graph()
    outside = sorted(
        (source, target)
        for source, targets in graph.items()
        if matches(source, ("plan/*",))
        for target in targets
        if not matches(target, CORE_MAY_IMPORT)
    )
    assert outside == []


def test_both_hosts_run_the_one_node_step() -> None:
    graph = import_graph()
    assert "plan/node_step.py" in graph["operators/node.py"]
    assert "plan/node_step.py" in graph["local_runner.py"]


def test_every_file_stands_on_a_floor_and_imports_nothing_above_it() -> None:
    graph = import_graph()
    assert [path for path in graph if not any(matches(path, patterns) for patterns in FLOORS)] == []
    assert upward_imports(graph) == []


def test_no_files_import_each_other_in_a_loop() -> None:
    assert cycles(import_graph()) == []


def test_an_upward_import_and_a_loop_are_found() -> None:
    graph = {
        "exceptions.py": {"plan/problems.py"},
        "plan/problems.py": set(),
        "plugins/app.py": {"plugins/plugin.py", "contract.py"},
        "plugins/plugin.py": {"plugins/app.py"},
        "contract.py": {"exceptions.py"},
    }
    assert upward_imports(graph) == [("exceptions.py", "plan/problems.py")]
    assert cycles(graph) == [["plugins/app.py", "plugins/plugin.py"]]
    graph["exceptions.py"] = {"contract.py"}  # a loop across floors
    assert cycles(graph) == [["contract.py", "exceptions.py"], ["plugins/app.py", "plugins/plugin.py"]]
