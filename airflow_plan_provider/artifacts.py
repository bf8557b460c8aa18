"""Large node outputs and node checkpoints, kept in the artifact store.

The store is any :class:`airflow.sdk.ObjectStoragePath` location: the DAG's ``artifact_store``, else the
``PLAN_ARTIFACT_STORE`` environment variable, else a local folder under AIRFLOW_HOME; ``s3://…`` or
``gs://…`` in production. Every worker must see the same store: with a distributed executor (Celery,
Kubernetes) and the default local folder, :func:`local_store_warning` says so. Under it::

    outputs/<sha256 of the key>/<sha256 of the content>.json   a large output (JSON)
    checkpoints/<sha256 of the key>.json                       {"key", "record", "sha256"}

where the key is the node's idempotency key (or, for :class:`TaskStateCheckpoints`, a task instance's
value's key). Names are hashes of the key, so two keys never share a
file, whatever characters their run ids or node ids hold.

A stored output is known by an :class:`ArtifactRef` (uri, size, sha256, summary) kept in its own field of
the node record, apart from the tool's data. :func:`load` reads only the file the provider itself
writes for that node's key and that checksum, inside the configured store; checks its size before
reading and reads no more than that; and checks its sha256. Any mismatch is an :class:`ArtifactError`,
which the node treats as a permanent failure.

A checkpoint holds its key, the node's record, and the sha256 of both (canonical JSON): a checkpoint
that was altered, truncated, or copied to another key's name fails verification and is ignored with a
warning: the node then runs normally, since a checkpoint only saves work. Files are written atomically
(a temporary file renamed in the same folder; one ``write_bytes`` on object stores, where a single PUT
replaces an object atomically).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import uuid
from typing import Any

from pydantic import ValidationError

from airflow_plan_provider.exceptions import ArtifactStoreError, PlanProviderError
from airflow_plan_provider.plan.result import ArtifactRef, summarize

DEFAULT_THRESHOLD = 64 * 1024
CHECKPOINT_LIMIT = 16 * 1024 * 1024  # a checkpoint larger than this is not read (never written so)
LOCAL_PROTOCOLS = ("file", "local")

log = logging.getLogger(__name__)


class ArtifactError(PlanProviderError):
    """A stored output cannot be used: not one the provider stored for that node, missing, or altered."""


STORE_ENV = "PLAN_ARTIFACT_STORE"
# executors that run every task on the scheduler's machine, so a local folder is shared by all of them
SINGLE_MACHINE_EXECUTORS = frozenset({"LocalExecutor", "SequentialExecutor"})


def default_store_url() -> str:
    """``$PLAN_ARTIFACT_STORE`` when set, else ``file://<AIRFLOW_HOME or ~/airflow>/plan_artifacts``."""
    configured = os.environ.get(STORE_ENV, "").strip()
    if configured:
        return configured
    home = os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
    return f"file://{os.path.join(home, 'plan_artifacts')}"


def distributed_executors(setting: str) -> list[str]:
    """The executors of an ``[core] executor`` setting that may run tasks on other machines.

    The setting is a comma-separated list; each entry is a class name, a dotted path, or
    ``alias:path``. Only the LocalExecutor and SequentialExecutor run every task where the scheduler is.

    >>> distributed_executors("LocalExecutor,my_celery:airflow.providers.celery.executors.CeleryExecutor")
    ['my_celery:airflow.providers.celery.executors.CeleryExecutor']
    """
    found = []
    for entry in (part.strip() for part in setting.split(",")):
        if entry and entry.rsplit(":", 1)[-1].rsplit(".", 1)[-1] not in SINGLE_MACHINE_EXECUTORS:
            found.append(entry)
    return found


def local_store_warning(base_url: str | None = None, executor: str | None = None) -> str | None:
    """Why the artifact store may not be shared by the workers, or None.

    Warns when a distributed executor (``executor``, default ``[core] executor``) runs with the default
    store, a folder under AIRFLOW_HOME: workers on other machines do not see it, so a retry elsewhere
    would miss a node's checkpoint and large outputs would be unreadable. A store named explicitly
    (the DAG's ``artifact_store`` or ``$PLAN_ARTIFACT_STORE``) is taken as chosen for the deployment,
    a ``file://`` one included (a volume every worker mounts, as in docker-compose.yml).
    """
    if base_url or os.environ.get(STORE_ENV, "").strip():
        return None
    if executor is None:
        from airflow.configuration import conf

        executor = conf.get("core", "executor", fallback="LocalExecutor") or "LocalExecutor"
    distributed = distributed_executors(executor)
    if not distributed:
        return None
    return (
        f"the plan artifact store is the local folder {default_store_url()} but the executor "
        f"{', '.join(distributed)} may run tasks on other machines, which do not see it (checkpoints, "
        f"large outputs); set {STORE_ENV} (or the DAG's artifact_store) to a store every worker "
        "shares: s3://..., gs://..., or a file:// folder on a volume every worker mounts"
    )


