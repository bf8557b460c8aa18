"""The pure core (``airflow_plan_provider/plan/``) imports only itself, ``tools/`` and the exceptions:
never the settings objects, the planners, the local runner or any Airflow adapter (read from the source,
so an import inside a function counts too)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "airflow_plan_provider"
ALLOWED = ("airflow_plan_provider.plan", "airflow_plan_provider.tools", "airflow_plan_provider.exceptions")


def package_imports(path: Path) -> set[str]:
    """The modules of this package that ``path`` imports (``from x import y`` counts as ``x``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.startswith("airflow_plan_provider")}


def test_the_core_imports_only_the_core_tools_and_exceptions() -> None:
    outside = {
        f"{path.name} -> {name}"
        for path in sorted((PACKAGE / "plan").glob("*.py"))
        for name in package_imports(path)
        if not any(name == allowed or name.startswith(f"{allowed}.") for allowed in ALLOWED)
    }
    assert outside == set()


def test_the_node_step_is_in_the_core_and_both_hosts_import_it() -> None:
    step = "airflow_plan_provider.plan.node_step"
    assert step in package_imports(PACKAGE / "operators" / "node.py")
    assert step in package_imports(PACKAGE / "local_runner.py")
