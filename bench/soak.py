"""Soak: plan sessions started continuously on CeleryExecutor while a random fault strikes every few minutes.

One deployment (a PostgreSQL server and a Redis server of its own, two Celery workers, the fault settings of
docker-compose.yml) runs two phases of the same load, one after the other: with faults, then without.
A session of the ``waits`` plan of tests/e2e/dags/fault_dags.py (a node working, two waiting for it in
their slots, an asynchronous job, a node deferred after it, a join) starts every ``--every`` seconds.
In the faulty phase, every 2-4 minutes (``--fault-min``/``--fault-max``) one fault strikes, at random:
the API server killed and started again 10 s later (or 30 s later), the triggerer killed and started
again 10 s later, PostgreSQL stopped for 20 s, Redis stopped for 10 s (as tests/e2e/test_faults_*.py).
A component that exits is started again (a restart policy).

Printed per phase: sessions started / completed / lost (not completed, or completed otherwise than
``goal_met``), nodes redone (a tool called twice for one idempotency key), duplicate side effects, tasks
that needed a second try, and the p50 / p95 session duration (the run's start to its end); then the
faults struck and the ratio of the faulty phase's p50 / p95 to the quiet phase's. Target: 0 lost, 0
redone, 0 duplicates. Not run by CI.

Run::

    .venv/bin/python bench/soak.py --minutes 30      # each phase 30 minutes
    .venv/bin/python bench/soak.py --minutes 30 --quiet-minutes 15   # a shorter phase without faults
    .venv/bin/python bench/soak.py --minutes 3 --fault-min 40 --fault-max 60   # a quick check
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


from airflow_plan_provider.testing.scripted import CallLog  # noqa: E402
from harness.cluster import AirflowCluster  # noqa: E402
from harness.deploy import fault_settings  # noqa: E402
from harness.postgres import PostgresDatabase  # noqa: E402
from harness.servers import PostgresServer, RedisServer  # noqa: E402

DAG_FILE = ROOT / "tests" / "e2e" / "dags" / "fault_dags.py"
DAG_ID = "e2e_fault_soak"  # built by that file
#: seconds each fault keeps its service away
OUTAGE = {"api_server": 10.0, "api_server_long": 30.0, "triggerer": 10.0, "database": 20.0, "broker": 10.0}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def stamp(value: str | None) -> float | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() if value else None


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


class Soak:
    def __init__(self, cluster: AirflowCluster, postgres: PostgresServer, redis: RedisServer, calls: Path):
        self.cluster, self.postgres, self.redis = cluster, postgres, redis
        self.log = CallLog(calls / DAG_ID)
        self.faults: list[tuple[str, float]] = []

    # ------------------------------------------------------------------ faults

    def away(self, stop: Callable[[], None], start: Callable[[], None], seconds: float) -> None:
        stop()
        time.sleep(seconds)
        start()

    def strike(self, rng: random.Random) -> None:
        cluster = self.cluster
        faults: dict[str, tuple[Callable[[], None], Callable[[], None]]] = {
            "api_server": (lambda: cluster.kill("api-server"), lambda: cluster.restart("api-server")),
            "api_server_long": (lambda: cluster.kill("api-server"), lambda: cluster.restart("api-server")),
            "triggerer": (lambda: cluster.kill("triggerer"), lambda: cluster.restart("triggerer")),
            "database": (self.postgres.stop, self.postgres.start),
            "broker": (self.redis.stop, self.redis.start),
        }
        name = rng.choice(sorted(faults))
        began = time.monotonic()
        log(f"fault: {name}")
        self.away(*faults[name], OUTAGE[name])
        self.faults.append((name, time.monotonic() - began))

    # ------------------------------------------------------------------ load

    def trigger(self, seconds: float) -> str | None:
        try:
            return self.cluster.trigger(DAG_ID, {"goal": "soak", "scenario": "waits", "seconds": seconds})
        except Exception as error:  # the API server or its database away: this start is lost to the fault
            log(f"could not start a session: {error!r}"[:300])
            return None

    def phase(self, name: str, args: argparse.Namespace, faults: bool, rng: random.Random) -> dict[str, Any]:
        minutes = args.minutes if faults else args.quiet_minutes or args.minutes
        log(f"phase {name}: {minutes} min, a session every {args.every} s, faults {faults}")
        runs: list[str] = []
        failed_starts = 0
        end = time.monotonic() + minutes * 60
        next_start = time.monotonic()
        next_fault = time.monotonic() + rng.uniform(args.fault_min, args.fault_max)
        while time.monotonic() < end:
            now = time.monotonic()
            if now >= next_start:
                run_id = self.trigger(args.seconds)
                if run_id is None:
                    failed_starts += 1
                else:
                    runs.append(run_id)
                next_start = now + args.every
            if faults and now >= next_fault:
                self.strike(rng)
                next_fault = time.monotonic() + rng.uniform(args.fault_min, args.fault_max)
            revived = self.cluster.revive()
            if revived:
                log(f"started again (restart policy): {revived}")
            time.sleep(0.5)
        return self.settle(name, runs, failed_starts, args.drain)

    def settle(self, name: str, runs: list[str], failed_starts: int, drain: float) -> dict[str, Any]:
        log(f"phase {name}: waiting up to {drain:.0f} s for {len(runs)} sessions to end")
        states: dict[str, str] = {}
        deadline = time.monotonic() + drain
        while time.monotonic() < deadline and len(states) < len(runs):
            self.cluster.revive()
            for run_id in runs:
                if run_id in states:
                    continue
                try:
                    state = self.cluster.get_run(DAG_ID, run_id)["state"]
                except Exception:
                    break
                if state in ("success", "failed"):
                    states[run_id] = state
            time.sleep(2)
        durations, completed, tries = [], 0, 0
        for run_id in runs:
            run = self.cluster.get_run(DAG_ID, run_id)
            result = self.cluster.session_result(DAG_ID, run_id)
            if result is not None and (result.status, result.reason) == ("completed", "goal_met"):
                completed += 1
                began, ended = stamp(run.get("start_date")), stamp(run.get("end_date"))
                if began and ended:
                    durations.append(ended - began)
            tries += sum(1 for ti in self.cluster.task_instances(DAG_ID, run_id) if ti["try_number"] > 1)
        prefixes = tuple(f"{DAG_ID}/{run_id}/" for run_id in runs)
        calls = Counter(c["key"] for c in self.log.calls() if c["key"].startswith(prefixes))
        effects = Counter(e["key"] for e in self.log.side_effects() if e["key"].startswith(prefixes))
        return {
            "phase": name,
            "started": len(runs),
            "not started": failed_starts,
            "completed": completed,
            "lost": len(runs) - completed,
            "redone": sum(n - 1 for n in calls.values() if n > 1),
            "duplicates": sum(n - 1 for n in effects.values() if n > 1),
            "retried tasks": tries,
            "p50 s": percentile(durations, 50),
            "p95 s": percentile(durations, 95),
        }


def fmt(value: Any) -> str:
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="length of the phase with faults")
    parser.add_argument(
        "--quiet-minutes", type=float, help="length of the phase without faults (default: --minutes)"
    )
    parser.add_argument("--every", type=float, default=30.0, help="seconds between two session starts")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long a session's slow node works")
    parser.add_argument("--fault-min", type=float, default=120.0, help="least seconds between two faults")
    parser.add_argument("--fault-max", type=float, default=240.0, help="most seconds between two faults")
    parser.add_argument("--drain", type=float, default=600.0, help="seconds a phase waits for its sessions")
    parser.add_argument("--seed", type=int, default=24)
    args = parser.parse_args()
    rng = random.Random(args.seed)

    base = Path(tempfile.mkdtemp(prefix="plan-soak-"))
    dags = base / "dags"
    dags.mkdir()
    (dags / DAG_FILE.name).write_text(DAG_FILE.read_text())
    env = fault_settings() | {"PLAN_E2E_CALL_LOG": str(base / "calls")}
    with (
        PostgresServer() as postgres,
        RedisServer() as redis,
        PostgresDatabase(postgres.url, prefix="plan_soak") as db,
        AirflowCluster(
            dags,
            env=env,
            parallelism=16,
            database_url=db.url,
            broker_url=redis.url,
            celery_workers=("worker-a", "worker-b"),
            worker_concurrency=8,
        ) as cluster,
    ):
        cluster.wait_for_dag(DAG_ID, timeout=180)
        cluster.unpause(DAG_ID)
        soak = Soak(cluster, postgres, redis, base / "calls")
        rows = [soak.phase("faults", args, True, rng), soak.phase("quiet", args, False, rng)]
    shutil.rmtree(base, ignore_errors=True)  # the DAG's copy and the call log (left when it fails: to read)
    print()
    print(f"faults struck: {len(soak.faults)} {Counter(name for name, _ in soak.faults)}")
    print(f"each fault's outage (s): {[round(seconds, 1) for _, seconds in soak.faults]}")
    keys = list(rows[0])
    print(" | ".join(keys))
    for row in rows:
        print(" | ".join(fmt(row[k]) for k in keys))
    faulty, quiet = rows
    for q in ("p50 s", "p95 s"):
        if faulty[q] and quiet[q]:
            print(f"{q} faults / quiet: {faulty[q] / quiet[q]:.2f}")
    print(json.dumps({"args": vars(args), "rows": rows, "faults": soak.faults}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
