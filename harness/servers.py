"""A PostgreSQL server and a Redis server of one's own, on free ports, that a test may restart.

The machine's shared servers must never be restarted; a test of what a deployment does when its metadata
database or its broker goes away starts one of these instead::

    with PostgresServer() as pg, RedisServer() as redis:
        with PostgresDatabase(pg.url) as db, AirflowCluster(..., database_url=db.url, broker_url=redis.url):
            pg.restart()  # every connection dropped, the server back on the same port
            redis.restart()  # the same for the broker (its queues kept in its append-only file)

``PostgresServer`` runs ``initdb`` and ``pg_ctl`` (PostgreSQL's binaries on ``PATH``) in a temporary
folder, trust authentication, listening on 127.0.0.1 only; as root it runs them as the ``postgres`` user
(PostgreSQL refuses to run as root). ``RedisServer`` runs ``redis-server`` with an append-only file, so a
restart keeps the messages a broker held, as a deployed Redis with persistence does.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Self

__all__ = ["PostgresServer", "RedisServer", "free_port", "listening"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that no process listens on just now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(port: int) -> bool:
    """Whether a process accepts TCP connections on 127.0.0.1:``port`` (within a second)."""
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


class _Server:
    """What both servers share: a restart, a close that also removes the folder, and use as a context."""

    folder: Path

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def restart(self) -> None:
        """Stop and start again on the same port: every open connection is dropped."""
        self.stop()
        self.start()

    def close(self) -> None:
        """Stop the server and remove its folder."""
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()


class PostgresServer(_Server):
    """A throw-away PostgreSQL server: ``initdb`` in a temporary folder, ``pg_ctl`` to start and stop it.

    :param port: the port on 127.0.0.1; a free one if omitted.
    :param user: the OS user that runs the server when this process is root (default ``postgres``).
    """

    def __init__(self, *, port: int | None = None, user: str = "postgres") -> None:
        for binary in ("initdb", "pg_ctl"):
            if shutil.which(binary) is None:
                raise RuntimeError(f"PostgresServer needs PostgreSQL's {binary!r} on PATH")
        self.port = port or free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="plan-pg-"))
        self.data = self.folder / "data"
        self.log = self.folder / "server.log"
        self._as: list[str] = []
        if os.geteuid() == 0:
            account = pwd.getpwnam(user)
            os.chown(self.folder, account.pw_uid, account.pw_gid)
            self._as = ["runuser", "-u", user, "--"]
        #: libpq URL of the server's ``postgres`` database (for :class:`~harness.postgres.PostgresDatabase`)
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _pg_ctl(self, *args: str, timeout: float = 60) -> None:
        subprocess.run(
            [*self._as, "pg_ctl", "-D", str(self.data), *args],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
        )

    def start(self) -> PostgresServer:
        """Create the cluster (first call) and start the server; returns once it accepts connections."""
        if not self.data.exists():
            subprocess.run(
                [*self._as, "initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync"],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=120,
            )
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.folder} -c fsync=off "
            "-c max_connections=300"
        )
        self._pg_ctl("-o", options, "-l", str(self.log), "-w", "-t", "60", "start")
        return self

    def stop(self) -> None:
        """Stop the server at once (``-m fast``: every client's connection is dropped)."""
        if (self.data / "postmaster.pid").exists():
            self._pg_ctl("-m", "fast", "-w", "-t", "60", "stop")


class RedisServer(_Server):
    """A throw-away ``redis-server`` in a temporary folder, with an append-only file.

    :param port: the port on 127.0.0.1; a free one if omitted.
    """

    def __init__(self, *, port: int | None = None) -> None:
        if shutil.which("redis-server") is None:
            raise RuntimeError("RedisServer needs 'redis-server' on PATH")
        self.port = port or free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="plan-redis-"))
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30) -> RedisServer:
        """Start the server; returns once it accepts connections."""
        with (self.folder / "server.log").open("ab") as log:
            self._proc = subprocess.Popen(
                [
                    "redis-server",
                    "--port",
                    str(self.port),
                    "--bind",
                    "127.0.0.1",
                    "--dir",
                    str(self.folder),
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    "always",
                    "--save",
                    "",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while not listening(self.port):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {self.port} (see {log.name})")
            time.sleep(0.1)
        return self

    def stop(self, timeout: float = 30) -> None:
        """Shut the server down (SIGTERM: it writes its file and drops every client)."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
