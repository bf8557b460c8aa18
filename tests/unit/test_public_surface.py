"""The package's public names: loaded lazily at run time, real types for type checkers."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import airflow_plan_provider

INIT = Path(airflow_plan_provider.__file__)


def type_checking_imports() -> dict[str, str]:
    """Name → module of every import inside ``if TYPE_CHECKING:`` in the package's ``__init__``."""
    tree = ast.parse(INIT.read_text())
    imported: dict[str, str] = {}
    for statement in tree.body:
        if isinstance(statement, ast.If) and ast.unparse(statement.test) == "TYPE_CHECKING":
            for node in statement.body:
                assert isinstance(node, ast.ImportFrom) and node.module, ast.unparse(node)
                for alias in node.names:
                    imported[alias.asname or alias.name] = node.module
    return imported


def test_every_lazy_export_is_imported_for_type_checkers() -> None:
    # a name missing from the TYPE_CHECKING block is `Any` to mypy and pyright although py.typed ships
    assert type_checking_imports() == airflow_plan_provider._EXPORTS
    assert airflow_plan_provider.__all__ == sorted(airflow_plan_provider._EXPORTS)


def test_every_public_name_resolves_to_the_object_its_module_defines() -> None:
    import importlib

    for name, module in airflow_plan_provider._EXPORTS.items():
        assert getattr(airflow_plan_provider, name) is getattr(importlib.import_module(module), name)


def test_public_names_have_real_types_for_mypy(tmp_path: Path) -> None:
    client = tmp_path / "client.py"
    client.write_text(
        "from airflow_plan_provider import ToolRegistry, build_plan_dag\n"
        "reveal_type(build_plan_dag)\n"
        "reveal_type(ToolRegistry)\n"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--ignore-missing-imports",
            "--follow-imports=silent",
            str(client),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"MYPYPATH": str(INIT.parents[1]), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    revealed = [
        line.split("Revealed type is ", 1)[1] for line in result.stdout.splitlines() if "Revealed" in line
    ]
    assert len(revealed) == 2, result.stdout + result.stderr
    assert revealed[0].startswith('"def (dag_id: str')
    assert revealed[0].endswith('-> airflow.sdk.definitions.dag.DAG"')
    assert revealed[1].endswith('-> airflow_plan_provider.tools.registry.ToolRegistry"')
    assert "error:" not in result.stdout, result.stdout
