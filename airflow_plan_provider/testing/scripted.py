"""Deterministic planners and tools for testing plan DAGs, ours and our users'.

``ScriptedTool`` behaves as declared (return a value, sleep, fail transiently N times, fail permanently,
request a replan) and logs each call to a :class:`CallLog` — a folder of JSON lines shared by every
process, so a test can prove a node's tool ran exactly once, or that at most N ran at the same time.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_plan_provider.exceptions import PermanentToolError, ReplanRequested, TransientToolError
from airflow_plan_provider.plan.model import Plan
from airflow_plan_provider.tools.jobs import JobStatus
from airflow_plan_provider.tools.registry import ToolRegistry
from airflow_plan_provider.tools.tool import Tool, ToolContext

if TYPE_CHECKING:  # the planners are not imported by a DAG file that only logs its tools' calls
    from airflow_plan_provider.planners.base import PlanRequest


class CallLog:
    """Tool calls recorded as JSON lines in ``folder/calls.jsonl`` (atomic appends, any process)."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / "calls.jsonl"
        self.effects = self.folder / "side_effects.jsonl"

    @classmethod
    def in_folder_of(cls, env: str, name: str) -> CallLog:
        """The call log ``name`` in the folder the environment variable ``env`` names, which a test gives
        every process of the Airflow it starts (else in the system's temporary folder): the DAG files
        those processes parse log their tools' calls where the test reads them."""
        root = os.environ.get(env) or os.path.join(tempfile.gettempdir(), "plan-calls")
        return cls(Path(root) / name)

    def _append(self, path: Path, entry: Mapping[str, Any]) -> None:
        line = (json.dumps(entry, sort_keys=True) + "\n").encode()
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def _read(self, path: Path) -> list[dict[str, Any]]:
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    @contextmanager
    def call(self, tool: str, ctx: ToolContext) -> Any:
        entry = {"tool": tool, "node": ctx.node_id, "key": ctx.idempotency_key, "pid": os.getpid()}
        self._append(self.path, {**entry, "event": "start", "t": time.time()})
        outcome = "error"
        try:
            yield
            outcome = "ok"
        finally:
            self._append(self.path, {**entry, "event": "end", "outcome": outcome, "t": time.time()})

    def calls(self, tool: str | None = None, node: str | None = None) -> list[dict[str, Any]]:
        return [
            e
            for e in self._read(self.path)
            if e["event"] == "start"
            and (tool is None or e["tool"] == tool)
            and (node is None or e["node"] == node)
        ]

    def count(self, tool: str | None = None, node: str | None = None) -> int:
        return len(self.calls(tool, node))

    def max_concurrency(self) -> int:
        """The most calls that were running at the same moment, from the logged start/end times."""
        points = sorted((e["t"], 1 if e["event"] == "start" else -1) for e in self._read(self.path))
        running = peak = 0
        for _, delta in points:
            running += delta
            peak = max(peak, running)
        return peak

    def perform_once(self, key: str, effect: Mapping[str, Any]) -> bool:
        """Record a side effect under an idempotency key unless one is there already. True if performed."""
        with open(self.folder / "side_effects.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if any(e["key"] == key for e in self._read(self.effects)):
                return False
            self._append(self.effects, {"key": key, **effect})
            return True

    def side_effects(self) -> list[dict[str, Any]]:
        return self._read(self.effects)


class ScriptedTool:
    """A tool whose behaviour is fixed when declared.

    ``returns`` is the output (a callable gets the params); ``sleep`` seconds pass first; the first
    ``transient_failures`` calls raise :class:`TransientToolError`; ``permanent`` (a reason) always raises
    :class:`PermanentToolError`; ``replan`` (a reason) raises :class:`ReplanRequested` with the output;
    ``side_effect`` records one effect per idempotency key; ``fail_nodes`` limits failures to those nodes.
    ``job_seconds`` makes the tool asynchronous: the call starts a job that ends after that many seconds
    (with the output, or failing with ``job_fails``), polled by :func:`poll_timed_job`. ``pool`` and
    ``pool_slots`` declare the Airflow pool its nodes take slots from.
    ``needs_approval`` marks it risky (a plan calling it waits for approval).
    """

    def __init__(
        self,
        name: str,
        *,
        log: CallLog,
        returns: Any = None,
        sleep: float = 0.0,
        transient_failures: int = 0,
        permanent: str | None = None,
        replan: str | None = None,
        side_effect: bool = False,
        fail_nodes: Iterable[str] | None = None,
        description: str = "",
        args_schema: Mapping[str, Any] | None = None,
        job_seconds: float | None = None,
        job_fails: str | None = None,
        job_timeout: float | None = None,
        poll_interval: float = 1.0,
        pool: str | None = None,
        pool_slots: int = 1,
        needs_approval: bool = False,
    ) -> None:
        self.name = name
        self.pool = pool
        self.pool_slots = pool_slots
        self.needs_approval = needs_approval
        self.log = log
        self.returns = returns
        self.sleep = sleep
        self.transient_failures = transient_failures
        self.permanent = permanent
        self.replan = replan
        self.side_effect = side_effect
        self.fail_nodes = set(fail_nodes) if fail_nodes is not None else None
        self.description = description or f"scripted tool {name}"
        self.args_schema = dict(args_schema or {"type": "object"})
        self.job_seconds = job_seconds
        self.job_fails = job_fails
        self.job_timeout = job_timeout
        self.poll_interval = poll_interval

    def _fails_here(self, ctx: ToolContext) -> bool:
        return self.fail_nodes is None or ctx.node_id in self.fail_nodes

    def __call__(self, ctx: ToolContext, **params: Any) -> Any:
        earlier = self.log.count(self.name, ctx.node_id)
        with self.log.call(self.name, ctx):
            if self.sleep:
                time.sleep(self.sleep)
            if self._fails_here(ctx):
                if earlier < self.transient_failures:
                    raise TransientToolError(f"{self.name}: transient failure {earlier + 1}")
                if self.permanent:
                    raise PermanentToolError(f"{self.name}: {self.permanent}")
            output = self.returns(params) if callable(self.returns) else self.returns
            if self.side_effect:
                self.log.perform_once(ctx.idempotency_key, {"tool": self.name, "node": ctx.node_id})
            if self.replan and self._fails_here(ctx):
                raise ReplanRequested(f"{self.name}: {self.replan}", output=output)
            if self.job_seconds is not None:
                return {"until": time.time() + self.job_seconds, "result": output, "fails": self.job_fails}
            return output

    def as_tool(self) -> Tool:
        def call(ctx: ToolContext, **params: Any) -> Any:
            return self(ctx, **params)

        call.__name__ = self.name
        return Tool(
            name=self.name,
            description=self.description,
            func=call,
            args_schema=self.args_schema,
            poll=poll_timed_job if self.job_seconds is not None else None,
            poll_interval=self.poll_interval,
            timeout=self.job_timeout,
            pool=self.pool,
            pool_slots=self.pool_slots,
            needs_approval=self.needs_approval,
        )


def poll_timed_job(handle: Mapping[str, Any]) -> JobStatus:
    """Status of a job started by an asynchronous :class:`ScriptedTool`."""
    if time.time() < handle["until"]:
        return JobStatus.pending()
    if handle.get("fails"):
        return JobStatus.failed(handle["fails"])
    return JobStatus.done(handle.get("result"))


def scripted_registry(*tools: ScriptedTool) -> ToolRegistry:
    return ToolRegistry([t.as_tool() for t in tools])


PlanSource = Plan | Mapping[str, Any] | str | None | Callable[["PlanRequest"], Any]


class ScriptedPlanner:
    """Chooses a plan from the last error it was given.

    ``initial`` answers the first planning request; ``on_error`` is a list of ``(regex, plan)`` pairs tried
    in order against ``request.last_error`` on a replan (each plan is a replacement subgraph); a request
    matching nothing gets ``otherwise`` (default: no plan). A plan may be a callable taking the request.
    ``requests`` keeps every request seen in this process.
    """

    def __init__(
        self,
        initial: PlanSource,
        on_error: Sequence[tuple[str, PlanSource]] = (),
        otherwise: PlanSource = None,
    ) -> None:
        self.initial = initial
        self.on_error = list(on_error)
        self.otherwise = otherwise
        self.requests: list[PlanRequest] = []

    def plan(self, request: PlanRequest) -> Any:
        self.requests.append(request)
        choice: PlanSource = self.otherwise
        if not request.is_replan:
            choice = self.initial
        else:
            for pattern, candidate in self.on_error:
                if re.search(pattern, request.last_error or ""):
                    choice = candidate
                    break
        return choice(request) if callable(choice) else choice
