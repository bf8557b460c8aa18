"""Run a real Airflow 3.3 deployment as separate OS processes, for end-to-end tests.

``AirflowCluster`` starts ``airflow scheduler``, ``airflow dag-processor``, ``airflow api-server`` and
``airflow triggerer`` as independent processes (each in its own session / process group) against a
throw-away ``AIRFLOW_HOME`` with a SQLite metadata database and the ``LocalExecutor``, and drives them
through the public REST API (``/api/v2``). With ``database_url`` (PostgreSQL, e.g. a
:class:`~harness.postgres.PostgresDatabase`), ``broker_url`` (Redis) and
``celery_workers`` it runs the ``CeleryExecutor`` instead, with one ``airflow celery worker`` process per
worker name; each worker reports its name as the Airflow hostname of the task instances it runs.

This module deliberately does not import Airflow: everything goes through subprocesses and HTTP (the
standard library, and the provider's pure core to read a session's result), so importing it is cheap
and it cannot pollute the test process's Airflow configuration.

A failed wait raises :class:`ClusterTimeout`, a component that exited :class:`ComponentCrashed` (both
:class:`ClusterError`, with the components' log tails). Every process the cluster starts is stopped by
``stop()``, and, if the process that started the cluster dies first (even by SIGKILL), by a watchdog
process (:mod:`~harness.watchdog`).

Example::

    with AirflowCluster(dags_folder) as cluster:
        cluster.wait_for_dag("my_dag")
        cluster.unpause("my_dag")
        run_id = cluster.trigger("my_dag", {"x": 1})
        assert cluster.wait_for_run("my_dag", run_id) == "success"
        result = cluster.session_result("my_dag", run_id)  # a plan DAG's SessionResult

    with PostgresDatabase() as db, AirflowCluster(
        dags_folder,
        database_url=db.url,
        broker_url="redis://127.0.0.1:6379/0",
        celery_workers=("worker-a", "worker-b"),
    ) as cluster:
        ...
"""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from airflow_plan_provider.contract import RESULT_KEY, labelled_node, session_outcome
from airflow_plan_provider.plan.result import SessionResult
from harness.deploy import celery_imports
from harness.processes import family, pid_alive, signal_all, terminate_group
from harness.sqlite import API_TIMEOUT, MAX_OVERFLOW, locked, migrate_or_copy_template

__all__ = [
    "COMPONENTS",
    "AirflowApiError",
    "AirflowCluster",
    "ClusterError",
    "ClusterTimeout",
    "ComponentCrashed",
    "async_database_url",
    "worker_hostname",
]

#: Long-running components, in start order (Celery workers, when configured, start after them).
COMPONENTS: tuple[str, ...] = ("api-server", "dag-processor", "scheduler", "triggerer")

#: Environment variable holding a Celery worker's name; ``worker_hostname`` returns it.
WORKER_NAME_ENV = "PLAN_WORKER_NAME"
_WORKER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")

TERMINAL_RUN_STATES = frozenset({"success", "failed"})
#: seconds before the dag-processor parses an unchanged DAG file again (``[dag_processor]
#: min_file_process_interval``; see :meth:`AirflowCluster._build_env`)
REPARSE_UNCHANGED_AFTER = 600

# Keys of structured task-log records that are either rendered explicitly or repeat the TI identity.
_LOG_CONTEXT_KEYS = frozenset(
    {
        "timestamp",
        "level",
        "event",
        "logger",
        "filename",
        "lineno",
        "task_id",
        "dag_id",
        "run_id",
        "try_number",
        "map_index",
        "ti_id",
    }
)


class ClusterError(RuntimeError):
    """The cluster failed or was misused; the message says why, followed by ``diagnostics`` when known.

    :param message: what went wrong.
    :param diagnostics: the components' process states and log tails (:meth:`AirflowCluster.diagnostics`).
    """

    def __init__(self, message: str, diagnostics: str = "") -> None:
        super().__init__(f"{message}\n{diagnostics}" if diagnostics else message)
        self.reason = message
        self.diagnostics = diagnostics


#: where the SQLite connection arguments are (:mod:`harness.sqlite`)
SQLITE_CONNECT_ARGS = f"{__package__}.sqlite.CONNECT_ARGS"
SQLITE_API_SERVER_CONNECT_ARGS = f"{__package__}.sqlite.API_SERVER_CONNECT_ARGS"

#: The folder this package is imported from (the repository's root). Airflow imports the SQLite
#: settings and the Celery workers' hostname callable from this package by dotted path, and the
#: watchdog runs as one of its modules: every process the cluster starts has the folder first on its
#: ``PYTHONPATH``, so it imports this package, and the provider of the same checkout.
IMPORT_ROOT = str(Path(__file__).resolve().parents[1])


def python_path(current: str | None) -> str:
    """``PYTHONPATH`` for a process the cluster starts: :data:`IMPORT_ROOT`, then ``current``."""
    return os.pathsep.join(p for p in (IMPORT_ROOT, current) if p)


def _connect_args(where: str) -> dict[str, str]:
    """``[database] sql_alchemy_connect_args`` and its ``_async`` twin, both ``where``."""
    return {
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS": where,
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS_ASYNC": where,
    }


#: how often a request answered "database is locked" is sent again, a second apart
LOCKED_TRIES = 10


class ClusterTimeout(ClusterError):
    """A wait ran out of time (the API never answered, a DAG was not parsed, a run did not finish) while
    every component was still running."""


