"""A label for the run type ``operator_triggered`` in the Airflow UI (a replan run's type).

A replan run is started by the ``replan`` task through the Task SDK, and Airflow's execution API gives
every run a task starts the type ``operator_triggered`` (no other type can be asked for). Airflow 3.3's
UI has no label for that type in its translations, so the run page and the runs list show the raw key
``runTypes.operator_triggered``. This middleware adds the missing label, "Triggered by a task", to the
English translations the API server serves (``/static/i18n/locales/en/common.json``; the UI falls back to
English for a key another language lacks). A label Airflow ships wins: the file is changed only where the
key is missing. The run's note (set by the replan task) says which revision of which session it is.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: run type -> English label, for the run types Airflow's UI has no label for
MISSING_LABELS = {"operator_triggered": "Triggered by a task"}
_TRANSLATIONS = re.compile(r"/static/i18n/locales/en/common\.json$")
_CONDITIONAL = (b"if-none-match", b"if-modified-since")


def with_labels(document: bytes) -> bytes | None:
    """The translations with the missing run type labels added, or None when nothing is missing (or the
    document is not the translations file it should be)."""
    try:
        data = json.loads(document)
    except ValueError:
        return None
    run_types = data.get("runTypes") if isinstance(data, dict) else None
    if not isinstance(run_types, dict):
        return None
    missing = {key: label for key, label in MISSING_LABELS.items() if key not in run_types}
    if not missing:
        return None
    run_types.update(missing)
    return json.dumps(data, ensure_ascii=False).encode()


class RunTypeLabels:
    """ASGI middleware: adds :data:`MISSING_LABELS` to the UI's English translations as they are served."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "GET" or not _TRANSLATIONS.search(scope["path"]):
            await self.app(scope, receive, send)
            return
        # always the whole file (never "304 not modified"), so a copy cached before this label is replaced
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() not in _CONDITIONAL]
        start: Message = {}
        body = bytearray()

        async def buffered(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
            elif message["type"] == "http.response.body":
                body.extend(message.get("body", b""))
                if not message.get("more_body"):
                    await self._send(start, bytes(body), send)

        await self.app({**scope, "headers": headers}, receive, buffered)

    @staticmethod
    async def _send(start: Message, body: bytes, send: Send) -> None:
        labelled = with_labels(body) if start.get("status") == 200 else None
        if labelled is not None:
            kept = [
                (k, v)
                for k, v in start.get("headers", [])
                if k.lower() not in (b"content-length", b"etag", b"last-modified")
            ]
            start = {**start, "headers": [*kept, (b"content-length", str(len(labelled)).encode())]}
            body = labelled
        await send(start)
        await send({"type": "http.response.body", "body": body})
