"""The benchmarks' StatsD receiver: what Airflow's StatsD client sends, kept by metric and arrival time."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from _statsd import SCHEDULER_LOOP, percentile, receiving


def test_timings_of_one_metric_in_a_window_are_kept_and_others_are_not() -> None:
    with receiving() as receiver:
        sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        start = time.time()
        # one packet may carry several lines; counters and gauges are not timings
        sender.sendto(
            b"airflow.scheduler.scheduler_loop_duration:12.5|ms\nairflow.ti.finish.x:1|c",
            ("127.0.0.1", receiver.port),
        )
        sender.sendto(b"airflow.scheduler.scheduler_loop_duration:40|ms|@0.5", ("127.0.0.1", receiver.port))
        sender.sendto(b"airflow.dag_processing.total_parse_time:7|ms", ("127.0.0.1", receiver.port))
        sender.sendto(b"airflow.scheduler.scheduler_loop_duration:oops|ms", ("127.0.0.1", receiver.port))
        # the last packet: once it is kept, every packet before it was read (one socket, one thread)
        sender.sendto(b"airflow.bench.last:1|ms", ("127.0.0.1", receiver.port))
        deadline = time.monotonic() + 5
        while not receiver.timings("bench.last", start, time.time()) and time.monotonic() < deadline:
            time.sleep(0.02)
        end = time.time()
        assert receiver.timings(SCHEDULER_LOOP, start, end) == [12.5, 40.0]
        assert receiver.timings("dag_processing.total_parse_time", start, end) == [7.0]
        assert receiver.timings(SCHEDULER_LOOP, end + 1, end + 2) == []
        assert receiver.env()["AIRFLOW__METRICS__STATSD_PORT"] == str(receiver.port)
        sender.close()


def test_percentile_is_the_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.95) == 95.0
    assert percentile(values, 0.5) == 50.0
    assert percentile([3.0], 0.95) == 3.0
    assert percentile([], 0.95) is None
