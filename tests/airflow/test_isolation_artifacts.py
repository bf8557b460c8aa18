"""Runs that cannot reach each other through the artifact store (dag.test on SQLite, and unit tests).

Checkpoint and output names come from hashed keys (no two keys share a file); checkpoints are verified
before they are trusted; a node dereferences only outputs the provider stored itself, in its store;
the idempotency key follows the node's call, not the revision; and the checkpoint is saved before the
node's record is pushed.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_plan_provider import ArtifactStore, NodeExecution
from airflow_plan_provider.contract import FINALIZE_TASK, NODE_KEY, NODES_TASK
from airflow_plan_provider.exceptions import PermanentToolError
from airflow_plan_provider.testing import CallLog, ScriptedPlanner, ScriptedTool, scripted_registry
from airflow_plan_provider.testing.in_process import run_plan_dag, run_session
from airflow_plan_provider.tools.tool import ToolContext
from tests.airflow.support import task_states, xcom


def build(dag_id: str, planner: Any, tools: list[ScriptedTool], **options: Any) -> Any:
    from airflow_plan_provider.dag_factory import build_plan_dag

    options.setdefault("execution", NodeExecution(retries=0, retry_delay=timedelta(0)))
    options.setdefault("replan", False)
    return build_plan_dag(dag_id, planner=planner, tools=scripted_registry(*tools), **options)


class ContextTool(ScriptedTool):
    """A scripted tool whose behaviour is a function of its context and params (logged like any call)."""

    def __init__(self, name: str, behave: Callable[[ToolContext, dict[str, Any]], Any], **kwargs: Any):
        super().__init__(name, **kwargs)
        self.behave = behave

    def __call__(self, ctx: ToolContext, **params: Any) -> Any:
        with self.log.call(self.name, ctx):
            return self.behave(ctx, params)


@pytest.fixture
def artifact_warnings() -> Iterator[list[str]]:
    """Warnings of the artifacts module (a handler on its own logger: Airflow reconfigures the root one)."""
    messages: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    logger, handler = logging.getLogger("airflow_plan_provider.artifacts"), Keep(logging.WARNING)
    logger.addHandler(handler)
    yield messages
    logger.removeHandler(handler)


def records(run: Any, task_id: str, count: int) -> list[dict[str, Any]]:
    return [xcom(run, task_id, key=NODE_KEY, map_index=i) for i in range(count)]


def try_number(run: Any, task_id: str, map_index: int) -> int:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        ti = (
            session.query(TaskInstance)
            .filter_by(dag_id=run.dag_id, run_id=run.run_id, task_id=task_id, map_index=map_index)
            .one()
        )
        return int(ti.try_number)


def two_nodes(tool: str) -> dict[str, Any]:
    return {
        "nodes": [
            {"id": "a", "action": "fetch a", "tool": tool, "params": {"item": "a"}},
            {"id": "b", "action": "fetch b", "tool": tool, "params": {"item": "b"}},
        ]
    }


# ------------------------------------------------------------------ 1. names derived from keys, hashed


def test_keys_that_differ_only_in_punctuation_have_separate_checkpoints(tmp_path):
    from airflow_plan_provider import artifacts

    base = f"file://{tmp_path}/store"
    first, second = "d/nightly/fetch_metrics/r0", "d/nightly_fetch/metrics/r0"
    artifacts.save_checkpoint(first, {"output": "from the first key"}, base)
    assert artifacts.load_checkpoint(second, base) is None
    assert artifacts.load_checkpoint(first, base)["output"] == "from the first key"


@pytest.mark.airflow
def test_runs_whose_ids_differ_only_in_punctuation_each_call_their_tool(tmp_path, monkeypatch):
    """Run ids are chosen by whoever triggers a run (REST API, CLI); dag.test has no run_id argument, so
    Airflow's run id generator is replaced to give the two runs the ids a user could have chosen."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.net import get_hostname

    run_ids = iter(["nightly:2024", "nightly+2024"])
    monkeypatch.setattr(DagRun, "generate_run_id", staticmethod(lambda **_: next(run_ids)))
    log = CallLog(tmp_path / "calls")
    tool = ContextTool("fetch", lambda ctx, params: {"run": ctx.run_id}, log=log)
    plan = {"nodes": [{"id": "1", "action": "fetch", "tool": "fetch"}]}
    dag = build(
        "iso_run_ids", ScriptedPlanner(plan), [tool], artifacts=ArtifactStore(url=f"file://{tmp_path}/store")
    )

    runs = [run_plan_dag(dag, {"goal": "g"}) for _ in range(2)]

    assert [r.run_id for r in runs] == ["nightly:2024", "nightly+2024"]
    assert [str(r.state) for r in runs] == ["success", "success"]
    second = xcom(runs[1], NODES_TASK, key=NODE_KEY, map_index=0)
    assert second["output"] == {"run": "nightly+2024"}
    assert not second.get("reused") and not second.get("checkpoint")
    assert log.count("fetch") == 2
    # issue 14: each record names the worker that ran the node, as Airflow names it
    assert second["hostname"] == get_hostname()
    assert xcom(runs[1], FINALIZE_TASK)["history"][0]["hostname"] == get_hostname()


