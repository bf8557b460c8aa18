"""The settings objects: defaults stated once, shared by the DAG, the CLI and validate_plan; clear errors."""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from datetime import timedelta

import pytest
from pydantic import ValidationError

from airflow_plan_provider import artifacts
from airflow_plan_provider.cli import build_parser
from airflow_plan_provider.plan.budgets import Budgets
from airflow_plan_provider.plan.validate import Limits
from airflow_plan_provider.settings import (
    OWNED_OPERATOR_ARGS,
    ApprovalPolicy,
    ArtifactStore,
    ControlRetries,
    NodeExecution,
    check_operator_args,
)


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: NodeExecution(retries=-1), "NodeExecution.retries"),
        (lambda: NodeExecution(retries=True), "NodeExecution.retries"),
        (lambda: NodeExecution(slot_wait=timedelta(seconds=-1)), "NodeExecution.slot_wait"),
        (lambda: NodeExecution(max_active_nodes=0), "NodeExecution.max_active_nodes"),
        (lambda: NodeExecution(retry_delay=5), "NodeExecution.retry_delay"),  # type: ignore[arg-type]
        (lambda: NodeExecution(timeout=timedelta(0)), "NodeExecution.timeout"),
        (lambda: NodeExecution(retry_exponential_backoff=-2), "NodeExecution.retry_exponential_backoff"),
        (lambda: NodeExecution(pool=" "), "NodeExecution.pool"),
        (lambda: ArtifactStore(threshold=-1), "ArtifactStore.threshold"),
        (lambda: ArtifactStore(url=""), "ArtifactStore.url"),
        (lambda: ArtifactStore(checkpoints="no"), "ArtifactStore.checkpoints"),  # type: ignore[arg-type]
        (lambda: ControlRetries(retries=-1), "ControlRetries.retries"),
        (lambda: ControlRetries(delay=timedelta(seconds=-1)), "ControlRetries.delay"),
        (lambda: ApprovalPolicy("maybe"), "ApprovalPolicy.mode"),  # type: ignore[arg-type]
        (lambda: ApprovalPolicy(timeout=timedelta(0)), "ApprovalPolicy.timeout"),
        (lambda: ApprovalPolicy(approvers=[]), "ApprovalPolicy.approvers"),
        (lambda: ApprovalPolicy(approvers=[{"name": "no id"}]), "ApprovalPolicy.approvers"),
        (lambda: Limits(max_nodes=0), "Limits.max_nodes"),
    ],
)
def test_a_bad_value_is_an_error_naming_the_field(make, field) -> None:
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        make()


def test_budgets_name_the_field_and_settings_are_immutable() -> None:
    with pytest.raises(ValidationError, match="max_steps"):
        Budgets(max_steps=0)
    with pytest.raises(ValidationError):
        Budgets().max_replans = 0  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        NodeExecution().retries = 9  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        ApprovalPolicy().mode = "never"  # type: ignore[misc]
    assert ApprovalPolicy(approvers="alice").approvers == ("alice",)
    assert ApprovalPolicy(approvers=["alice"]) == ApprovalPolicy(approvers=("alice",))


def test_the_cli_defaults_are_the_limits_defaults() -> None:
    parser = build_parser()
    for command in (
        ["validate", "p.json"],
        ["freeze", "p.json", "--tools", "m:r", "--dag-id", "d", "--schedule", "@daily"],
    ):
        args = parser.parse_args(command)
        assert Limits(max_nodes=args.max_nodes) == Limits(), command


def test_the_artifact_threshold_is_stated_once() -> None:
    assert ArtifactStore().threshold == artifacts.DEFAULT_THRESHOLD
    assert ArtifactStore().task_kwargs() == {
        "artifact_store": None,
        "artifact_threshold": artifacts.DEFAULT_THRESHOLD,
        "checkpoints": True,
    }


def test_node_execution_becomes_the_node_tasks_arguments() -> None:
    kwargs = NodeExecution(
        retries=1, timeout=timedelta(minutes=2), max_active_nodes=3, pool="p"
    ).task_kwargs()
    assert kwargs == {
        "retries": 1,
        "retry_delay": timedelta(seconds=5),
        "retry_exponential_backoff": 2.0,
        "max_retry_delay": timedelta(minutes=5),
        "execution_timeout": timedelta(minutes=2),
        "max_active_tis_per_dagrun": 3,
        "slot_wait": 30.0,
        "pools_count_deferred": True,
        "pool": "p",
    }
    assert "pool" not in NodeExecution().task_kwargs()
    assert NodeExecution(pools_count_deferred=False).task_kwargs()["pools_count_deferred"] is False
    with pytest.raises(ValueError, match=r"pools_count_deferred must be a bool, got 1"):
        NodeExecution(pools_count_deferred=1)  # type: ignore[arg-type]
    # no cap of the node task's own: Airflow's None for max_active_tis_per_dagrun
    assert NodeExecution(max_active_nodes=None).task_kwargs()["max_active_tis_per_dagrun"] is None
    with pytest.raises(ValueError, match=r"max_active_nodes must be an integer >= 1 or None, got 0"):
        NodeExecution(max_active_nodes=0)


def test_operator_args_may_not_set_what_a_setting_owns() -> None:
    assert check_operator_args(None) == {}
    assert check_operator_args({"owner": "data", "queue": "q"}) == {"owner": "data", "queue": "q"}
    with pytest.raises(ValueError, match=r"'retries': it is set by NodeExecution\(retries=\.\.\.\)"):
        check_operator_args({"owner": "data", "retries": 5})
    with pytest.raises(ValueError, match=r"'pool': it is set by NodeExecution\(pool=\.\.\.\)"):
        check_operator_args({"pool": "p"})
    with pytest.raises(ValueError, match="operator_args must be a mapping"):
        check_operator_args([("owner", "x")])  # type: ignore[arg-type]
    # every argument a setting gives the node tasks is refused in operator_args
    assert set(NodeExecution(pool="p").task_kwargs()) <= set(OWNED_OPERATOR_ARGS)
    assert set(ControlRetries().task_kwargs()) <= set(OWNED_OPERATOR_ARGS)
