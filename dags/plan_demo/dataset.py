"""The demo's data: a week of payment-api telemetry in a small SQLite database.

The story the data tells: yesterday between 14:00 and 16:00 UTC the downstream dependency
``fraud-check`` degraded (p99 latency up tenfold, timeouts), and payment-api's p99 rose in the same
hours because fraud-check sits on its request path. There was no deploy yesterday. Earlier days hold
ordinary noise, a few unrelated deploys and an unrelated ledger-db blip.

Dates are relative to today's date (UTC), so "yesterday" always has data. The values come from a
seeded random generator and do not depend on the date, so two builds on the same day are identical.

Tables::

    meta(key, value)                                   anchor date, schema version, seed
    latency(service, day, hour, p50_ms, p95_ms, p99_ms, requests)
    dependency_health(service, dependency, day, hour, p99_ms, error_rate, timeouts)
    deploys(id, service, deployed_at, version, author, description)
    error_logs(id, service, ts, level, message)
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import sqlite3
import tempfile
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

SERVICE = "payment-api"
DEPENDENCIES = ("fraud-check", "ledger-db", "card-network")
INCIDENT_DEPENDENCY = "fraud-check"
INCIDENT_HOURS = (14, 15)
HISTORY_DAYS = 7  # yesterday and the six days before it; today has no data yet
SEED = 20240611
SCHEMA_VERSION = "1"

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE latency (
    service TEXT NOT NULL, day TEXT NOT NULL, hour INTEGER NOT NULL,
    p50_ms REAL NOT NULL, p95_ms REAL NOT NULL, p99_ms REAL NOT NULL, requests INTEGER NOT NULL,
    PRIMARY KEY (service, day, hour));
CREATE TABLE dependency_health (
    service TEXT NOT NULL, dependency TEXT NOT NULL, day TEXT NOT NULL, hour INTEGER NOT NULL,
    p99_ms REAL NOT NULL, error_rate REAL NOT NULL, timeouts INTEGER NOT NULL,
    PRIMARY KEY (service, dependency, day, hour));
CREATE TABLE deploys (
    id INTEGER PRIMARY KEY, service TEXT NOT NULL, deployed_at TEXT NOT NULL,
    version TEXT NOT NULL, author TEXT NOT NULL, description TEXT NOT NULL);
CREATE TABLE error_logs (
    id INTEGER PRIMARY KEY, service TEXT NOT NULL, ts TEXT NOT NULL,
    level TEXT NOT NULL, message TEXT NOT NULL);
CREATE INDEX error_logs_by_time ON error_logs (service, ts);
"""

# (days before today, HH:MM, service, version, author, description); none on day 1 (yesterday)
_DEPLOYS = (
    (6, "10:05", "payment-api", "v2.13.0", "a.okafor", "Add idempotency keys to the refund endpoint"),
    (5, "09:30", "fraud-check", "v5.2.0", "m.chen", "Weekly risk model retrain"),
    (4, "15:40", "payment-api", "v2.14.0", "j.silva", "Upgrade the HTTP client library"),
    (3, "11:00", "ledger-db", "schema-118", "dba-bot", "Add index on ledger_entries(account_id)"),
    (2, "11:20", "payment-api", "v2.14.1", "j.silva", "Hotfix: read connection pool size from config"),
)

_BACKGROUND_ERRORS = (
    ("WARN", "card-network declined authorization: issuer unavailable (code 91)"),
    ("ERROR", "ledger-db connection reset by peer; retrying"),
    ("WARN", "request validation failed: missing field 'currency'"),
    ("ERROR", "webhook delivery to merchant failed with HTTP 502"),
)
_INCIDENT_ERRORS = (
    ("ERROR", "upstream timeout calling fraud-check after 800 ms", {14: 46, 15: 61}),
    ("ERROR", "circuit breaker open for fraud-check; routing to manual review", {14: 6, 15: 9}),
)


def today_utc() -> date:
    """Today's date in UTC: the anchor every relative day in the dataset is computed from."""
    return datetime.now(UTC).date()


def default_path() -> Path:
    """``$PLAN_DEMO_DB``, else ``<AIRFLOW_HOME or ~/airflow>/plan_demo/demo.sqlite``."""
    if os.environ.get("PLAN_DEMO_DB"):
        return Path(os.environ["PLAN_DEMO_DB"]).expanduser()
    home = Path(os.environ.get("AIRFLOW_HOME") or Path.home() / "airflow").expanduser()
    return home / "plan_demo" / "demo.sqlite"


def _load(hour: int) -> float:
    """Share of peak traffic in an hour: quiet at night, busiest in the afternoon (0.3 to 1.0)."""
    return 0.3 + 0.7 * max(0.0, math.sin(math.pi * (hour - 5) / 19))