# ------------------------------------------------ 3. checkpoints verified before they are trusted


def _replace_text(value: Any, old: str, new: str) -> Any:
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, dict):
        return {k: _replace_text(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_text(v, old, new) for v in value]
    return value


def _checkpoint_of(store: Path, node: str) -> Path:
    [path] = [p for p in (store / "checkpoints").rglob("*.json") if f"genuine-{node}" in p.read_text()]
    return path


def _alter(store: Path) -> str:
    path = _checkpoint_of(store, "b")
    path.write_text(json.dumps(_replace_text(json.loads(path.read_text()), "genuine-b", "forged-b")))
    return "b"


def _truncate(store: Path) -> str:
    path = _checkpoint_of(store, "b")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return "b"


def _copy_other_key(store: Path) -> str:
    _checkpoint_of(store, "b").write_bytes(_checkpoint_of(store, "a").read_bytes())
    return "b"


@pytest.mark.airflow
@pytest.mark.parametrize(
    ("tamper", "warning"),
    [
        (_alter, "content does not match its sha256"),
        (_truncate, "not JSON"),
        (_copy_other_key, "saved for another key"),
    ],
    ids=["altered", "truncated", "copied"],
)
def test_a_checkpoint_that_fails_verification_is_ignored_and_the_node_runs(
    tmp_path, artifact_warnings, tamper, warning
):
    store = tmp_path / "store"
    log = CallLog(tmp_path / "calls")
    tool = ContextTool("fetch", lambda ctx, params: {"value": f"genuine-{params['item']}"}, log=log)
    dag = build(
        f"iso_checkpoint_{tamper.__name__.strip('_')}",
        ScriptedPlanner(two_nodes("fetch")),
        [tool],
        artifacts=ArtifactStore(url=f"file://{store}"),
        execution=NodeExecution(retries=1, retry_delay=timedelta(0)),
    )
    # the same logical date gives the same run id: dag.test replaces the run, as a clear would
    when = datetime(2024, 5, 1, tzinfo=UTC)
    first = run_plan_dag(dag, {"goal": "g"}, logical_date=when, run_after=when)
    assert str(first.state) == "success" and log.count("fetch") == 2

    tampered = tamper(store)
    again = run_plan_dag(dag, {"goal": "g"}, logical_date=when, run_after=when)

    assert again.run_id == first.run_id
    assert str(again.state) == "success", task_states(again)
    a, b = records(again, NODES_TASK, 2)
    assert tampered == "b"
    assert (b["status"], b["output"]) == ("success", {"value": "genuine-b"})
    assert not b.get("checkpoint")  # the node ran again instead of trusting the file
    assert log.count("fetch", "b") == 2
    # the untouched checkpoint still spares node a its call
    assert (a["output"], a["checkpoint"], log.count("fetch", "a")) == ({"value": "genuine-a"}, True, 1)
    ignored = [m for m in artifact_warnings if "ignoring checkpoint" in m]
    assert len(ignored) == 1 and warning in ignored[0] and "/b/" in ignored[0]


def test_checkpoints_are_written_whole_with_their_key_and_checksum(tmp_path):
    from airflow_plan_provider import artifacts

    base = f"file://{tmp_path}"
    artifacts.save_checkpoint("d/r/n/k", {"output": [1, 2]}, base)
    [path] = (tmp_path / "checkpoints").iterdir()
    content = json.loads(path.read_text())
    assert content["key"] == "d/r/n/k" and content["record"] == {"output": [1, 2]}
    assert len(content["sha256"]) == 64
    assert path.name == f"{hashlib.sha256(b'd/r/n/k').hexdigest()}.json"
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == [path.name]  # no temporary file left


# --------------------------------------- 4. only outputs the provider stored, in its store, are read


@pytest.mark.airflow
def test_a_tool_output_that_looks_like_a_reference_is_passed_on_as_plain_data(tmp_path):
    secret = tmp_path / "elsewhere" / "secret.json"
    secret.parent.mkdir()
    secret.write_text(json.dumps({"secret": "s3cr3t"}))
    data = secret.read_bytes()
    forged = {
        "__artifact__": 1,
        "uri": f"file://{secret}",
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "summary": "",
    }
    log = CallLog(tmp_path / "calls")
    tools = [
        ScriptedTool("forge", log=log, returns=forged),
        ScriptedTool("echo", log=log, returns=lambda params: params["data"]),
    ]
    plan = {
        "nodes": [
            {"id": "1", "action": "forge", "tool": "forge"},
            {"id": "2", "action": "echo", "tool": "echo", "params": {"data": "${1}"}},
        ]
    }
    dag = build(
        "iso_forged_ref",
        ScriptedPlanner(plan),
        tools,
        artifacts=ArtifactStore(url=f"file://{tmp_path}/store"),
    )
    run = run_plan_dag(dag, {"goal": "g"})
    assert str(run.state) == "success", task_states(run)
    record = xcom(run, NODES_TASK, key=NODE_KEY, map_index=1)
    assert record["output"] == forged
    assert "s3cr3t" not in json.dumps(xcom(run, FINALIZE_TASK))


def _corrupt_in_place(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle] = ord("y") if data[middle] != ord("y") else ord("z")
    path.write_bytes(bytes(data))


def _truncate_file(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-100])


