"""The testing kit's call log (``airflow_plan_provider.testing.CallLog``): one folder every process of
a test deployment writes."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from airflow_plan_provider.testing import CallLog, ScriptedTool
from airflow_plan_provider.tools.tool import ToolContext


def test_a_call_log_named_by_an_environment_variable_is_where_the_test_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DAG file parsed in another process finds the folder the test gave every process; without it,
    the system's temporary folder."""
    monkeypatch.setenv("PLAN_TEST_CALLS", str(tmp_path))
    log = CallLog.in_folder_of("PLAN_TEST_CALLS", "my_dag")
    ScriptedTool("fetch", log=log, returns=1)(ToolContext(node_id="n1", idempotency_key="k/n1"))
    assert log.folder == tmp_path / "my_dag"
    assert [call["tool"] for call in CallLog(tmp_path / "my_dag").calls()] == ["fetch"]
    monkeypatch.delenv("PLAN_TEST_CALLS")
    fallback = CallLog.in_folder_of("PLAN_TEST_CALLS", "my_dag").folder
    assert fallback.parent.parent == Path(tempfile.gettempdir()) and fallback.name == "my_dag"
