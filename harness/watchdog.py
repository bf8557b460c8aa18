"""Stop a cluster's processes when the process that started it dies without stopping it.

``AirflowCluster`` starts this module as ``python -m harness.watchdog PARENT [HOME]``
in a session of its own, before any component, and tells it on stdin, one line each:

- ``start <pid>``: a component was started as the leader of session ``<pid>``;
- ``end <pid>``: that component and its session are gone (the pid may be reused from now on);
- ``stop``: the cluster stopped itself; the watchdog exits without doing anything.

When the parent dies first (killed with SIGKILL, say: no ``finally`` runs), stdin reaches end of file and
the watchdog is re-parented; it then SIGKILLs every process of the sessions still registered (task
processes included) and removes ``HOME``, the cluster's temporary home, when given.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import sys
import time

from harness.processes import family, pid_alive, signal_all

POLL_SECONDS = 0.2
KILL_SECONDS = 30.0


def kill_sessions(roots: set[int]) -> set[int]:
    """SIGKILL every process of the sessions led by ``roots`` until none is left; returns survivors."""
    deadline = time.monotonic() + KILL_SECONDS
    members = {pid for pid in family(roots) | roots if pid_alive(pid)}
    while members and time.monotonic() < deadline:
        signal_all(members, signal.SIGKILL)
        time.sleep(0.05)
        members = {pid for pid in members | family(roots) if pid_alive(pid)}
    return members


def watch(parent: int, home: str | None) -> int:
    roots: set[int] = set()
    pending = b""
    fd = sys.stdin.fileno()
    parent_alive = True
    while True:
        # once the parent is gone, only read what it wrote before dying (it may have died before this
        # process got here), without waiting for more
        ready, _, _ = select.select([fd], [], [], POLL_SECONDS if parent_alive else 0)
        chunk = os.read(fd, 4096) if ready else b""
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            command, _, pid = line.decode().strip().partition(" ")
            if command == "stop":
                return 0
            if command == "start":
                roots.add(int(pid))
            elif command == "end":
                roots.discard(int(pid))
        if ready and not chunk:
            break  # end of file: the parent (and with it its end of the pipe) is gone
        if not parent_alive and not ready:
            break
        parent_alive = os.getppid() == parent
    survivors = kill_sessions(roots)
    if home:
        shutil.rmtree(home, ignore_errors=True)
    if survivors:
        print(f"watchdog: could not kill {sorted(survivors)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(watch(int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None))