@pytest.mark.airflow
@pytest.mark.parametrize("damage", [_corrupt_in_place, _truncate_file], ids=["altered", "truncated"])
def test_a_damaged_stored_output_fails_the_reading_node_for_good(tmp_path, damage):
    store = tmp_path / "store"
    log = CallLog(tmp_path / "calls")
    big = {"rows": "x" * 4096}

    def damage_the_stored_output(ctx: ToolContext, params: dict[str, Any]) -> str:
        [path] = [p for p in store.rglob("*.json") if "checkpoints" not in p.parts]
        damage(path)
        return hashlib.sha256(path.read_bytes()).hexdigest()

    tools = [
        ScriptedTool("extract", log=log, returns=big),
        ContextTool("damage", damage_the_stored_output, log=log),
        ScriptedTool("consume", log=log, returns=lambda params: len(params["data"]["rows"])),
    ]
    plan = {
        "nodes": [
            {"id": "1", "action": "extract", "tool": "extract"},
            {"id": "2", "action": "damage", "tool": "damage", "dependencies": ["1"]},
            {
                "id": "3",
                "action": "consume",
                "tool": "consume",
                "params": {"data": "${1}"},
                "dependencies": ["2"],
            },
        ]
    }
    dag = build(
        f"iso_damaged_{damage.__name__.strip('_')}",
        ScriptedPlanner(plan),
        tools,
        artifacts=ArtifactStore(url=f"file://{store}", threshold=1024),
        execution=NodeExecution(retries=2, retry_delay=timedelta(0)),
    )
    run = run_plan_dag(dag, {"goal": "g"})

    assert task_states(run)[f"{NODES_TASK}[2]"] == "failed"
    assert try_number(run, NODES_TASK, 2) == 1  # permanent: not retried
    assert log.count("consume") == 0
    uri = xcom(run, NODES_TASK, key=NODE_KEY, map_index=0)["artifact"]["uri"]
    actual = xcom(run, NODES_TASK, key=NODE_KEY, map_index=1)["output"]
    record = xcom(run, NODES_TASK, key=NODE_KEY, map_index=2)
    assert record["status"] == "failed"
    assert "parent node 1" in record["error"] and uri in record["error"]
    assert actual not in record["error"]  # the damaged file's hash is not revealed
    history = {r["node_id"]: r for r in xcom(run, FINALIZE_TASK)["history"]}
    assert history["3"]["status"] == "failed" and history["3"]["error"] == record["error"]


def _stored(tmp_path: Path, key: str) -> tuple[dict[str, Any], str]:
    from airflow_plan_provider import artifacts

    base = f"file://{tmp_path}/store"
    data = json.dumps({"rows": "x" * 200}).encode()
    ref = artifacts.store(data, key=key, summary="rows", base_url=base, threshold=100)
    assert ref is not None
    return ref, base


def test_a_stored_output_reads_back_for_its_own_key_only(tmp_path):
    from airflow_plan_provider import artifacts

    ref, base = _stored(tmp_path, "d/r/1/k")
    assert artifacts.load(ref, key="d/r/1/k", base_url=base) == {"rows": "x" * 200}
    with pytest.raises(artifacts.ArtifactError, match="not one the provider stored"):
        artifacts.load(ref, key="d/other/1/k", base_url=base)  # another run's output