def _base(base_url: str | None) -> str:
    return (base_url or default_store_url()).rstrip("/")


def key_name(key: str) -> str:
    """The file name part for an idempotency key: its sha256 (hex), distinct for distinct keys."""
    return hashlib.sha256(key.encode()).hexdigest()


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _path(uri: str) -> Any:
    from airflow.sdk import ObjectStoragePath

    return ObjectStoragePath(uri)


def _local_file(uri: str) -> str | None:
    """The path of ``uri`` on this machine's file system when it names one with an absolute path
    (``file:///…``, ``local:///…``: the path :class:`~airflow.sdk.ObjectStoragePath` gives it), else None.
    A local file is read and written with the ``os`` module: through ``ObjectStoragePath`` each task
    process would first set up fsspec's local file system and Airflow's hook lineage
    (``docs/performance.md``)."""
    scheme, separator, rest = uri.partition("://")
    return rest if separator and scheme in LOCAL_PROTOCOLS and rest.startswith("/") else None


def output_uri(key: str, sha256: str, base_url: str | None = None) -> str:
    """Where the provider stores the output with checksum ``sha256`` of the node behind ``key``."""
    return f"{_base(base_url)}/outputs/{key_name(key)}/{sha256}.json"


def checkpoint_uri(key: str, base_url: str | None = None) -> str:
    return f"{_base(base_url)}/checkpoints/{key_name(key)}.json"


def _write_atomically(uri: str, data: bytes, what: str, base_url: str | None) -> None:
    """Write ``data`` at ``uri`` whole or not at all; an :class:`ArtifactStoreError` naming the store and
    ``what`` was written when the store refuses it (the OS error, a failed PUT)."""
    try:
        _write_whole(uri, data)
    except (OSError, ValueError) as error:  # fsspec raises OSError subclasses, some stores ValueError
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise ArtifactStoreError(
            f"the artifact store {_base(base_url)} could not take {what} ({len(data)} bytes): "
            f"{summarize(reason, 300)}"
        ) from error


def _write_whole(uri: str, data: bytes) -> None:
    target = _local_file(uri)
    if target is None:
        path = _path(uri)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.protocol not in LOCAL_PROTOCOLS:
            path.write_bytes(data)  # one PUT: readers see the old object or the new one, never a part
            return
        target = path.path  # a local file named otherwise (a relative file:// URL)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    temporary = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.{uuid.uuid4().hex}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def _read_at_most(uri: str, limit: int) -> bytes:
    """At most ``limit`` + 1 bytes of the file at ``uri`` (one more than allowed tells it is too large).

    :raises FileNotFoundError: there is no such file."""
    local = _local_file(uri)
    with open(local, "rb") if local is not None else _path(uri).open("rb") as file:
        return bytes(file.read(limit + 1))


def _size(uri: str) -> int:
    """The size of the file at ``uri``. :raises FileNotFoundError: there is no such file."""
    local = _local_file(uri)
    return os.stat(local).st_size if local is not None else int(_path(uri).stat().st_size)


def store(
    data: bytes,
    *,
    key: str,
    summary: str,
    base_url: str | None = None,
    threshold: int = DEFAULT_THRESHOLD,
) -> dict[str, Any] | None:
    """Store an output given as its JSON ``data`` when that is larger than ``threshold`` bytes and
    return its reference (an :class:`ArtifactRef` as a dict, with ``summary``); None when the output
    is small enough for XCom. The caller encodes the output once and passes the same text here.

    :raises ArtifactStoreError: the store did not take the file (nothing of it is left there)."""
    if len(data) <= threshold:
        return None
    digest = hashlib.sha256(data).hexdigest()
    uri = output_uri(key, digest, base_url)
    _write_atomically(uri, data, "a node's output", base_url)
    return ArtifactRef(uri=uri, size=len(data), sha256=digest, summary=summary).model_dump()


