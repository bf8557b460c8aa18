"""One plan node as one mapped task instance: decide, resolve inputs, call the tool, record the outcome."""

from __future__ import annotations

import json
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from airflow_plan_provider.exceptions import PermanentToolError, ReplanRequested, TransientToolError
from airflow_plan_provider.operators._xcom import NODE_KEY, pull_node_record, pull_plan, pull_session
from airflow_plan_provider.plan.budgets import step_allowed
from airflow_plan_provider.plan.references import MissingInput, UnresolvedReference, resolve
from airflow_plan_provider.plan.result import now, summarize
from airflow_plan_provider.plan.state import NodeStatus, decide
from airflow_plan_provider.tools.registry import ToolContext, ToolRegistry, load_tools

NODE_LABEL = "plan_node_label"


def idempotency_key(dag_id: str, root_run_id: str, node_id: str, revision: int) -> str:
    """Same for every try of one node in one revision of one session; differs everywhere else."""
    return f"{dag_id}/{root_run_id}/{node_id}/r{revision}"


class PlanNodeOperator(BaseOperator):
    """Run node ``plan_node`` of the plan published by the planning task (one instance per mapped node).

    Skips when a hard parent failed or was skipped, or a parent's result made it moot; runs with the
    missing inputs named when an optional parent failed; reuses a locked node's output without calling
    its tool. Transient tool errors are retried by Airflow; permanent ones fail at once.
    Every outcome is pushed as XCom ``node`` for the nodes downstream and for finalize.
    """

    template_fields = ("plan_node",)
    ui_color = "#e8f4e4"

    def __init__(self, *, plan_node: str, tools: ToolRegistry | str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plan_node = plan_node
        self.tools = tools

    def execute(self, context: Any) -> None:
        ti = context["ti"]
        plan = pull_plan(ti)
        if plan is None:
            raise AirflowFailException("no plan was published by the planning task")
        state = pull_session(ti)
        node = plan.node(self.plan_node)
        context[NODE_LABEL] = f"{node.id} · {node.action}"
        base = {
            "node_id": node.id,
            "revision": state.revision,
            "action": node.action,
            "tool": node.tool,
            "attempts": ti.try_number,
            "started_at": now(),
        }

        def push(status: str, **fields: Any) -> None:
            ti.xcom_push(key=NODE_KEY, value={**base, "status": status, "ended_at": now(), **fields})

        parents = {p: pull_node_record(ti, plan, p) for p in plan.parents[node.id]}
        statuses = {p: NodeStatus(r["status"]) if r else NodeStatus.FAILED for p, r in parents.items()}
        moot = [p for p, r in parents.items() if r and r.get("replan_requested")]
        decision = decide(plan, node.id, statuses, moot)
        if decision.action != "run":
            push("skipped", error=decision.reason)
            raise AirflowSkipException(f"node {node.id}: {decision.reason}")

        if node.id in state.locked:
            locked = state.locked[node.id]
            self.log.info("node %s succeeded in an earlier revision; reusing its output", node.id)
            push("success", reused=True, attempts=0, output=locked.output, output_summary=locked.summary)
            return

        position = state.execution_order.index(node.id)
        if not step_allowed(state.budgets, state.usage.steps, position):
            reason = (
                f"step budget spent: node {node.id} would be step {state.usage.steps + position + 1} "
                f"of {state.budgets.max_steps}"
            )
            push("skipped", budget_exhausted=True, error=reason)
            raise AirflowSkipException(reason)

        outputs = {p: r.get("output") for p, r in parents.items() if r and r["status"] == "success"}
        missing = list(decision.missing)
        if missing:
            self.log.warning("node %s runs without the output of optional parent(s) %s", node.id, missing)

        def fail(reason: str) -> AirflowFailException:
            push("failed", error=reason, missing_inputs=missing)
            return AirflowFailException(f"node {node.id}: {reason}")

        try:
            params = _without_missing(resolve(node.params, outputs))
        except UnresolvedReference as error:
            raise fail(str(error)) from error
        tools = load_tools(self.tools)
        tool = tools.get(node.tool)
        if tool is None:
            raise fail(f"unknown tool {node.tool!r}")
        bad = [
            f"{'.'.join(map(str, e.absolute_path)) or 'params'}: {e.message}"
            for e in tool.validator.iter_errors(params)
        ]
        if bad:
            raise fail(
                f"params for tool {tool.name!r} are invalid after resolving references: {'; '.join(bad)}"
            )

        ctx = ToolContext(
            node_id=node.id,
            idempotency_key=idempotency_key(
                ti.dag_id, state.root_run_id or ti.run_id, node.id, state.revision
            ),
            attempt=ti.try_number,
            missing_inputs=tuple(missing),
            run_id=ti.run_id,
            revision=state.revision,
        )
        self.log.info("node %s: calling %s (key %s)", node.id, tool.name, ctx.idempotency_key)
        try:
            output = tool.call(params, ctx)
        except ReplanRequested as request:
            output = _checked_output(request.output, fail)
            self.log.warning("node %s requests a replan: %s", node.id, request.reason)
            push(
                "success",
                replan_requested=True,
                error=request.reason,
                output=output,
                output_summary=summarize(output),
                missing_inputs=missing,
            )
            return
        except PermanentToolError as error:
            raise fail(error.reason) from error
        except Exception as error:
            reason = (
                error.reason if isinstance(error, TransientToolError) else f"{type(error).__name__}: {error}"
            )
            if ti.try_number > self.retries:
                push("failed", error=reason, missing_inputs=missing)
            raise
        output = _checked_output(output, fail)
        push("success", output=output, output_summary=summarize(output), missing_inputs=missing)


def _without_missing(value: Any) -> Any:
    """Missing optional inputs reach the tool as None (and are named in ``ctx.missing_inputs``)."""
    if isinstance(value, MissingInput):
        return None
    if isinstance(value, dict):
        return {k: _without_missing(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_missing(v) for v in value]
    return value


def _checked_output(output: Any, fail: Any) -> Any:
    try:
        json.dumps(output)
    except (TypeError, ValueError) as error:
        raise fail(f"tool output is not JSON-serialisable: {error}") from error
    return output


class LayerSelectOperator(BaseOperator):
    """Return the node ids of one layer of the published plan (empty when the plan is shallower)."""

    ui_color = "#f0f0f0"

    def __init__(self, *, layer: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.layer = layer

    def execute(self, context: Any) -> list[str]:
        plan = pull_plan(context["ti"])
        if plan is None or self.layer >= len(plan.layers):
            return []
        return plan.layers[self.layer]
