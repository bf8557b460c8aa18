"""The cluster's watchdog: it ends the registered sessions when its parent dies, and only then."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

from harness.cluster import python_path
from harness.processes import pid_alive

# A stand-in for a process that starts a cluster: a watchdog, then one "component" (a session leader
# whose child moved to a process group of its own, as a task process does), registered with it.
PARENT = textwrap.dedent(
    """
    import json, os, subprocess, sys, time

    home, stop = sys.argv[1], sys.argv[2] == "stop"
    watchdog = subprocess.Popen(
        [sys.executable, "-m", "harness.watchdog", str(os.getpid()), home],
        stdin=subprocess.PIPE, start_new_session=True,
    )
    task = "import subprocess, time; t = subprocess.Popen(['sleep', '600'], process_group=0); "
    task += "print(t.pid, flush=True); time.sleep(600)"
    component = subprocess.Popen(
        [sys.executable, "-c", task], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    task_pid = int(component.stdout.readline())
    watchdog.stdin.write(f"start {component.pid}\\n".encode())
    watchdog.stdin.flush()
    if stop:
        watchdog.stdin.write(b"stop\\n")
        watchdog.stdin.close()
        watchdog.wait()
    print(json.dumps({"pids": [component.pid, task_pid], "watchdog": watchdog.pid}), flush=True)
    time.sleep(600)
    """
)


def start_parent(home, mode):
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(home), mode],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ | {"PYTHONPATH": python_path(os.environ.get("PYTHONPATH"))},  # harness.watchdog
    )
    return parent, json.loads(parent.stdout.readline())


def wait_dead(pids, timeout=30.0):
    deadline = time.monotonic() + timeout
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return {p for p in pids if pid_alive(p)}


def test_a_killed_parents_sessions_are_ended_and_its_home_removed(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    parent, started = start_parent(home, "watch")
    try:
        assert all(pid_alive(p) for p in started["pids"])
        parent.kill()  # SIGKILL: nothing of the parent runs any more
        parent.wait()
        assert not wait_dead(started["pids"]), "a registered process survived"
        assert not wait_dead([started["watchdog"]])
        assert not home.exists()
    finally:
        for pid in started["pids"]:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_after_stop_the_watchdog_leaves_everything_alone(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    parent, started = start_parent(home, "stop")
    try:
        assert not pid_alive(started["watchdog"])  # it exited on "stop"
        parent.kill()
        parent.wait()
        time.sleep(0.5)
        assert all(pid_alive(p) for p in started["pids"]) and home.exists()
    finally:
        for pid in started["pids"]:
            os.kill(pid, signal.SIGKILL)
