"""A local Airflow to click around in: ``make airflow`` (or ``python scripts/airflow_local.py``).

Starts the api-server, scheduler, dag-processor and triggerer as separate processes on an embedded
SQLite home under the repository (``.airflow/``, kept between starts), with the example DAGs of
``dags/`` loaded and unpaused, and the UI on http://127.0.0.1:8080. The simple auth manager lets every
visitor in as admin (no login); the API server listens on 127.0.0.1 only. Ctrl-C (or SIGTERM) stops
every process this script started, and only those.

``AIRFLOW_CONN_PLAN_LLM_DEFAULT`` in the environment, if set, is passed on (the LLM DAG's connection).
``plan_over_mcp``'s connection, ``plan_demo_mcp``, starts the demo's MCP server over stdio
(``dags/plan_demo/mcp_server.py``), unless ``AIRFLOW_CONN_PLAN_DEMO_MCP`` names another.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import sys
import time
from base64 import urlsafe_b64encode
from pathlib import Path
from types import FrameType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: its harness package

from harness.cluster import AirflowCluster, ClusterError

ROOT = Path(__file__).resolve().parents[1]
DAG_ID = "plan_and_execute"


def _stable_secrets(home: Path) -> dict[str, str]:
    """Keys that must not change between starts of one home (the Fernet key decrypts stored
    connections and variables), created once in ``<home>/local_secrets.json`` (mode 600)."""
    path = home / "local_secrets.json"
    if not path.exists():
        values = {
            "AIRFLOW__CORE__FERNET_KEY": urlsafe_b64encode(os.urandom(32)).decode(),
            "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(64),
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(64),
        }
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(values, fh)
    return dict(json.loads(path.read_text()))


def _port_taken(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _stop_on(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it is below it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _demo_mcp_connection() -> str:
    """The demo MCP server's connection: its stdio server, started by each call with this interpreter."""
    sys.path.insert(0, str(ROOT / "dags"))
    from plan_demo.mcp_server import connection

    return connection()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8080, help="UI and API port on 127.0.0.1 (8080)")
    parser.add_argument("--home", type=Path, default=ROOT / ".airflow", help="AIRFLOW_HOME (.airflow)")
    args = parser.parse_args(argv)
    home = args.home.resolve()
    home.mkdir(parents=True, exist_ok=True)
    if _port_taken(args.port):
        print(f"port {args.port} is in use; choose another: make airflow PORT=8081", file=sys.stderr)
        return 2

    # Installed even where the shell started us with SIGINT ignored (a background job).
    signal.signal(signal.SIGINT, _stop_on)
    signal.signal(signal.SIGTERM, _stop_on)
    env = _stable_secrets(home) | {
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW_CONN_PLAN_DEMO_MCP": os.environ.get("AIRFLOW_CONN_PLAN_DEMO_MCP") or _demo_mcp_connection(),
    }
    cluster = AirflowCluster(ROOT / "dags", home=home, port=args.port, env=env, startup_timeout=180)
    url = cluster.base_url
    code = 0
    try:
        print(f"starting Airflow (api-server, scheduler, dag-processor, triggerer) in {_shown(home)} ...")
        started = time.monotonic()
        cluster.start()
        cluster.wait_for_dag(DAG_ID, timeout=180)
        dags = sorted(d["dag_id"] for d in cluster.api("GET", "/dags", params={"limit": 100})["dags"])
        print(
            f"\nready in {time.monotonic() - started:.0f} s: {url}\n"
            f"  login:  none needed, every visitor is admin (simple auth manager; listening on 127.0.0.1)\n"
            f"  DAGs:   {', '.join(dags)} (from {_shown(ROOT / 'dags')})\n"
            f"  try:    {url}/dags/{DAG_ID} -> Trigger -> keep the goal -> Trigger\n"
            f"  REST:   curl -X POST {url}/api/v2/dags/{DAG_ID}/dagRuns "
            "-H 'Content-Type: application/json' -d '{\"logical_date\": null}'\n"
            f"  home:   {_shown(home)} (kept between starts; logs in {_shown(cluster.log_dir)})\n"
            "Ctrl-C stops every process started here.",
            flush=True,
        )
        while True:
            time.sleep(1)
            cluster.check_alive()
    except KeyboardInterrupt:
        pass
    except ClusterError as error:
        print(error, file=sys.stderr)
        code = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("\nstopping ...", flush=True)
        cluster.stop()
        print("stopped", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
