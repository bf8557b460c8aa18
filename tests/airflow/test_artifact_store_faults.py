"""An artifact store that is full or read-only when a node's large output comes (dag.test on SQLite).

The store is a small tmpfs of its own (mounting one needs root with CAP_SYS_ADMIN; the tests skip
without): filled up by a file of the test's, or remounted read-only, it refuses the output with the
operating system's own error. The node's try fails with a reason naming the store, Airflow retries it,
and the store has recovered by then (the retry callback frees the space or remounts it read-write): the
node succeeds on its second try and the store holds whole files only, no temporary file and no
checkpoint but the one of the try that succeeded.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_plan_provider import ArtifactStore, NodeExecution, artifacts
from airflow_plan_provider.contract import NODE_KEY, NODES_TASK
from airflow_plan_provider.testing import CallLog, ScriptedPlanner, ScriptedTool, scripted_registry
from airflow_plan_provider.testing.in_process import run_plan_dag
from tests.airflow.support import xcom

pytestmark = pytest.mark.airflow

STORE_BYTES = 1024 * 1024
OUTPUT_BYTES = 300 * 1024  # over the 64 KiB threshold: the output goes to the store


def mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True, check=False)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs at ``tmp_path/store``."""
    folder = tmp_path / "store"
    folder.mkdir()
    mounted = mount("-t", "tmpfs", "-o", f"size={STORE_BYTES}", "tmpfs", str(folder))
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for the store (needs root): {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def run_with_a_store_fault(
    tmp_path: Path, store: Path, dag_id: str, recover: Callable[[], None]
) -> tuple[Any, CallLog, list[str]]:
    """Run a one-node plan whose output is OUTPUT_BYTES while the store refuses files; the retry
    callback calls ``recover``. Returns the run, the call log and what the store held when it recovered."""
    from airflow_plan_provider.dag_factory import build_plan_dag

    log = CallLog(tmp_path / "calls")
    seen: list[str] = []

    def on_retry(context: Any) -> None:
        seen.extend(files(store))
        recover()

    plan = {"nodes": [{"id": "big", "action": "extract a large table", "tool": "extract"}]}
    dag = build_plan_dag(
        dag_id,
        planner=ScriptedPlanner(plan),
        tools=scripted_registry(ScriptedTool("extract", log=log, returns={"rows": "x" * OUTPUT_BYTES})),
        execution=NodeExecution(retries=1, retry_delay=timedelta(0)),
        artifacts=ArtifactStore(url=f"file://{store}"),
        operator_args={"on_retry_callback": on_retry},
        replan=False,
    )
    return run_plan_dag(dag, {"goal": "store a large output"}), log, seen


def check_recovered(run: Any, log: CallLog, store: Path, seen: list[str], filler: list[str]) -> None:
    assert str(run.state) == "success"
    assert log.count("extract") == 2  # the tool returned twice: the first output had nowhere to go
    record = xcom(run, NODES_TASK, key=NODE_KEY, map_index=0)
    assert (record["status"], record["attempts"]) == ("success", 2)
    assert record["artifact"]["size"] > OUTPUT_BYTES
    # when the store recovered it held nothing of the failed try: no output, no temporary file, no checkpoint
    assert seen == filler
    # afterwards: the output and the checkpoint of the second try, whole
    key = record["artifact"]["uri"].split("/outputs/")[1].split("/")[0]
    assert files(store) == sorted(
        [f"checkpoints/{key}.json", f"outputs/{key}/{record['artifact']['sha256']}.json"]
    )
    [checkpoint] = (store / "checkpoints").iterdir()
    saved = json.loads(checkpoint.read_text())
    assert artifacts.load_checkpoint(saved["key"], f"file://{store}") == saved["record"]
    assert saved["record"]["attempts"] == 2


def test_a_full_store_fails_the_try_naming_the_store_and_the_retry_succeeds_once_it_has_room(
    tmp_path: Path, store: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    filler = store / "filler"
    filler.write_bytes(b"\0" * (STORE_BYTES - 128 * 1024))  # room for less than the output

    run, log, seen = run_with_a_store_fault(tmp_path, store, "store_full", filler.unlink)
    check_recovered(run, log, store, seen, ["filler"])
    reasons = [line for line in capfd.readouterr().out.splitlines() if "its output was not stored" in line]
    assert len(reasons) == 1, reasons
    assert f"the artifact store file://{store} could not take a node's output" in reasons[0]
    assert "No space left on device" in reasons[0]


def test_a_read_only_store_fails_the_try_naming_the_store_and_the_retry_succeeds_once_writable(
    tmp_path: Path, store: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    assert mount("-o", "remount,ro", str(store)).returncode == 0

    def writable() -> None:
        assert mount("-o", "remount,rw", str(store)).returncode == 0

    run, log, seen = run_with_a_store_fault(tmp_path, store, "store_read_only", writable)
    check_recovered(run, log, store, seen, [])
    reasons = [line for line in capfd.readouterr().out.splitlines() if "its output was not stored" in line]
    assert len(reasons) == 1, reasons
    assert f"the artifact store file://{store} could not take a node's output" in reasons[0]
    assert "Read-only file system" in reasons[0]