class ComponentCrashed(ClusterError):
    """A component exited while the cluster was in use (or ``airflow db migrate`` failed).

    :param exit_codes: component name → its exit code.
    """

    def __init__(self, message: str, diagnostics: str = "", *, exit_codes: Mapping[str, int | None]) -> None:
        super().__init__(message, diagnostics)
        self.exit_codes = dict(exit_codes)


class AirflowApiError(RuntimeError):
    """A non-2xx answer from the Airflow REST API."""

    def __init__(self, method: str, url: str, status: int, body: str) -> None:
        super().__init__(f"{method} {url} -> HTTP {status}: {body[:2000]}")
        self.method = method
        self.url = url
        self.status = status
        self.body = body

    @property
    def busy(self) -> bool:
        """Whether the server is up but could not serve the request just now (a 5xx: on SQLite, a
        request that waited out the database lock); a wait polls on through it."""
        return self.status >= 500

    def reason(self) -> str:
        """The status and the start of the body, on one line."""
        return f"HTTP {self.status}: {' '.join(self.body.split())[:200]}"


def worker_hostname() -> str:
    """``[core] hostname_callable`` of the cluster's Celery workers: ``$PLAN_WORKER_NAME``, else the FQDN.

    Airflow records this name as the ``hostname`` of every task instance the worker runs, so two workers
    on one machine stay distinguishable.
    """
    return os.environ.get(WORKER_NAME_ENV) or socket.getfqdn()


def _check_executor(
    executor: str, workers: Sequence[str], database_url: str | None, broker_url: str | None
) -> None:
    """Reject a configuration Airflow would only refuse after start-up, naming the option at fault."""
    if executor == "CeleryExecutor":
        if not workers:
            raise ValueError("the CeleryExecutor needs at least one name in celery_workers")
        if not broker_url:
            raise ValueError("the CeleryExecutor needs broker_url (e.g. redis://127.0.0.1:6379/0)")
        if database_url is None or database_url.startswith("sqlite"):
            raise ValueError("the CeleryExecutor needs a database_url other than SQLite (e.g. PostgreSQL)")
    elif workers:
        raise ValueError(f"celery_workers {list(workers)} need the CeleryExecutor, not {executor}")
    if len(set(workers)) != len(workers):
        raise ValueError(f"celery_workers must be distinct: {list(workers)}")
    for name in workers:
        if name in COMPONENTS or not _WORKER_NAME.fullmatch(name):
            raise ValueError(
                f"celery worker name {name!r} must be letters, digits, '_', '.' or '-' "
                f"and not one of {COMPONENTS}"
            )


#: Database dialect → (sync drivers Airflow may be given, the asyncio driver it uses beside them).
_DRIVERS: dict[str, tuple[tuple[str, ...], str]] = {
    "sqlite": (("pysqlite",), "aiosqlite"),
    "postgresql": (("psycopg2", "psycopg"), "asyncpg"),
}


def _split_url(url: str) -> tuple[str, str | None, str]:
    """``dialect[+driver]:rest`` → (dialect, driver or None, rest)."""
    scheme, sep, rest = url.partition(":")
    dialect, _, driver = scheme.partition("+")
    if not sep or dialect not in _DRIVERS:
        raise ValueError(
            f"database_url must start with one of {sorted(_DRIVERS)} (e.g. postgresql+psycopg2://), "
            f"not {scheme!r}"
        )
    return dialect, driver or None, rest


def async_database_url(url: str) -> str:
    """The asyncio URL of the metadata database at ``url`` (``[database] sql_alchemy_conn_async``).

    The same database through the dialect's asyncio driver (``aiosqlite``, ``asyncpg``), as Airflow 3.3
    derives it; libpq's ``sslmode`` becomes asyncpg's ``ssl``, which asyncpg accepts with the same values.
    """
    dialect, _driver, rest = _split_url(url)
    async_url = f"{dialect}+{_DRIVERS[dialect][1]}:{rest}"
    if dialect == "postgresql":
        parts = urllib.parse.urlsplit(async_url)
        query = [
            ("ssl" if key == "sslmode" else key, value) for key, value in urllib.parse.parse_qsl(parts.query)
        ]
        async_url = urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))
    return async_url


def _check_database_url(url: str) -> None:
    """Refuse a metadata-DB URL Airflow could not open, naming the driver to install."""
    dialect, driver, _rest = _split_url(url)
    sync_drivers, async_driver = _DRIVERS[dialect]
    if driver is not None and driver not in sync_drivers:
        raise ValueError(f"database_url driver {driver!r} is not one of {list(sync_drivers)} for {dialect}")
    sync_module = {"pysqlite": "sqlite3"}.get(driver or sync_drivers[0], driver or sync_drivers[0])
    for module in (sync_module, async_driver):
        if importlib.util.find_spec(module) is None:
            raise ValueError(
                f"database_url {dialect} needs the {module!r} driver installed (pip install {module})"
            )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _airflow_command() -> list[str]:
    """The ``airflow`` console script of the running interpreter's environment."""
    candidate = Path(sys.executable).parent / "airflow"
    if candidate.exists():
        return [str(candidate)]
    return [sys.executable, "-m", "airflow"]


def _tail(path: Path, lines: int) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 256 * lines))
            data = fh.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return f"<unreadable: {exc}>"
    return "\n".join(data.splitlines()[-lines:])


