"""Airflow's StatsD metrics, received by a benchmark on 127.0.0.1: what the scheduler says its loops took.

Every process of a benchmark's cluster sends its metrics here (``[metrics] statsd_on``, host, port,
prefix ``airflow``). The scheduler times each scheduling loop as ``scheduler.scheduler_loop_duration``
(the work of one loop: examining the running DAG runs and their task instances, queueing what can run,
the executor's heartbeat and events; not the idle sleep between loops), so the loops that fall inside a
run's window are what that run cost the scheduler.
"""

from __future__ import annotations

import math
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

PREFIX = "airflow"
SCHEDULER_LOOP = "scheduler.scheduler_loop_duration"


class StatsdReceiver:
    """A UDP socket on 127.0.0.1 and a thread keeping every timing it receives with its arrival time."""

    def __init__(self) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._socket.bind(("127.0.0.1", 0))
        self._socket.settimeout(0.5)
        self._timings: list[tuple[float, str, float]] = []  # (arrival, metric name, ms)
        self._lock = threading.Lock()
        self._open = True
        self._thread = threading.Thread(target=self._receive, name="statsd-receiver", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._socket.getsockname()[1])

    def env(self) -> dict[str, str]:
        """The environment that points a cluster's processes' StatsD client here."""
        return {
            "AIRFLOW__METRICS__STATSD_ON": "True",
            "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
            "AIRFLOW__METRICS__STATSD_PORT": str(self.port),
            "AIRFLOW__METRICS__STATSD_PREFIX": PREFIX,
        }

    def timings(self, name: str, start: float, end: float) -> list[float]:
        """The milliseconds of metric ``name`` (without the prefix) that arrived between the epoch
        seconds ``start`` and ``end``."""
        wanted = f"{PREFIX}.{name}"
        with self._lock:
            return [ms for at, metric, ms in self._timings if metric == wanted and start <= at <= end]

    def close(self) -> None:
        self._open = False
        self._thread.join(timeout=2)
        self._socket.close()

    def _receive(self) -> None:
        while self._open:
            try:
                packet = self._socket.recv(65535)
            except (TimeoutError, OSError):
                continue
            arrived = time.time()
            found = []
            for line in packet.decode(errors="replace").splitlines():
                # name:value|ms (timings only; counters and gauges are not kept)
                name, _, rest = line.partition(":")
                value, _, kind = rest.partition("|")
                if kind.split("|")[0] == "ms":
                    try:
                        found.append((arrived, name, float(value)))
                    except ValueError:
                        continue
            if found:
                with self._lock:
                    self._timings.extend(found)


@contextmanager
def receiving() -> Iterator[StatsdReceiver]:
    receiver = StatsdReceiver()
    try:
        yield receiver
    finally:
        receiver.close()


def loop_summary(loop_ms: list[float]) -> dict[str, float]:
    """The median and p95 of some scheduler loops' milliseconds (nothing for no loops)."""
    if not loop_ms:
        return {}
    return {"loop ms": statistics.median(loop_ms), "loop p95 ms": percentile(loop_ms, 0.95) or 0.0}


def percentile(values: list[float], fraction: float) -> float | None:
    """The ``fraction`` (0-1) percentile of ``values`` by the nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))]
