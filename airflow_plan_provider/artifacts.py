"""Large node outputs live in an artifact store; XCom and the replan conf carry a small reference.

The store is any :class:`airflow.sdk.ObjectStoragePath` location: a local folder under AIRFLOW_HOME by
default, ``s3://…`` or ``gs://…`` in production. A reference is
``{"__artifact__": 1, "uri", "size", "sha256", "summary"}``; downstream nodes get the original value
back (checked against the sha256), and planner prompts only ever see the summary.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from airflow_plan_provider.plan.result import summarize

DEFAULT_THRESHOLD = 64 * 1024
MARKER = "__artifact__"


def default_store_url() -> str:
    home = os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
    return f"file://{os.path.join(home, 'plan_artifacts')}"


def _base(base_url: str | None) -> str:
    return (base_url or default_store_url()).rstrip("/")


def _file_name(key: str) -> str:
    """An idempotency key as a file name (its slashes and colons replaced)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in key)


def is_reference(value: Any) -> bool:
    return isinstance(value, dict) and value.get(MARKER) == 1 and "uri" in value


def _path(uri: str) -> Any:
    from airflow.sdk import ObjectStoragePath

    return ObjectStoragePath(uri)


def store(output: Any, *, key: str, base_url: str | None = None, threshold: int = DEFAULT_THRESHOLD) -> Any:
    """``output`` itself when its JSON is at most ``threshold`` bytes, else a reference to a stored copy."""
    data = json.dumps(output, separators=(",", ":")).encode()
    if len(data) <= threshold:
        return output
    digest = hashlib.sha256(data).hexdigest()
    uri = f"{_base(base_url)}/{_file_name(key)}-{digest[:16]}.json"
    path = _path(uri)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return {MARKER: 1, "uri": uri, "size": len(data), "sha256": digest, "summary": summarize(output)}


def load(value: Any) -> Any:
    """The original output behind a reference (verified), or ``value`` unchanged."""
    if not is_reference(value):
        return value
    data = _path(value["uri"]).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != value["sha256"]:
        raise ValueError(f"artifact {value['uri']} is corrupt: sha256 {digest} != {value['sha256']}")
    return json.loads(data)


def _checkpoint_path(key: str, base_url: str | None) -> Any:
    return _path(f"{_base(base_url)}/checkpoints/{_file_name(key)}.json")


def save_checkpoint(key: str, record: dict[str, Any], base_url: str | None = None) -> None:
    """Remember that the node behind ``key`` (dag, root run, node, revision) succeeded, with its record.

    The checkpoint outlives the task instance's XCom, which Airflow clears when the task is cleared.
    """
    path = _checkpoint_path(key, base_url)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, separators=(",", ":")))


def load_checkpoint(key: str, base_url: str | None = None) -> dict[str, Any] | None:
    path = _checkpoint_path(key, base_url)
    if not path.exists():
        return None
    return dict(json.loads(path.read_text()))