class AirflowCluster:
    """A real multi-process Airflow deployment on a temporary ``AIRFLOW_HOME``.

    :param dags_folder: folder the dag-processor parses (``[core] dags_folder``).
    :param home: ``AIRFLOW_HOME`` to use; a fresh temporary directory (removed on ``stop``) if omitted.
    :param env: extra environment entries merged last (e.g. ``AIRFLOW_CONN_*``, ``PYTHONPATH``,
        ``AIRFLOW__SECTION__KEY`` overrides); a ``PYTHONPATH`` comes after :data:`IMPORT_ROOT`.
    :param parallelism: ``[core] parallelism`` (LocalExecutor worker count); Airflow's default, 32.
    :param startup_timeout: seconds ``start()`` waits for the API server to answer.
    :param keep_home: keep a temporary home after ``stop()`` (for debugging). An explicit ``home`` is
        never removed.
    :param port: the API server's port on 127.0.0.1; a free one if omitted.
    :param database_url: SQLAlchemy URL of the metadata database, ``sqlite:///...`` or
        ``postgresql[+psycopg2]://...`` (a :class:`~harness.postgres.PostgresDatabase`'s
        ``url``); a SQLite file in ``home`` if omitted. Airflow 3.3 also opens the database through an asyncio
        driver: the cluster sets that URL too (:func:`async_database_url`), and refuses a URL whose
        drivers are not installed.
    :param executor: ``[core] executor``; ``CeleryExecutor`` when ``celery_workers`` are given, else
        ``LocalExecutor``.
    :param broker_url: Celery broker (e.g. ``redis://127.0.0.1:6379/0``); required by the CeleryExecutor.
        The cluster sends its tasks to a queue of its own, so clusters can share one broker.
    :param result_backend: Celery result backend; ``db+<database_url>`` if omitted.
    :param celery_workers: names of the ``airflow celery worker`` processes to start; each is also the
        worker's component name (``kill("worker-a")``) and the ``hostname`` of the task instances it runs.
    :param worker_concurrency: task slots of each Celery worker.

    Inherited ``AIRFLOW__*``/``AIRFLOW_HOME``/``AIRFLOW_CONFIG`` variables of the calling process are
    dropped so the cluster is isolated from the developer's / CI's Airflow configuration, and so is
    ``PYTHONDONTWRITEBYTECODE``: the processes keep Python's bytecode cache, as a deployment's do.
    """

    def __init__(
        self,
        dags_folder: str | os.PathLike[str],
        *,
        home: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        parallelism: int = 32,
        startup_timeout: float = 120.0,
        keep_home: bool = False,
        port: int | None = None,
        database_url: str | None = None,
        executor: str | None = None,
        broker_url: str | None = None,
        result_backend: str | None = None,
        celery_workers: Sequence[str] = (),
        worker_concurrency: int = 4,
    ) -> None:
        self.workers = tuple(celery_workers)
        self.executor = executor or ("CeleryExecutor" if self.workers else "LocalExecutor")
        _check_executor(self.executor, self.workers, database_url, broker_url)
        if database_url is not None:
            _check_database_url(database_url)
        self.dags_folder = Path(dags_folder).resolve()
        self._own_home = home is None
        self.home = Path(tempfile.mkdtemp(prefix="airflow-e2e-")) if home is None else Path(home).resolve()
        self.home.mkdir(parents=True, exist_ok=True)
        self.log_dir = self.home / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.keep_home = keep_home
        self.startup_timeout = startup_timeout
        self.parallelism = parallelism
        self.port = port or _free_port()
        self.database_url = database_url or f"sqlite:///{self.home / 'airflow.db'}"
        #: The same database through its asyncio driver (``[database] sql_alchemy_conn_async``).
        self.async_database_url = async_database_url(self.database_url)
        self.broker_url = broker_url
        self.result_backend = result_backend or f"db+{self.database_url}"
        self.worker_concurrency = worker_concurrency
        # A queue of its own: clusters sharing a broker never take each other's tasks.
        self.queue = f"plan-e2e-{secrets.token_hex(4)}"
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._log_handles: dict[str, Any] = {}
        self._started_pids: list[int] = []
        #: every component :meth:`revive` started again, in order
        self.revived: list[str] = []
        self._token: str | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._airflow = _airflow_command()
        self.env = self._build_env(env or {})

    # ------------------------------------------------------------------ configuration

    def _build_env(self, extra: Mapping[str, str]) -> dict[str, str]:
        # the processes keep Python's bytecode cache, as a deployment's do, even when the caller's shell
        # turns it off (PYTHONDONTWRITEBYTECODE): else every task process compiles the provider again
        # (about 100 ms of CPU each); ``env`` may set it back
        base = {
            k: v
            for k, v in os.environ.items()
            if not (
                k.startswith("AIRFLOW__")
                or k in {"AIRFLOW_HOME", "AIRFLOW_CONFIG", "PYTHONDONTWRITEBYTECODE"}
            )
        }
        home = str(self.home)
        cfg = {
            "AIRFLOW_HOME": home,
            "AIRFLOW_CONFIG": str(self.home / "airflow.cfg"),
            # --- core / db / executor
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.database_url,
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": self.async_database_url,
            **(
                {
                    **_connect_args(SQLITE_CONNECT_ARGS),
                    "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": str(API_TIMEOUT),
                    "AIRFLOW__DATABASE__SQL_ALCHEMY_MAX_OVERFLOW": str(MAX_OVERFLOW),
                }
                if self.is_sqlite
                else {}
            ),
            "AIRFLOW__CORE__EXECUTOR": self.executor,
            "AIRFLOW__CORE__PARALLELISM": str(self.parallelism),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__FERNET_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
            "AIRFLOW__CORE__AUTH_MANAGER": (
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
            ),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            # Tasks (LocalExecutor workers -> task supervisor) talk to the API server's execution API.
            # Default is http://localhost:8080/execution/ -- must point at *our* port.
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
            # --- API server. The JWT secret (scheduler mints task tokens, API server checks them) and the
            # secret key must be identical in every process. Without a value Airflow generates a random
            # one per process and only shares it through the airflow.cfg the first process writes; pin
            # them here so all components agree regardless of start order or a reused ``home``.
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__BASE_URL": self.base_url,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(64),
            # >= 64 bytes, else PyJWT warns (InsecureKeyLengthWarning) for the default HS512.
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(64),
            "AIRFLOW__API__EXPOSE_STACKTRACE": "True",
            # --- dag-processor: pick up new files within a couple of seconds (the folder is listed every
            # 2 s); a changed file is parsed again at once whatever the interval below (its mtime is newer
            # than its last parse, [dag_processor] file_parsing_sort_mode modified_time). An unchanged file
            # is parsed again only after MIN_FILE_PROCESS_INTERVAL: every parse is a process importing the
            # DAG file, and at 5 s an idle cluster serving the example and e2e DAGs took 0.73 of a core
            # (0.37 at 30 s, 0.24 at 600 s), the CPU the other tests on the machine wait for.
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "2",
            "AIRFLOW__DAG_PROCESSOR__BUNDLE_REFRESH_CHECK_INTERVAL": "1",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": str(REPARSE_UNCHANGED_AFTER),
            "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
            "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_STORAGE_PATH": str(self.home / "bundles"),
            # --- scheduler / triggerer: short loops and heartbeats
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
            "AIRFLOW__SCHEDULER__JOB_HEARTBEAT_SEC": "1",
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.2",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_SEC": "2",
            "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
            # The task supervisor select()s for up to this long, so a finished task can hold its LocalExecutor
            # slot (and delay shutdown) this long after exiting; default 5.
            "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "1",
            # --- log servers on free ports (defaults 8793/8794 collide between clusters / with dev boxes)
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(_free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(_free_port()),
            "AIRFLOW__LOGGING__COLORED_CONSOLE_LOG": "False",
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.log_dir),
            "PYTHONUNBUFFERED": "1",
        }
        if self.executor == "CeleryExecutor":
            cfg |= {
                "AIRFLOW__CELERY__BROKER_URL": str(self.broker_url),
                "AIRFLOW__CELERY__RESULT_BACKEND": self.result_backend,
                "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(self.worker_concurrency),
                "AIRFLOW__OPERATORS__DEFAULT_QUEUE": self.queue,
            } | celery_imports()
        base.update(cfg)
        base.update({k: str(v) for k, v in extra.items()})
        base["PYTHONPATH"] = python_path(base.get("PYTHONPATH"))
        return base

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> AirflowCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> AirflowCluster:
        """Start the watchdog, migrate the DB, start all components and wait until the API server answers.

        :raises ComponentCrashed: the migration failed or a component exited during start-up.
        :raises ClusterTimeout: the API server did not answer within ``startup_timeout`` seconds.
        """
        self._start_watchdog()
        self._migrate()
        for component in self.components:
            self._spawn(component)
        self._wait_api_up(self.startup_timeout)
        return self

    def _start_watchdog(self) -> None:
        """Start the process that stops every component if this process dies without stopping them
        (see :mod:`~harness.watchdog`)."""
        if self._watchdog is not None and self._watchdog.poll() is None:
            return
        temporary_home = self._own_home and not self.keep_home and not os.environ.get("AIRFLOW_E2E_KEEP_HOME")
        with (self.log_dir / "watchdog.log").open("ab") as log:
            self._watchdog = subprocess.Popen(
                [sys.executable, "-m", f"{__package__}.watchdog", str(os.getpid())]
                + ([str(self.home)] if temporary_home else []),
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.home,
                env=os.environ | {"PYTHONPATH": python_path(os.environ.get("PYTHONPATH"))},
                start_new_session=True,  # outlives a kill of this process's group, too
            )

    def _tell_watchdog(self, line: str) -> None:
        watchdog = self._watchdog
        if watchdog is None or watchdog.stdin is None or watchdog.poll() is not None:
            return
        with contextlib.suppress(OSError):
            watchdog.stdin.write(f"{line}\n".encode())
            watchdog.stdin.flush()

    def _stop_watchdog(self) -> None:
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is None:
            return
        if watchdog.poll() is None and watchdog.stdin is not None:
            with contextlib.suppress(OSError):
                watchdog.stdin.write(b"stop\n")
                watchdog.stdin.close()
        try:
            watchdog.wait(timeout=10)
        except subprocess.TimeoutExpired:
            watchdog.kill()
            watchdog.wait()

    def _migrate(self) -> None:
        """``airflow db migrate``; a SQLite database not there yet starts as a copy of the one this
        environment's Airflow migrated last (:func:`~harness.sqlite.migrated_template`), if any."""
        migrate_or_copy_template(self.database_url, self._run_migrate)

    def _run_migrate(self) -> None:
        log = self.log_dir / "db-migrate.log"
        with log.open("ab") as fh:
            proc = subprocess.Popen(
                [*self._airflow, "db", "migrate"],
                env=self.env,
                cwd=self.home,
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            self._tell_watchdog(f"start {proc.pid}")
            try:
                rc = proc.wait(timeout=300)
            except subprocess.TimeoutExpired:
                terminate_group(proc.pid)
                proc.wait()
                raise ClusterTimeout(
                    "`airflow db migrate` did not finish within 300s", _tail(log, 60)
                ) from None
            finally:
                self._tell_watchdog(f"end {proc.pid}")
        if rc != 0:
            raise ComponentCrashed(
                f"`airflow db migrate` exited {rc}", _tail(log, 60), exit_codes={"db-migrate": rc}
            )

    @property
    def is_sqlite(self) -> bool:
        """Whether the metadata database is SQLite (:mod:`.sqlite` has its settings)."""
        return self.database_url.startswith("sqlite")

    @property
    def components(self) -> tuple[str, ...]:
        """Every long-running component in start order: ``COMPONENTS``, then the Celery workers."""
        return COMPONENTS + self.workers

    def _command(self, component: str) -> list[str]:
        if component == "api-server":
            return [*self._airflow, "api-server", "--host", "127.0.0.1", "--port", str(self.port)]
        if component in COMPONENTS:
            return [*self._airflow, component]
        if component in self.workers:
            return [
                *self._airflow,
                "celery",
                "worker",
                # Unique among clusters sharing the broker (a duplicate node name makes a worker exit).
                "--celery-hostname",
                f"{component}@{self.queue}",
                "--queues",
                self.queue,
                "--concurrency",
                str(self.worker_concurrency),
                "--pid",
                str(self.home / f"{component}.pid"),
                # Task logs are files in this home, read by the API server directly.
                "--skip-serve-logs",
            ]
        raise ValueError(f"unknown component {component!r}; expected one of {self.components}")

    def _component_env(self, component: str) -> dict[str, str]:
        if component == "api-server" and self.is_sqlite:
            return self.env | _connect_args(SQLITE_API_SERVER_CONNECT_ARGS)
        if component not in self.workers:
            return self.env
        return self.env | {
            WORKER_NAME_ENV: component,
            "AIRFLOW__CORE__HOSTNAME_CALLABLE": f"{__name__}.worker_hostname",
        }

    def _spawn(self, component: str) -> subprocess.Popen[bytes]:
        cmd = self._command(component)
        if component in self._procs and self._procs[component].poll() is None:
            raise ClusterError(f"{component} is already running (pid {self._procs[component].pid})")
        fh = (self.log_dir / f"{component}.log").open("ab")
        fh.write(f"\n===== {time.strftime('%H:%M:%S')} starting: {' '.join(cmd)}\n".encode())
        fh.flush()
        proc = subprocess.Popen(
            cmd,
            env=self._component_env(component),
            cwd=self.home,
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._procs[component] = proc
        old = self._log_handles.pop(component, None)
        if old is not None:
            old.close()
        self._log_handles[component] = fh
        self._started_pids.append(proc.pid)
        self._tell_watchdog(f"start {proc.pid}")
        return proc

    def _stop_component(
        self, component: str, timeout: float, *, graceful: bool = True, signalled: bool = False
    ) -> None:
        """Stop one component and every process of its group/session.

        Graceful: one SIGTERM to the component's process group, wait up to ``timeout`` for its main
        process to exit, then SIGKILL whatever is left of its family -- LocalExecutor workers (they ignore
        SIGTERM), task processes (own process group, but still in the component's session), etc.

        The SIGTERM is sent once only: a second one makes e.g. the triggerer "force exit". It goes to the
        whole group (like a terminal's Ctrl-C) rather than the main pid: the triggerer's trigger-runner
        child otherwise takes ~10 s to honour the SIGINT its supervisor forwards.
        """
        proc = self._procs.get(component)
        if proc is None:
            return
        members = family([proc.pid]) | {proc.pid}
        if graceful and proc.poll() is None:
            if not signalled:
                terminate_group(proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, timeout))
        for _ in range(100):
            members = {p for p in members | family([proc.pid]) if pid_alive(p)}
            if not members:
                break
            signal_all(members, signal.SIGKILL)
            proc.poll()
            time.sleep(0.05)
        else:  # pragma: no cover - would need an unkillable (D-state) process
            raise ClusterError(f"could not kill {component} processes {sorted(members)}")
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        # Forget it: its pid may be reused by an unrelated process from now on.
        self._procs.pop(component, None)
        self._tell_watchdog(f"end {proc.pid}")
        fh = self._log_handles.pop(component, None)
        if fh is not None:
            fh.close()

    def stop(self, timeout: float = 15.0) -> None:
        """Stop every running process: SIGTERM to each component, SIGKILL of its whole group/session
        once it has exited or after ``timeout`` seconds.

        Idempotent. Removes a temporary home unless ``keep_home`` (or ``AIRFLOW_E2E_KEEP_HOME=1``).
        """
        # SIGTERM every component first so they shut down in parallel, then reap them one by one.
        for proc in self._procs.values():
            if proc.poll() is None:
                terminate_group(proc.pid)
        deadline = time.monotonic() + timeout
        for component in list(self._procs):
            self._stop_component(component, deadline - time.monotonic(), signalled=True)
        self._forget_queue()
        self._stop_watchdog()
        if self._own_home and not self.keep_home and not os.environ.get("AIRFLOW_E2E_KEEP_HOME"):
            shutil.rmtree(self.home, ignore_errors=True)

    def _forget_queue(self) -> None:
        """Remove the keys kombu left in a Redis broker for this cluster's queue (best effort)."""
        if self.executor != "CeleryExecutor" or not str(self.broker_url).startswith("redis"):
            return
        with contextlib.suppress(Exception):
            import redis

            client = redis.Redis.from_url(str(self.broker_url), socket_timeout=5)
            keys = list(client.scan_iter(match=f"*{self.queue}*"))
            if keys:
                client.delete(*keys)
            client.close()

    def kill(self, component: str) -> None:
        """SIGKILL ``component``'s whole process group/session (simulates a crash).

        Task processes started by a killed scheduler die with it (they are in its session).
        """
        self._command(component)  # validates the name
        if component not in self._procs:
            raise ClusterError(f"{component!r} is not running")
        self._stop_component(component, timeout=0, graceful=False)

    def restart(self, component: str, *, timeout: float = 15.0) -> None:
        """Stop ``component`` (if still running) and start it again with the same configuration."""
        self._command(component)  # validates the name
        self._stop_component(component, timeout)
        self._spawn(component)
        if component == "api-server":
            self._token = None
            self._wait_api_up(self.startup_timeout)

    def revive(self) -> list[str]:
        """Start again every component that exited, as a deployment's restart policy does (docker
        compose's ``restart: always``); returns their names. Airflow's scheduler, dag-processor and
        triggerer exit when the metadata database stays unreachable for a few seconds."""
        exited = [c for c, proc in self._procs.items() if proc.poll() is not None]
        for component in exited:
            self.restart(component)
        self.revived.extend(exited)
        return exited

    # ------------------------------------------------------------------ introspection

    @property
    def pids(self) -> dict[str, int]:
        """Root pid of each component as currently started."""
        return {name: proc.pid for name, proc in self._procs.items()}

    @property
    def started_pids(self) -> list[int]:
        """Every root pid this cluster ever started (including restarted components)."""
        return list(self._started_pids)

    def all_pids(self) -> set[int]:
        """Every live process belonging to the cluster (component roots, workers, task processes)."""
        return family(p.pid for p in self._procs.values())

    def is_running(self, component: str) -> bool:
        proc = self._procs.get(component)
        return proc is not None and proc.poll() is None

    def log_path(self, component: str) -> Path:
        return self.log_dir / f"{component}.log"

    def diagnostics(self, lines: int = 40) -> str:
        """Process states and the tail of each component's log."""
        out = [f"AIRFLOW_HOME={self.home} api={self.base_url}"]
        for component in ("db-migrate", *self.components):
            proc = self._procs.get(component)
            state = "" if proc is None else f" pid={proc.pid} returncode={proc.poll()}"
            out.append(f"----- {component}{state} (last {lines} lines of {self.log_path(component)})")
            out.append(_tail(self.log_path(component), lines))
        return "\n".join(out)

    def _timeout(self, message: str) -> ClusterTimeout:
        self.check_alive()  # a component that exited is the cause, not the time
        return ClusterTimeout(message, self.diagnostics())

    def check_alive(self) -> None:
        """Raise :class:`ComponentCrashed` (with the log tails) if a started component has exited."""
        dead = {c: p.returncode for c, p in self._procs.items() if p.poll() is not None}
        if dead:
            raise ComponentCrashed(
                f"component(s) exited unexpectedly: {dead}", self.diagnostics(), exit_codes=dead
            )

    # ------------------------------------------------------------------ HTTP

    def _raw(
        self, method: str, path: str, body: Any = None, headers: Mapping[str, str] | None = None
    ) -> tuple[int, bytes]:
        url = self.base_url + path
        data = None
        hdrs = {"Accept": "application/json", **(headers or {})}
        if body is not None:
            data = json.dumps(body).encode()
            hdrs["Content-Type"] = "application/json"
        if self._token:
            hdrs.setdefault("Authorization", f"Bearer {self._token}")
        req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=API_TIMEOUT) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def _login(self) -> None:
        # With simple_auth_manager_all_admins the API accepts anonymous calls (a middleware injects an
        # admin token); these are fallbacks for a cluster configured otherwise through ``env``.
        self._token = None
        status, data = self._raw("GET", "/auth/token")
        if status in (200, 201):
            self._token = json.loads(data)["access_token"]
            return
        pw_file = self.home / "simple_auth_manager_passwords.json.generated"
        with contextlib.suppress(OSError, ValueError):
            users = json.loads(pw_file.read_text())
            username, password = next(iter(users.items()))
            status, data = self._raw("POST", "/auth/token", {"username": username, "password": password})
            if status in (200, 201):
                self._token = json.loads(data)["access_token"]

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, Any] | None = None,
        ok: Iterable[int] = (200, 201, 204),
    ) -> Any:
        """Call the API (``path`` relative to the server root, e.g. ``/api/v2/dags``); returns parsed JSON.
        An answer "database is locked" (SQLite's, rolled back) is asked again, up to ``LOCKED_TRIES``
        times."""
        if params:
            query = {k: (str(v).lower() if isinstance(v, bool) else v) for k, v in params.items()}
            path = f"{path}?{urllib.parse.urlencode(query, doseq=True)}"
        status, data = self._raw(method, path, body)
        for _ in range(LOCKED_TRIES - 1):
            if not locked(status, data.decode("utf-8", "replace")):
                break
            time.sleep(1.0)
            status, data = self._raw(method, path, body)
        if status in (401, 403) and self._token is None:
            self._login()
            if self._token is not None:
                status, data = self._raw(method, path, body)
        if status not in set(ok):
            raise AirflowApiError(method, self.base_url + path, status, data.decode("utf-8", "replace"))
        if not data:
            return None
        try:
            return json.loads(data)
        except ValueError:
            return data.decode("utf-8", "replace")

    def api(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        """``request`` with ``path`` relative to ``/api/v2``."""
        return self.request(method, "/api/v2" + path, body, **kw)

    @staticmethod
    def _q(value: str) -> str:
        return urllib.parse.quote(value, safe="")

    def _wait_api_up(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                status, _data = self._raw("GET", "/api/v2/monitor/health")
                if status == 200:
                    return
                last = f"HTTP {status}"
            except (OSError, urllib.error.URLError) as exc:
                last = exc
            time.sleep(0.25)
        raise self._timeout(
            f"API server did not answer /api/v2/monitor/health within {timeout}s (last: {last})"
        )

    # ------------------------------------------------------------------ REST helpers

    def import_errors(self) -> list[dict[str, Any]]:
        errors = self.api("GET", "/importErrors", params={"limit": 100}).get("import_errors", [])
        return cast(list[dict[str, Any]], errors)

    def get_dag(self, dag_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], self.api("GET", f"/dags/{self._q(dag_id)}"))

    def wait_for_dag(self, dag_id: str, timeout: float = 60.0) -> dict[str, Any]:
        """Wait until the dag-processor has parsed and serialised ``dag_id``; returns the DAG resource."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                dag = self.get_dag(dag_id)
                if not dag.get("is_stale", False):
                    # The dag details endpoint needs the serialised DAG, which the scheduler needs too.
                    self.api("GET", f"/dags/{self._q(dag_id)}/details")
                    return dag
            except AirflowApiError as exc:
                if exc.status != 404 and not exc.busy:
                    raise
            except OSError:
                pass
            time.sleep(0.5)
        try:
            errors = json.dumps(self.import_errors(), indent=1)[:5000]
        except Exception as exc:
            errors = f"<could not fetch import errors: {exc}>"
        raise self._timeout(f"DAG {dag_id!r} not parsed within {timeout}s; import errors: {errors}")

    def unpause(self, dag_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], self.api("PATCH", f"/dags/{self._q(dag_id)}", {"is_paused": False}))

    def pause(self, dag_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], self.api("PATCH", f"/dags/{self._q(dag_id)}", {"is_paused": True}))

    def trigger(
        self, dag_id: str, conf: Mapping[str, Any] | None = None, *, run_id: str | None = None
    ) -> str:
        """Create a manual DAG run; returns its run id."""
        body: dict[str, Any] = {"logical_date": None, "conf": dict(conf or {})}
        if run_id is not None:
            body["dag_run_id"] = run_id
        return str(self.api("POST", f"/dags/{self._q(dag_id)}/dagRuns", body)["dag_run_id"])

    def get_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        """The run, as ``GET /dags/{dag_id}/dagRuns/{run_id}`` answers it, read from the runs list.

        Airflow's one-run endpoint builds the run's ``dag_versions`` by loading every task instance of
        the run (and its history) with its DAG version; its list endpoint gets them in one query. A
        500-node run polled 4 times a second cost the API server about a sixth of its CPU the first
        way (``python bench/results.py --history wide-500``), load that a benchmark must not add to
        what it measures. A run that
        does not exist raises :class:`AirflowApiError` with status 404, as the one-run endpoint does;
        so does the one-run endpoint itself, asked when more runs share the id's prefix than one page
        of the list holds.
        """
        path, page = f"/dags/{self._q(dag_id)}/dagRuns", 100
        listed = self.api("GET", path, params={"run_id_prefix_pattern": run_id, "limit": page})["dag_runs"]
        for run in listed:
            if run.get("dag_run_id") == run_id:
                return cast(dict[str, Any], run)
        if len(listed) >= page:
            return cast(dict[str, Any], self.api("GET", f"{path}/{self._q(run_id)}"))
        raise AirflowApiError("GET", f"{path}/{self._q(run_id)}", 404, f"no run {run_id!r} of {dag_id!r}")

    def wait_for_run(
        self,
        dag_id: str,
        run_id: str,
        timeout: float = 120.0,
        *,
        states: Iterable[str] = TERMINAL_RUN_STATES,
        poll: float = 0.5,
        revive: bool = False,
    ) -> str:
        """Wait until the run reaches one of ``states`` (default success/failed); returns the state.

        :param revive: start again a component that exits meanwhile (:meth:`revive`, a deployment's
            restart policy) rather than raise :class:`ComponentCrashed`.
        """
        wanted = set(states)
        deadline = time.monotonic() + timeout
        state: str | None = None
        unanswered = ""  # the last poll that got no state
        while time.monotonic() < deadline:
            if revive:
                self.revive()
            self.check_alive()
            try:
                state = self.get_run(dag_id, run_id)["state"]
            except OSError as exc:
                unanswered = f"; last poll: {exc!r}"
            except AirflowApiError as exc:
                if not exc.busy:
                    raise
                unanswered = f"; last poll: {exc.reason()}"
            else:
                if state in wanted:
                    return state
                unanswered = ""
            time.sleep(poll)
        try:
            tis = [
                (ti["task_id"], ti["map_index"], ti["state"], ti.get("try_number"))
                for ti in self.task_instances(dag_id, run_id)
            ]
        except Exception as exc:
            tis = [f"<could not fetch task instances: {exc}>"]  # type: ignore[list-item]
        raise self._timeout(
            f"run {dag_id}/{run_id} not in {sorted(wanted)} within {timeout}s (state={state}{unanswered}); "
            f"task instances: {tis}"
        )

    def failure_report(self, dag_id: str, run_id: str, *, lines: int = 25) -> str:
        """Why a run did not succeed, for a test's failure message: its task instances that did not
        succeed, with their state and the last ``lines`` lines of each one's last try's log (a
        cluster's home, logs included, is gone once the test ends). Never raises."""
        try:
            report = [f"run {dag_id}/{run_id}:"]
            for ti in self.task_instances(dag_id, run_id):
                if ti["state"] in ("success", "skipped"):
                    continue
                tries = int(ti.get("try_number") or 1)
                report.append(f"- {ti['task_id']}[{ti['map_index']}] {ti['state']} (try {tries})")
                log = self.task_log(dag_id, run_id, ti["task_id"], max(tries, 1), ti["map_index"])
                report += [f"    {line}" for line in log.splitlines()[-lines:]]
            return "\n".join(report)
        except Exception as exc:  # a report must never hide the failure it explains
            return f"run {dag_id}/{run_id}: no report ({exc!r})"

    def list_runs(self, dag_id: str, *, limit: int = 100) -> list[dict[str, Any]]:
        runs = self.api("GET", f"/dags/{self._q(dag_id)}/dagRuns", params={"limit": limit})["dag_runs"]
        return cast(list[dict[str, Any]], runs)

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """All task instances of a run, mapped ones included (map_index >= 0), paginated."""
        out: list[dict[str, Any]] = []
        limit = 100  # [api] maximum_page_limit default
        while True:
            page = self.api(
                "GET",
                f"/dags/{self._q(dag_id)}/dagRuns/{self._q(run_id)}/taskInstances",
                params={"limit": limit, "offset": len(out), "order_by": "id"},  # stable paging
            )
            batch = page["task_instances"]
            out.extend(batch)
            if not batch or len(out) >= page.get("total_entries", 0):
                return sorted(out, key=lambda ti: (ti["task_id"], ti["map_index"]))

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = RESULT_KEY, map_index: int = -1) -> Any:
        """The XCom value as the task pushed it (JSON-decoded)."""
        res = self.api(
            "GET",
            f"/dags/{self._q(dag_id)}/dagRuns/{self._q(run_id)}/taskInstances/{self._q(task_id)}"
            f"/xcomEntries/{self._q(key)}",
            params={"map_index": map_index},
        )
        return res["value"]

    def session_result(self, dag_id: str, run_id: str, group: str | None = None) -> SessionResult | None:
        """The outcome of the plan session ``run_id`` started (or continues), as that run reports it.

        ``finalize``'s result, or the rest of the chain's from the run's ``replan`` task when it
        replanned (:func:`~airflow_plan_provider.contract.session_outcome`); None while
        not known yet.

        :param group: the task group of a plan built with ``plan_task_group`` (its tasks are
            ``<group>.finalize``, ...); None for a plan DAG.
        """
        prefix = f"{group}." if group else ""

        def return_value(task_id: str) -> Any:
            try:
                return self.xcom(dag_id, run_id, prefix + task_id)
            except AirflowApiError as error:
                if error.status == 404:
                    return None
                raise

        return session_outcome(return_value)

    def node_states(self, dag_id: str, run_id: str, group: str | None = None) -> dict[str, str]:
        """Plan node id → state of its task instance in one run, read from each instance's
        ``id · action`` label; an instance that never started has no label and is not listed.

        :param group: only the nodes of the plan in this task group (``plan_task_group``).
        """
        prefix = f"{group}." if group else ""
        states: dict[str, str] = {}
        for ti in self.task_instances(dag_id, run_id):
            labelled = ti["map_index"] >= 0 and ti["task_id"].startswith(prefix)
            node_id = labelled_node(ti.get("rendered_map_index")) if labelled else None
            if node_id is not None:
                states[node_id] = ti["state"]
        return states

    def task_log(
        self, dag_id: str, run_id: str, task_id: str, try_number: int = 1, map_index: int = -1
    ) -> str:
        """The full log text of one task try."""
        res = self.api(
            "GET",
            f"/dags/{self._q(dag_id)}/dagRuns/{self._q(run_id)}/taskInstances/{self._q(task_id)}"
            f"/logs/{int(try_number)}",
            params={"map_index": map_index, "full_content": True},
        )
        content = res.get("content", res) if isinstance(res, dict) else res
        if isinstance(content, str):
            return content
        lines = []
        for item in content or []:
            if isinstance(item, dict):
                extra = {k: v for k, v in item.items() if k not in _LOG_CONTEXT_KEYS}
                parts = [str(item.get("timestamp", "")), f"[{item.get('level', '')}]"]
                if item.get("logger"):
                    parts.append(f"{item['logger']}:")
                parts.append(str(item.get("event", "")))
                if extra:
                    parts.append(" ".join(f"{k}={v}" for k, v in extra.items()))
                lines.append(" ".join(p for p in parts if p))
            else:
                lines.append(str(item))
        return "\n".join(lines)