def load(reference: Any, *, key: str, base_url: str | None = None) -> Any:
    """The output behind ``reference``, stored by the provider for the node behind ``key``.

    Raises :class:`ArtifactError` when the reference is malformed, names any other location than the one
    the provider writes for that key and checksum in the configured store, or when the file is missing,
    has another size, or another checksum (whose value is not revealed).
    """
    try:
        ref = ArtifactRef.model_validate(reference)
    except ValidationError as error:
        raise ArtifactError(f"malformed artifact reference ({error.error_count()} problem(s))") from None
    expected = output_uri(key, ref.sha256, base_url)
    if ref.uri != expected:
        raise ArtifactError(
            f"artifact {summarize(ref.uri, 200)} is not one the provider stored for this node in "
            f"{_base(base_url)}"
        )
    try:
        size = _size(expected)
    except FileNotFoundError:
        raise ArtifactError(f"artifact {ref.uri} is missing from the store") from None
    if size != ref.size:
        raise ArtifactError(f"artifact {ref.uri} has {size} bytes, {ref.size} were stored")
    data = _read_at_most(expected, ref.size)
    if len(data) != ref.size or hashlib.sha256(data).hexdigest() != ref.sha256:
        raise ArtifactError(f"artifact {ref.uri} does not match the sha256 recorded when it was stored")
    return json.loads(data)


def _checkpoint_digest(key: str, record: Any) -> str:
    return hashlib.sha256(canonical_json({"key": key, "record": record})).hexdigest()


def save_checkpoint(key: str, record: dict[str, Any], base_url: str | None = None) -> None:
    """Remember that the node behind ``key`` succeeded, with its record.

    The checkpoint outlives the task instance's XCom, which Airflow clears when the task is cleared.

    :raises ArtifactStoreError: the store did not take the file (nothing of it is left there).
    """
    signed = canonical_json({"key": key, "record": record})
    # canonical_json of {"key", "record", "sha256"}: "sha256" sorts last, so it is appended (one encoding)
    content = signed[:-1] + b',"sha256":"' + hashlib.sha256(signed).hexdigest().encode() + b'"}'
    _write_atomically(checkpoint_uri(key, base_url), content, "a checkpoint", base_url)


def load_checkpoint(key: str, base_url: str | None = None) -> dict[str, Any] | None:
    """The record saved for ``key``, or None when there is none or it fails verification (logged)."""
    uri = checkpoint_uri(key, base_url)
    try:
        data = _read_at_most(uri, CHECKPOINT_LIMIT)
    except FileNotFoundError:
        return None
    verified = _verify_checkpoint(key, data)
    if isinstance(verified, str):
        log.warning("ignoring checkpoint %s of %s: %s; the node runs again", uri, key, verified)
        return None
    return verified


def checkpoint_of_run(key: str, run_id: str, base_url: str | None = None) -> dict[str, Any] | None:
    """The record saved for ``key`` if run ``run_id`` saved it, for a look at whether a running parent's
    tool returned: None when none was saved, another run saved it, or the store cannot be read just now
    (logged at debug level: a look must never fail the node that looks; the run's states still tell)."""
    try:
        saved = load_checkpoint(key, base_url)
    except Exception as error:  # an object store's hiccup
        log.debug("checkpoint %s not read (%s)", key, error)
        return None
    return saved if saved is not None and saved.get("run_id") == run_id else None


def _verify_checkpoint(key: str, data: bytes) -> dict[str, Any] | str:
    """The verified record in a checkpoint's bytes, or what is wrong with them."""
    if len(data) > CHECKPOINT_LIMIT:
        return f"larger than {CHECKPOINT_LIMIT} bytes"
    try:
        content = json.loads(data)
    except ValueError as error:
        return f"not JSON ({error})"
    if not isinstance(content, dict) or not isinstance(content.get("record"), dict):
        return "not a checkpoint"
    if content.get("key") != key:
        return "saved for another key"
    if content.get("sha256") != _checkpoint_digest(key, content["record"]):
        return "content does not match its sha256"
    return dict(content["record"])


class TaskStateCheckpoints:
    """One task instance's values kept across its tries, as checkpoints in the artifact store: the
    ``get`` / ``set`` of Airflow's task state store, where Airflow has none (before 3.3).

    ``scope`` names the task instance (DAG, run, task, map index); each value is the checkpoint of
    ``scope`` and its own key, verified on read like any checkpoint (a missing or altered one is None).
    """

    def __init__(self, scope: str, base_url: str | None = None) -> None:
        self.scope = scope
        self.base_url = base_url

    def _key(self, key: str) -> str:
        return json.dumps(["task_state", self.scope, key])

    def get(self, key: str) -> dict[str, Any] | None:
        return load_checkpoint(self._key(key), self.base_url)

    def set(self, key: str, value: dict[str, Any]) -> None:
        save_checkpoint(self._key(key), value, self.base_url)