@pytest.mark.parametrize(
    "uri",
    [
        "file:///etc/hostname",
        "file:///dev/zero",
        "{base}/../elsewhere.json",
        "{base}/outputs/../../elsewhere.json",
        "s3://bucket/{path}",
    ],
)
def test_a_reference_outside_the_store_is_refused_before_reading(tmp_path, uri):
    from airflow_plan_provider import artifacts

    ref, base = _stored(tmp_path, "d/r/1/k")
    forged = {**ref, "uri": uri.format(base=base, path=ref["uri"].removeprefix("file:///"))}
    with pytest.raises(artifacts.ArtifactError, match="not one the provider stored") as error:
        artifacts.load(forged, key="d/r/1/k", base_url=base)
    assert base in str(error.value)


def test_a_wrong_size_is_refused_without_reading_and_a_wrong_hash_is_not_revealed(tmp_path):
    from airflow_plan_provider import artifacts

    ref, base = _stored(tmp_path, "d/r/1/k")
    path = Path(ref["uri"].removeprefix("file://"))
    path.write_bytes(path.read_bytes() + b" " * 10**6)
    with pytest.raises(artifacts.ArtifactError, match=f"has {ref['size'] + 10**6} bytes, {ref['size']} were"):
        artifacts.load(ref, key="d/r/1/k", base_url=base)
    path.write_bytes(path.read_bytes()[: ref["size"]].replace(b"x", b"y", 1))
    with pytest.raises(artifacts.ArtifactError, match="does not match the sha256") as error:
        artifacts.load(ref, key="d/r/1/k", base_url=base)
    assert hashlib.sha256(path.read_bytes()).hexdigest() not in str(error.value)


# ------------------------------------------- 8. the idempotency key follows the call, not the revision


def test_idempotency_key_is_the_same_for_an_unchanged_call_and_new_for_a_revised_one():
    from airflow_plan_provider.plan.calls import idempotency_key

    key = idempotency_key("d", "run1", "n", "charge", {"amount": 5, "currency": "EUR"})
    assert key.startswith("d/run1/n/")
    assert idempotency_key("d", "run1", "n", "charge", {"currency": "EUR", "amount": 5}) == key
    assert idempotency_key("d", "run1", "n", "charge", {"amount": 6, "currency": "EUR"}) != key
    assert idempotency_key("d", "run1", "n", "refund", {"amount": 5, "currency": "EUR"}) != key
    assert idempotency_key("d", "run2", "n", "charge", {"amount": 5, "currency": "EUR"}) != key


@pytest.mark.airflow
def test_a_node_unchanged_by_a_replan_keeps_its_key_so_its_side_effect_is_not_repeated(tmp_path):
    log = CallLog(tmp_path / "calls")

    def effect_then_fail_once(ctx: ToolContext, params: dict[str, Any]) -> Any:
        first = log.count(node=ctx.node_id) == 1  # this call is already logged
        log.perform_once(ctx.idempotency_key, {"node": ctx.node_id, "revision": ctx.revision})
        if first:
            raise PermanentToolError(f"declined after the effect ({ctx.node_id})")
        return {"node": ctx.node_id, **params}

    tools = [
        ContextTool("charge", effect_then_fail_once, log=log),
        ContextTool("notify", effect_then_fail_once, log=log),
    ]
    plan = {
        "nodes": [
            {"id": "1", "action": "charge", "tool": "charge", "params": {"amount": 5}},
            {"id": "2", "action": "notify", "tool": "notify", "params": {"to": "ops"}},
        ]
    }
    replacement = {  # node 1 unchanged, node 2 revised
        "nodes": [
            {"id": "1", "action": "charge", "tool": "charge", "params": {"amount": 5}},
            {"id": "2", "action": "notify", "tool": "notify", "params": {"to": "oncall"}},
        ]
    }
    planner = ScriptedPlanner(plan, on_error=[("declined", replacement)])
    dag = build("iso_key_replan", planner, tools, replan=True)
    runs = run_session(dag, {"goal": "charge and notify"}).runs

    assert len(runs) == 2
    result = xcom(runs[-1], FINALIZE_TASK)
    assert result["status"] == "completed", result["message"]
    assert result["revisions"][0]["diff"]["revised"] == ["2"]
    charge_keys = [c["key"] for c in log.calls("charge")]
    notify_keys = [c["key"] for c in log.calls("notify")]
    assert len(charge_keys) == 2 and charge_keys[0] == charge_keys[1]
    assert len(notify_keys) == 2 and notify_keys[0] != notify_keys[1]
    effects = sorted(e["node"] for e in log.side_effects())
    assert effects == ["1", "2", "2"]  # the charge happened once; the revised notification is a new call