def _health_rows(rng: random.Random, day: date, days_ago: int) -> list[tuple]:
    rows = []
    for hour in range(24):
        load = _load(hour)
        # Draw every noise value up front so the sequence does not depend on which branch runs.
        noise = [rng.gauss(0, 1) for _ in range(3)]
        rates = [rng.random() for _ in range(3)]
        fraud = [70 + 20 * load + 4 * noise[0], 0.001 + 0.002 * rates[0], rng.randint(0, 2)]
        ledger = [14 + 6 * load + 1.5 * noise[1], 0.0005 + 0.001 * rates[1], 0]
        card = [190 + 30 * load + 10 * noise[2], 0.003 + 0.003 * rates[2], rng.randint(0, 1)]
        if days_ago == 1 and hour in INCIDENT_HOURS:
            fraud = [{14: 940.0, 15: 1120.0}[hour] + 8 * noise[0], {14: 0.081, 15: 0.118}[hour], 0]
            fraud[2] = round(fraud[1] * 9000 * load)
        if days_ago == 1 and hour == 9:
            card[0] = 320.0  # a small card-network blip that payment-api barely notices
        if days_ago == 4 and hour == 3:
            ledger[0] = 61.0  # an unrelated ledger-db blip on an earlier day
        for name, (p99, rate, timeouts) in zip(DEPENDENCIES, (fraud, ledger, card), strict=True):
            rows.append((SERVICE, name, day.isoformat(), hour, round(p99, 1), round(rate, 4), int(timeouts)))
    return rows


def _latency_rows(rng: random.Random, day: date, health: list[tuple]) -> list[tuple]:
    p99_of = {(row[1], row[3]): row[4] for row in health}
    rows = []
    for hour in range(24):
        load = _load(hour)
        noise = [rng.gauss(0, 1) for _ in range(3)]
        requests = int(9000 * load) + rng.randint(-300, 300)
        p50 = 38 + 18 * load + 2 * noise[0]
        p95 = p50 * 2.3 + 5 * noise[1]
        p99 = p50 * 4.1 + 8 * noise[2]
        # fraud-check is called on every payment, so its slowness adds to payment-api's tail directly;
        # card-network is called only for a share of requests.
        fraud_extra = max(0.0, p99_of[("fraud-check", hour)] - 100)
        card_extra = max(0.0, p99_of[("card-network", hour)] - 260)
        p50 += 0.08 * fraud_extra
        p95 += 0.7 * fraud_extra + 0.2 * card_extra
        p99 += 1.1 * fraud_extra + 0.4 * card_extra
        rows.append((SERVICE, day.isoformat(), hour, round(p50, 1), round(p95, 1), round(p99, 1), requests))
    return rows


def _error_rows(rng: random.Random, day: date, days_ago: int) -> list[tuple]:
    rows = []
    for hour in range(24):
        events = [rng.choice(_BACKGROUND_ERRORS) for _ in range(rng.randint(0, 3))]
        if days_ago == 1 and hour in INCIDENT_HOURS:
            events += [(level, text) for level, text, counts in _INCIDENT_ERRORS for _ in range(counts[hour])]
        for level, text in events:
            stamp = datetime(day.year, day.month, day.day, hour, rng.randrange(60), rng.randrange(60))
            message = f"{text} request_id={rng.getrandbits(32):08x}"
            rows.append((SERVICE, stamp.strftime("%Y-%m-%dT%H:%M:%SZ"), level, message))
    return sorted(rows, key=lambda row: row[1])


def build_dataset(path: str | Path, today: date | None = None) -> Path:
    """Write the demo database to ``path`` (which must not hold a database yet), anchored at ``today``."""
    anchor = today or today_utc()
    rng = random.Random(SEED)
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.executescript(_SCHEMA)
        conn.executemany(
            "INSERT INTO meta VALUES (?, ?)",
            [("anchor", anchor.isoformat()), ("schema_version", SCHEMA_VERSION), ("seed", str(SEED))],
        )
        for days_ago in range(HISTORY_DAYS, 0, -1):
            day = anchor - timedelta(days=days_ago)
            health = _health_rows(rng, day, days_ago)
            conn.executemany("INSERT INTO dependency_health VALUES (?, ?, ?, ?, ?, ?, ?)", health)
            conn.executemany(
                "INSERT INTO latency VALUES (?, ?, ?, ?, ?, ?, ?)", _latency_rows(rng, day, health)
            )
            conn.executemany(
                "INSERT INTO error_logs (service, ts, level, message) VALUES (?, ?, ?, ?)",
                _error_rows(rng, day, days_ago),
            )
        conn.executemany(
            "INSERT INTO deploys (service, deployed_at, version, author, description) VALUES (?, ?, ?, ?, ?)",
            [
                (service, f"{(anchor - timedelta(days=ago)).isoformat()}T{hhmm}:00Z", version, author, text)
                for ago, hhmm, service, version, author, text in _DEPLOYS
            ],
        )
    return Path(path)


def _is_current(path: Path, anchor: date) -> bool:
    if not path.is_file():
        return False
    try:
        with contextlib.closing(connect(path)) as conn:
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.Error:
        return False
    return meta.get("anchor") == anchor.isoformat() and meta.get("schema_version") == SCHEMA_VERSION


def ensure_dataset(path: str | Path | None = None) -> Path:
    """The demo database's path, building it first when it is missing or was built on another day.

    Safe under concurrent callers: each builds into its own temporary file next to the target and
    renames it into place atomically, so a reader never sees a half-written database.
    """
    target = Path(path).expanduser() if path else default_path()
    anchor = today_utc()
    if _is_current(target, anchor):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        build_dataset(tmp, anchor)
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return target


def connect(path: str | Path | None = None) -> sqlite3.Connection:
    """A read-only connection to the demo database (built first if needed), rows as ``sqlite3.Row``."""
    target = Path(path).expanduser() if path else ensure_dataset()
    conn = sqlite3.connect(f"{target.resolve().as_uri()}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    return conn
