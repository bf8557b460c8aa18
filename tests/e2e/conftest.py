"""Shared by the end-to-end tests: the local services the distributed (CeleryExecutor) tests need."""

from __future__ import annotations

import os
import socket

import pytest


def _reachable(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def require_postgres_and_redis() -> None:
    """Skip outside CI when PostgreSQL or Redis is not running on 127.0.0.1 (``.ci/run`` starts them);
    under CI the test goes on and fails loudly instead."""
    down = [name for name, port in (("PostgreSQL", 5432), ("Redis", 6379)) if not _reachable(port)]
    if down and not os.environ.get("CI"):
        pytest.skip(f"{' and '.join(down)} not running on 127.0.0.1 (.ci/run starts them)")
