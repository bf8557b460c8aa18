"""The processes of an ``AirflowCluster``'s components, found through the process table.

Components are started as session leaders (``start_new_session=True``); task processes move to process
groups of their own but stay in the component's session, also after being re-parented to init. Linux
``/proc`` is read; psutil is used if importable; otherwise only the component roots are known.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable
from pathlib import Path

__all__ = ["family", "pid_alive", "proc_stats", "proc_table", "signal_all", "terminate_group"]


def proc_stats() -> dict[int, tuple[str, list[str]]] | None:
    """``pid -> (comm, the fields after it)`` of ``/proc/<pid>/stat`` for every live process (state, ppid,
    pgrp, session, ... utime, stime, cutime, cstime at 11-14), or None without ``/proc``."""
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    stats: dict[int, tuple[str, list[str]]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp session ..." -- comm may contain spaces/parens.
        stats[int(entry.name)] = (raw[raw.find("(") + 1 : raw.rfind(")")], raw[raw.rfind(")") + 2 :].split())
    return stats


def proc_table() -> dict[int, tuple[int, int, int, str]] | None:
    """``pid -> (ppid, pgid, sid, state)`` for every live process, or None if unavailable."""
    table: dict[int, tuple[int, int, int, str]] = {}
    stats = proc_stats()
    if stats is not None:
        for pid, (_, rest) in stats.items():
            try:
                table[pid] = (int(rest[1]), int(rest[2]), int(rest[3]), rest[0])
            except (IndexError, ValueError):
                continue
        return table
    try:
        import psutil
    except ImportError:
        return None
    for p in psutil.process_iter():
        try:
            pid = p.pid
            table[pid] = (p.ppid(), os.getpgid(pid), os.getsid(pid), "Z" if p.status() == "zombie" else "R")
        except (psutil.Error, OSError):
            continue
    return table


def family(root_pids: Iterable[int]) -> set[int]:
    """Live (non-zombie) processes belonging to the given component roots.

    A process belongs to a root if it is a descendant of it, or if it is in the session the root leads
    (components are started with ``start_new_session=True``); task processes call ``setpgid(0, 0)`` so
    they escape the component's process group but not its session, and they stay in the session even
    after being re-parented to init.
    """
    roots = set(root_pids)
    table = proc_table()
    if table is None:
        return {pid for pid in roots if pid_alive(pid)}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _pgid, _sid, _state) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    stack = [pid for pid in roots if pid in table]
    stack += [pid for pid, (_p, _g, sid, _s) in table.items() if sid in roots]
    while stack:
        pid = stack.pop()
        if pid in found:
            continue
        found.add(pid)
        stack.extend(children.get(pid, ()))
    found.discard(os.getpid())
    return {pid for pid in found if table[pid][3] != "Z"}


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
        return state[state.rfind(")") + 2] != "Z"
    except OSError:
        pass
    try:
        import psutil

        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except Exception:
        return True


def signal_all(pids: Iterable[int], sig: int) -> None:
    pgids: set[int] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            pgids.add(os.getpgid(pid))
        with contextlib.suppress(OSError):
            os.kill(pid, sig)
    own = os.getpgid(0)
    for pgid in pgids - {own}:
        with contextlib.suppress(OSError):
            os.killpg(pgid, sig)


def terminate_group(pid: int) -> None:
    """SIGTERM the process group led by ``pid`` (components are started as session/group leaders)."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except OSError:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)


#
