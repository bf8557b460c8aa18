"""How a node's failure is retried: rate-limited tools wait as long as they asked, the rest use backoff."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import RetryDecision, RetryPolicy

from airflow_plan_provider.exceptions import TransientToolError

if TYPE_CHECKING:
    from airflow.sdk import Context


class ToolRetryPolicy(RetryPolicy):
    """A :class:`TransientToolError` with ``retry_after`` (e.g. HTTP 429 Retry-After) is retried after
    that delay; anything else falls through to the task's ``retries`` with exponential backoff. (A
    :class:`~airflow_plan_provider.exceptions.PermanentToolError` never reaches the policy: the node
    operator fails the task at once with ``AirflowFailException``.)"""

    def evaluate(
        self, exception: BaseException, try_number: int, max_tries: int, context: Context | None = None
    ) -> RetryDecision:
        if isinstance(exception, TransientToolError) and exception.retry_after:
            return RetryDecision.retry(
                delay=timedelta(seconds=exception.retry_after), reason=f"rate limited: {exception.reason}"
            )
        return RetryDecision.default()

    def serialize(self) -> dict[str, Any]:
        return {}

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> ToolRetryPolicy:
        return cls()
