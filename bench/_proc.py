"""The CPU seconds each part of a cluster spent between two moments, from ``/proc`` (Linux).

Two snapshots of every process on the machine (:func:`snapshot`), one before and one after a batch of
runs, are enough to account for processes that came and went in between: a process's ``cutime`` and
``cstime`` grow by the whole CPU time of every child it waited for (and of that child's own waited-for
children). So a long-lived process's part is its own time (``utime`` + ``stime``) and, apart, the time
of the processes it started and reaped. A Celery worker's pool process, for instance, supervises each
task it runs and waits for the task process it forked: its own time is the supervisors', its children's
the task processes'.

Each process is named after the cluster component whose process tree it belongs to (the component's
own process, the processes it forked directly, the ones below), or ``postgres``, ``redis``, ``harness``
(the benchmark's own process) or ``other``. What a process that ended in between spent, and was not
waited for by a process alive at both snapshots, is not counted; the totals are below the machine's
(``/proc/stat``) by that much.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from harness.processes import proc_stats

TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    comm: str
    own: float  # utime + stime, seconds
    children: float  # cutime + cstime: the processes it waited for, seconds


def snapshot() -> dict[int, Proc]:
    """Every process of the machine now (a process that ends while it is read is left out)."""
    out = {}
    for pid, (comm, fields) in (proc_stats() or {}).items():
        utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
        out[pid] = Proc(pid, int(fields[1]), comm, (utime + stime) / TICK, (cutime + cstime) / TICK)
    return out


def _part(pid: int, procs: Mapping[int, Proc], roots: Mapping[int, str]) -> tuple[str, int]:
    """The component ``pid`` belongs to and its depth below the component's process (0: that process),
    or ("", -1) when it belongs to none."""
    depth, seen = 0, set()
    while pid in procs and pid not in seen:
        if pid in roots:
            return roots[pid], depth
        seen.add(pid)
        pid, depth = procs[pid].ppid, depth + 1
    return "", -1


def breakdown(
    before: Mapping[int, Proc], after: Mapping[int, Proc], components: Mapping[str, int]
) -> Counter:
    """Part of the cluster → CPU seconds it spent between the two snapshots. ``components``: name → pid of
    each component's process (a name ``worker-<x>`` counts as ``celery worker``)."""
    roots = {
        pid: ("celery worker" if name.startswith("worker-") else name) for name, pid in components.items()
    }
    spent: Counter = Counter()
    for pid, now in after.items():
        then = before.get(pid)
        if then is None or then.comm != now.comm:
            continue  # started in between: counted by the process that waits for it, if any
        own, reaped = now.own - then.own, now.children - then.children
        name, depth = _part(pid, after, roots)
        if pid == os.getpid():
            spent["harness"] += own + reaped
        elif name == "celery worker" and depth == 1:
            spent["celery worker: pool processes (task supervisors)"] += own
            spent["celery worker: task processes"] += reaped
        elif name:
            spent[name if depth == 0 else f"{name}: its processes"] += own
            spent[f"{name}: processes it waited for"] += reaped
        elif now.comm.startswith("postgres"):
            spent["postgres"] += own + reaped
        elif now.comm.startswith("redis"):
            spent["redis"] += own + reaped
        else:
            spent["other"] += own + reaped
    return Counter({part: seconds for part, seconds in spent.items() if seconds > 0})
