"""A risky demo tool: publishing a written report to a team channel needs a human's approval.

Kept apart from :mod:`plan_demo.tools` so that only the DAG that offers it (``plan_and_publish``) asks
for approval; the investigation DAGs stay unattended.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from airflow_plan_provider.exceptions import PermanentToolError
from airflow_plan_provider.tools.registry import ToolRegistry
from plan_demo.tools import report_dir

registry = ToolRegistry()


@registry.tool(
    description="Publish a written report to a team channel (others will read it); needs approval.",
    needs_approval=True,
)
def publish_report(path: str, channel: str) -> dict:
    """Copy the report at ``path`` (a file under the report directory) to ``published/<channel>/``
    there, atomically; returns where it was published."""
    source = Path(path).resolve()
    reports = report_dir().resolve()
    if reports not in source.parents or not source.is_file():
        raise PermanentToolError(f"{path!r} is not a report written under {reports}")
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", channel).strip("-") or "general"
    target_dir = reports / "published" / name
    target_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{source.name}.", suffix=".tmp", dir=target_dir)
    os.close(fd)
    shutil.copyfile(source, tmp)
    target = target_dir / source.name
    os.replace(tmp, target)
    return {"published": str(target), "channel": channel}
