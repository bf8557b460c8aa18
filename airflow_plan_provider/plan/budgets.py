"""Session budgets: node executions and replans across every revision of one goal."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from airflow_plan_provider.base_model import Model


class Budgets(Model):
    """A session's budgets (immutable): the trigger form's defaults; a run's conf may set its own.
    A bad value is a ``ValueError`` (pydantic's ``ValidationError``) naming the field."""

    model_config = ConfigDict(frozen=True)

    max_steps: int = Field(default=50, ge=1, description="Node executions across all revisions.")
    max_replans: int = Field(default=3, ge=0, description="Replans of one goal.")


class Usage(Model):
    steps: int = 0
    replans: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add_tokens(self, usage: dict[str, int]) -> None:
        self.prompt_tokens += int(usage.get("prompt_tokens", 0))
        self.completion_tokens += int(usage.get("completion_tokens", 0))


def step_refused(budgets: Budgets, steps_before: int, position: int, node_id: str) -> str | None:
    """Why the node at ``position`` (0-based, in execution order) of this revision may not execute, or
    ``None`` when it may: ``steps_before`` steps were spent by the earlier revisions.

    The position is fixed by the plan (layer, then id), so nodes running in parallel agree on it.

    >>> step_refused(Budgets(max_steps=3), 2, 1, "7")
    'step budget spent: node 7 would be step 4 of 3'
    """
    step = steps_before + position + 1
    if step <= budgets.max_steps:
        return None
    return f"step budget spent: node {node_id} would be step {step} of {budgets.max_steps}"
