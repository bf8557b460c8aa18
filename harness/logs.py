"""Error-level lines in the logs of an :class:`~harness.cluster.AirflowCluster`.

A cluster writes one log per component (``<component>.log``: structlog console lines, and Celery's own
``[date: LEVEL/process]`` lines in a worker's) and one per task try (JSON lines with a ``level``) under
``cluster.log_dir``. :func:`error_lines` finds every error or critical line there, and every Python
traceback, so a test can show that a normal session logs none::

    assert error_lines(cluster.log_dir) == []
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

__all__ = ["error_lines"]

_LEVELS = frozenset({"error", "critical", "exception", "fatal"})
# 2026-01-01T00:00:00.000000Z [error    ] message [logger] ...   (structlog's console renderer)
_CONSOLE = re.compile(r"^\S+\s+\[(?P<level>[a-z]+)\s*\]")
# [2026-01-01 00:00:00,000: ERROR/MainProcess] message           (Celery's worker log format)
_CELERY = re.compile(r"^\[[^\]]*: (?P<level>[A-Z]+)/[^\]]*\]")
# ERROR:    message                                               (Python's and uvicorn's default format)
_PLAIN = re.compile(r"^(?P<level>[A-Z]+):\s")


def _level(line: str) -> str | None:
    if line.startswith("{"):
        try:
            record = json.loads(line)
        except ValueError:
            return None
        return str(record.get("level", "")).lower() if isinstance(record, dict) else None
    for pattern in (_CONSOLE, _CELERY, _PLAIN):
        match = pattern.match(line)
        if match:
            return match["level"].lower()
    return None


def error_lines(log_dir: str | os.PathLike[str]) -> list[str]:
    """Every error-level or critical line, and every ``Traceback`` line, of the logs under ``log_dir``.

    Each is returned as ``<path relative to log_dir>: <line>``, in file and line order.
    """
    root = Path(log_dir)
    found: list[str] = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        with path.open(encoding="utf-8", errors="replace") as fh:
            for line in fh:
                text = line.rstrip("\n")
                if _level(text) in _LEVELS or text.startswith("Traceback (most recent call last)"):
                    found.append(f"{path.relative_to(root)}: {text}")
    return found
