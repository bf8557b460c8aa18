"""Every error the provider raises.

::

    PlanProviderError
    ├── PlanValidationError      a plan broke one or more rules; ``.problems`` lists each one
    ├── PlanningError            a planner produced no usable plan (``.problems`` from the last attempt)
    ├── FreezeError              a session or plan cannot be frozen into a DAG file (why, in its text)
    ├── TriggerEventError        a deferred task resumed with an event its trigger cannot have sent
    ├── ArtifactStoreError       the artifact store did not take a file (the try fails; Airflow retries)
    ├── ToolSourceError          a tool source (an MCP server) could not be read or listed (names it)
    └── ToolError                raised by tools, read by the node runner
        ├── TransientToolError   worth retrying (timeouts, 5xx, rate limits)
        ├── PermanentToolError   retrying cannot help (bad credentials, missing resource)
        └── ReplanRequested      the tool worked, and its result makes the rest of the plan moot
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_plan_provider.problems import describe

if TYPE_CHECKING:
    from airflow_plan_provider.problems import Problem


class PlanProviderError(Exception):
    """Base class of every error raised by airflow-plan-provider."""


class FreezeError(PlanProviderError):
    """A session or plan cannot be frozen into a DAG file: the message names the source and the fault."""


class ArtifactStoreError(PlanProviderError):
    """The artifact store could not take a file (unwritable, full, unreachable): the message names the
    store, and nothing of the file is left there. Not the node's fault: its task fails the try and Airflow
    retries it (``NodeExecution.retries``), which succeeds once the store takes files again."""


class ToolSourceError(PlanProviderError):
    """A tool source could not be read or listed: its connection is missing or malformed, or its server
    cannot be reached or answered with an error. The message names the source (its connection id) and
    the fault. Raised while a run plans: the planning task fails its try and Airflow retries it."""


class TriggerEventError(PlanProviderError):
    """A deferred task resumed with an event its trigger cannot have sent (none, an unknown status, a
    missing or unexpected field): the message names the trigger and what is wrong."""


class PlanValidationError(PlanProviderError):
    """A plan is invalid. ``problems`` holds every problem found, not only the first.

    The message lists the first :data:`~airflow_plan_provider.problems.MAX_REPORTED_PROBLEMS`
    problems and counts the rest, so it stays small however many problems a plan has.
    """

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = list(problems)
        super().__init__(f"plan is invalid ({len(self.problems)} problem(s)):\n{describe(self.problems)}")


class PlanningError(PlanProviderError):
    """The planner could not produce a valid plan.

    ``problems`` holds every problem of the last attempt; the message is ``text`` (the error's own
    words) followed by the first problems and a count of the rest, as :class:`PlanValidationError`
    lists them.
    """

    def __init__(
        self,
        message: str,
        problems: list[Problem] | None = None,
        *,
        reason: str = "no_plan",
        usage: list[dict[str, int]] | None = None,
    ):
        self.text = message
        self.problems = list(problems or [])
        self.reason = reason
        self.usage = list(usage or [])  # token usage of every planner call made before giving up
        if self.problems:
            message += "\n" + describe(self.problems)
        super().__init__(message)


class ToolError(PlanProviderError):
    """Base class of the errors a tool raises to tell the runner what to do next."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class TransientToolError(ToolError):
    """The call may succeed if tried again; the node is retried with backoff."""

    def __init__(self, reason: str, *, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


class PermanentToolError(ToolError):
    """The call cannot succeed as planned; the node fails at once and becomes a replan candidate."""


class ReplanRequested(ToolError):
    """The tool ran and its result shows the rest of the plan is moot.

    ``output`` is kept as the node's output, so a replan can use it.
    """

    def __init__(self, reason: str, output: Any = None) -> None:
        super().__init__(reason)
        self.output = output