# ------------------------------------------ 11. the checkpoint is saved as soon as the tool returns


@pytest.mark.airflow
def test_a_node_killed_after_its_tool_returned_is_not_called_again(tmp_path, monkeypatch):
    """The first push of the node's record dies (SystemExit, as a worker killed at that moment): the
    retry must find the checkpoint and report success without calling the tool a second time."""
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    push = RuntimeTaskInstance.xcom_push
    killed: list[str] = []

    def push_or_die(self: Any, key: str, value: Any) -> None:
        if key == NODE_KEY and not killed:
            killed.append(self.task_id)
            raise SystemExit(137)
        push(self, key, value)

    monkeypatch.setattr(RuntimeTaskInstance, "xcom_push", push_or_die)
    log = CallLog(tmp_path / "calls")
    tool = ScriptedTool("work", log=log, returns={"done": True}, side_effect=True)
    plan = {"nodes": [{"id": "1", "action": "work", "tool": "work"}]}
    dag = build(
        "iso_kill_after_call",
        ScriptedPlanner(plan),
        [tool],
        artifacts=ArtifactStore(url=f"file://{tmp_path}/store"),
        execution=NodeExecution(retries=1, retry_delay=timedelta(0)),
    )
    run = run_plan_dag(dag, {"goal": "g"})

    assert killed == ["nodes"]
    assert str(run.state) == "success", task_states(run)
    assert try_number(run, NODES_TASK, 0) == 2
    assert log.count("work") == 1
    record = xcom(run, NODES_TASK, key=NODE_KEY, map_index=0)
    assert (record["status"], record["output"], record["checkpoint"]) == ("success", {"done": True}, True)


def test_a_waiting_node_takes_a_parents_checkpoint_as_its_result_only_when_saved_in_its_own_run(tmp_path):
    """A node waiting for a running parent starts on the parent's checkpoint (saved the moment its tool
    returned) only when that run saved it: a checkpoint of the same call saved by another run (an earlier
    revision's, another root run's under a colliding key) says nothing about the parent in this run."""
    from types import SimpleNamespace

    from airflow_plan_provider import artifacts
    from airflow_plan_provider.contract import NodeBrief, node_briefs
    from airflow_plan_provider.operators.node import NodeRun, PlanNodeOperator
    from airflow_plan_provider.plan.session import RunContext
    from airflow_plan_provider.plan.validate import validate_plan

    base = f"file://{tmp_path}/store"
    plan = validate_plan(
        {
            "nodes": [
                {"id": "a", "action": "fetch", "tool": "t"},
                {"id": "b", "action": "use", "tool": "t"},
            ],
            "edges": [{"from": "a", "to": "b"}],
        }
    )

    run = RunContext(root_run_id="root", execution_order=plan.run_order)
    [brief] = [b for group in node_briefs(plan, run).values() for b in group if b["node"]["id"] == "b"]
    operator = PlanNodeOperator(task_id=NODES_TASK, plan_node="b · use", artifact_store=base)

    def waiting_child(run_id: str) -> NodeRun:
        ti = SimpleNamespace(dag_id="d", run_id=run_id, task=None, try_number=1)
        return NodeRun(ti, NodeBrief.model_validate(brief), operator)

    key = waiting_child("r1").key(plan.node("a"))
    output = {"rows": 3}
    artifacts.save_checkpoint(
        key, {"output": output, "output_summary": "3 rows", "attempts": 1, "run_id": "r1"}, base
    )

    [(parent, record)] = operator._checkpoints_of_this_run(waiting_child("r1"), ["a"]).items()
    assert (parent, record.status, record.output, record.output_summary) == ("a", "success", output, "3 rows")
    assert operator._checkpoints_of_this_run(waiting_child("r2"), ["a"]) == {}
    artifacts.save_checkpoint(key, {"output": output, "attempts": 1}, base)  # saved before run ids were
    assert operator._checkpoints_of_this_run(waiting_child("r1"), ["a"]) == {}
    (tmp_path / "not_a_folder").write_text("")  # a store that cannot be read: nothing picked, no error
    unreadable = PlanNodeOperator(
        task_id="n", plan_node="b · use", artifact_store=f"file://{tmp_path}/not_a_folder"
    )
    assert unreadable._checkpoints_of_this_run(waiting_child("r1"), ["a"]) == {}
