"""``make airflow`` (scripts/airflow_local.py): the local Airflow comes up with the example DAGs unpaused,
answers on its port, and SIGINT (Ctrl-C) stops every process it started while the home stays."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from harness.servers import free_port

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "airflow_local.py"


def _processes_with_home(home: Path) -> dict[int, str]:
    """Live processes whose environment has ``AIRFLOW_HOME=<home>``: every Airflow process of that home."""
    marker = f"AIRFLOW_HOME={home}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
    return found


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def test_local_airflow_starts_and_ctrl_c_stops_everything(tmp_path: Path) -> None:
    home, port = tmp_path / "home", free_port()
    out = tmp_path / "out.txt"
    with out.open("wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), "--port", str(port), "--home", str(home)],
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + 240
        while "\nready in" not in out.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        printed = out.read_text()
        assert "\nready in" in printed, printed
        base = f"http://127.0.0.1:{port}"
        assert base in printed and "every visitor is admin" in printed

        health = _get(f"{base}/api/v2/monitor/health")
        assert health["metadatabase"]["status"] == "healthy", health
        dags = {d["dag_id"]: d for d in _get(f"{base}/api/v2/dags")["dags"]}
        assert dags["plan_and_execute"]["is_paused"] is False  # triggerable at once
        started = _processes_with_home(home.resolve())
        assert len(started) >= 4, started  # api-server, scheduler, dag-processor, triggerer (+ children)
    finally:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=120)
    assert rc == 0, out.read_text()
    assert out.read_text().rstrip().endswith("stopped")
    assert _processes_with_home(home.resolve()) == {}
    assert (home / "airflow.db").is_file() and os.stat(home / "local_secrets.json").st_mode & 0o077 == 0
