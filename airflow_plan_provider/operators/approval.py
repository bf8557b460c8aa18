"""The approval task: a human approves the plan's risky nodes before any node runs.

It sits between ``plan`` and the first node task, and uses Airflow's human-in-the-loop
:class:`~airflow.providers.standard.operators.hitl.ApprovalOperator`: the request (subject, a Markdown
body with the plan and the params of the nodes asked about, secrets hidden) appears on the run's
"Required actions" page and under ``/api/v2/dags/{dag}/dagRuns/{run}/taskInstances/approve/-1/
hitlDetails`` (answer with ``PATCH`` and ``{"chosen_options": ["Approve"]}`` or ``["Reject"]``).

Which nodes are asked about is decided by the pure core (:func:`~airflow_plan_provider.plan.approval.
nodes_to_approve`); when none is, the task records ``not_needed`` and skips itself, and the nodes run
(their trigger rule lets a skipped approval through). The outcome is pushed as XCom ``approval``:
finalize adds it to the session (``approval.granted`` / ``approval.rejected`` events, the
SessionResult's ``approvals``). A rejection, or no answer before ``response_timeout`` (the request has
no default answer, so the form offers Approve and Reject alike; a timeout counts as a rejection),
ends the task failed ("plan rejected: rejected by <user>; no node runs"), so the node tasks and the
pool lanes' ``select_nodes__<pool>`` tasks end ``upstream_failed`` and no node runs; finalize ends the
session failed with reason ``rejected``. The grid names the task "approval" (its id stays ``approve``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow.providers.standard.operators.hitl import ApprovalOperator

from airflow_plan_provider.airflow_features import AirflowFailException, AirflowSkipException
from airflow_plan_provider.contract import APPROVAL_KEY, APPROVE_TASK, ApprovalRecord
from airflow_plan_provider.exceptions import TriggerEventError
from airflow_plan_provider.operators.layout import pull_plan, pull_session, pull_tools, task_id_in
from airflow_plan_provider.plan.approval import (
    APPROVAL_MODES,
    Approval,
    ApprovalMode,
    approved_calls,
    nodes_to_approve,
    request_text,
)
from airflow_plan_provider.plan.result import now
from airflow_plan_provider.plan.session import SessionState, record_approval, record_approval_not_needed
from airflow_plan_provider.settings import Approver
from airflow_plan_provider.tools.registry import ToolRegistry, load_tools
from airflow_plan_provider.triggers.payloads import validate_approval_event

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_plan_provider.plan.model import ValidatedPlan


def assigned_users(approvers: Sequence[Approver] | str | None) -> list[dict[str, str]] | None:
    """Approvers as Airflow HITL users (``{"id", "name"}``): a string is a user id (and its name)."""
    if approvers is None:
        return None
    if isinstance(approvers, str):
        approvers = [approvers]
    users = []
    for approver in approvers:
        if isinstance(approver, str) and approver.strip():
            users.append({"id": approver, "name": approver})
        elif isinstance(approver, Mapping) and isinstance(approver.get("id"), str) and approver["id"]:
            users.append({"id": approver["id"], "name": str(approver.get("name") or approver["id"])})
        else:
            raise ValueError(
                f"an approver is a user id or a mapping with 'id' (and 'name'), not {approver!r}"
            )
    return users or None


def _iso(value: Any) -> str | None:
    if isinstance(value, datetime):
        return value.isoformat(timespec="milliseconds")
    return str(value) if value else None


class PlanApprovalOperator(ApprovalOperator):
    """Ask a human to approve the plan's risky nodes (or every node, ``mode="always"``) before they run.

    :param mode: ``risky``, ``always`` or ``never`` (see :mod:`airflow_plan_provider.plan.approval`).
    :param tools: the DAG's tools (a registry or a spec string); a tool with ``needs_approval`` is risky.
    :param approvers: user ids (or ``{"id", "name"}`` mappings) allowed to answer; ``None``: any user
        allowed to answer HITL requests of this DAG.
    :param response_timeout: how long to wait for an answer; no answer in time is a rejection.
    """

    # subject and body are written at run time from the plan, which is untrusted text: never Jinja
    template_fields: Sequence[str] = ()
    ui_color = "#fff3c4"

    def __init__(
        self,
        *,
        mode: ApprovalMode = "risky",
        tools: ToolRegistry | str | None = None,
        approvers: Sequence[Approver] | str | None = None,
        response_timeout: timedelta | None = timedelta(days=1),
        **kwargs: Any,
    ) -> None:
        if mode not in APPROVAL_MODES:
            raise ValueError(f"approval must be one of {APPROVAL_MODES}, not {mode!r}")
        if response_timeout is not None and (
            not isinstance(response_timeout, timedelta) or response_timeout <= timedelta(0)
        ):
            raise ValueError(
                f"approval_timeout must be a positive timedelta or None, not {response_timeout!r}"
            )
        kwargs.setdefault("retries", 0)  # a retry would ask again for an answer already given
        # the grid's name for the task: "approve" with a green Success read as an approval whatever the
        # answer was; the task id stays (REST scripts answer .../taskInstances/approve/-1/hitlDetails)
        kwargs.setdefault("task_display_name", "approval")
        super().__init__(
            subject="Approve the plan before its nodes run",
            # no default option: Airflow's form draws a default as the one primary button, and Approve
            # and Reject are equally easy; a timeout still rejects (execute_complete gets a timeout event)
            defaults=None,
            assigned_users=assigned_users(approvers),
            response_timeout=response_timeout,
            **kwargs,
        )
        self.mode = mode
        self.tools = tools

    def execute(self, context: Context) -> None:
        ti = context["ti"]
        plan = pull_plan(ti)
        if plan is None:
            raise AirflowSkipException("planning did not publish a plan")
        state = pull_session(ti)
        tools = pull_tools(ti, load_tools(self.tools))
        risky = sorted(name for name, tool in tools.items() if tool.needs_approval)
        asked = nodes_to_approve(
            plan, risky_tools=risky, mode=self.mode, approvals=state.approvals, locked=state.locked
        )
        if not asked:
            earlier = [n.id for n in plan.nodes if n.tool in risky and n.id not in state.locked]
            ti.xcom_push(
                key=APPROVAL_KEY,
                value=ApprovalRecord.not_needed(state.revision, earlier).model_dump(mode="json"),
            )
            raise AirflowSkipException(
                "no node needs approval"
                + (f" (risky nodes {earlier} were approved earlier in the session)" if earlier else "")
            )
        from airflow_plan_provider.compat import redact

        self.subject, self.body = request_text(
            plan,
            asked,
            risky_tools=risky,
            revision=state.revision,
            run_id=ti.run_id,
            locked=state.locked,
            redact=lambda value, key: redact(value, key or None),
        )
        request = self._request(plan, asked, state.revision, ti.run_id)
        ti.xcom_push(key=APPROVAL_KEY, value=ApprovalRecord.requested(request).model_dump(mode="json"))
        self.log.info("asking for approval of nodes %s (%s)", asked, self.subject)
        super().execute(context)

    def _request(self, plan: ValidatedPlan, asked: list[str], revision: int, run_id: str) -> Approval:
        """The approval asked for nodes ``asked`` of revision ``revision``: a rejection until answered."""
        return Approval(
            revision=revision,
            run_id=run_id,
            status="rejected",
            nodes=asked,
            calls=approved_calls(plan, asked),
            approvers=[user["id"] for user in self.assigned_users or []],
            requested_at=now(),
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        """Record the answer; on anything but a timely "Approve", end failed ("plan rejected: rejected by
        <user>"): the task's state says what happened, and no node task runs after it.

        An event the approval trigger cannot have sent fails the task: no node runs, and finalize counts
        the request without an answer as a rejection.
        """
        try:
            event = dict(validate_approval_event(event))
        except TriggerEventError as error:
            raise AirflowFailException(f"task {self.task_id!r}: {error}") from error
        ti = context["ti"]
        requested = ti.xcom_pull(task_ids=ti.task_id, key=APPROVAL_KEY) or {}
        approval = Approval.model_validate({**requested, "status": "rejected"})
        user = event.get("responded_by_user") or None
        timed_out = bool(event.get("timedout")) or ("error" in event and event.get("error_type") == "timeout")
        chosen = list(event.get("chosen_options") or [])
        if "error" not in event:
            self.validate_chosen_options(chosen)
        approval.responded_by = str(user.get("name") or user.get("id")) if isinstance(user, Mapping) else None
        approval.responded_at = _iso(event.get("responded_at")) or now()
        approval.timed_out = timed_out
        if chosen == [self.APPROVE] and not timed_out and user is not None:
            approval.status = "granted"
            approval.message = f"approved by {approval.responded_by}"
        elif timed_out:
            approval.calls = {}
            approval.message = (
                f"no answer within {self.response_timeout} (a timeout is a rejection)"
                if self.response_timeout
                else "no answer (a timeout is a rejection)"
            )
        else:
            approval.calls = {}
            detail = f": {event['error']}" if "error" in event else ""
            approval.message = f"rejected by {approval.responded_by or 'nobody'}{detail}"
        ti.xcom_push(key=APPROVAL_KEY, value=approval.model_dump(mode="json"))
        self.log.info("approval of nodes %s: %s (%s)", approval.nodes, approval.status, approval.message)
        if approval.status != "granted":
            # a rejection ends the task failed (never retried: it would ask again), so its state reads as
            # what happened; the node tasks and the lanes' select tasks, which follow it directly, end
            # upstream_failed, and finalize reads the answer from the XCom above
            raise AirflowFailException(f"plan rejected: {approval.message}; no node runs")
        return approval.model_dump(mode="json")


def record_answer(ti: Any, state: SessionState) -> tuple[SessionState, Approval | None]:
    """The session with the run's approval answer recorded (if its approval task asked); for finalize.

    Returns the answer too, ``None`` when nothing was asked (no approval task, or approval not needed).
    A request with no answer (the approval task ended without one) counts as a rejection.
    """
    value = ti.xcom_pull(task_ids=task_id_in(ti, APPROVE_TASK), key=APPROVAL_KEY)
    if not isinstance(value, dict):
        return state, None
    record = ApprovalRecord.model_validate(value)
    approval = record.answer()
    if approval is None:
        return record_approval_not_needed(state, record.approved_earlier), None
    return record_approval(state, approval), approval
