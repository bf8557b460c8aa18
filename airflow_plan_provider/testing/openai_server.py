"""A scripted OpenAI-compatible HTTP server for tests.

It speaks ``POST /v1/chat/completions`` and ``GET /v1/models`` in the OpenAI wire format and answers
chat completions with scripted steps, in order::

    with OpenAITestServer() as server:
        server.reply({"nodes": [...]})                  # a dict is JSON-encoded as the message content
        server.error(429, retry_after=1).reply("...")   # a rate limit, then a reply
        server.delay(5).reply("...")                    # the next step waits 5 s before answering
        server.raw(b"<html>oops</html>", content_type="text/html")   # these exact bytes, status 200
        server.raw({"choices": "abc"}, status=200)      # any JSON value as the whole body
        client = openai.OpenAI(base_url=server.base_url, api_key="sk-test")

Once the script is spent, every further completion gets HTTP 500 with a message saying so.
``server.requests`` records every request (method, path, lower-cased headers, parsed JSON body, and
its size in bytes); :meth:`OpenAITestServer.reset` drops the unserved steps and the recorded requests,
so one server can serve many independent scripts (e.g. one per Hypothesis example).
:func:`chat_completion` builds the body of a well-formed completion, to mutate in tests.

Token usage is counted as whitespace-separated words: ``prompt_tokens`` over the text of every
message of the request, ``completion_tokens`` over the reply content.

The server also runs as its own process, so Airflow workers in end-to-end tests can reach it::

    python -m airflow_plan_provider.testing.openai_server --script script.json [--port N]
        [--record requests.jsonl] [--reject-json-schema]

It prints the base url on stdout and serves until terminated. The script file is a JSON list of
steps: ``{"reply": "text" | {...}}``, ``{"error": 429, "body": ..., "retry_after": 2}``,
``{"raw": "body text" | <any JSON value>, "status": 200, "content_type": "text/html"}`` (the body
served as is: a string verbatim, anything else JSON-encoded) or ``{"delay": 1.5}`` (applies to the
next step); a reply, error or raw step may carry its own ``"delay"``.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any


@dataclass(frozen=True)
class Step:
    """One scripted answer: a reply (``status`` 200), an error, or ``raw`` bytes sent as they are."""

    status: int = 200
    content: str | None = None
    body: Any = None
    retry_after: float | None = None
    delay: float = 0.0
    raw: bytes | None = None
    content_type: str = "application/json"

    @classmethod
    def from_json(cls, item: Mapping[str, Any], delay: float = 0.0) -> Step:
        delay += float(item.get("delay", 0.0))
        if "raw" in item:
            raw = item["raw"]
            if isinstance(raw, str):
                raw = raw.encode("utf-8")
            elif not isinstance(raw, bytes):
                raw = json.dumps(raw).encode("utf-8")
            return cls(
                status=int(item.get("status", 200)),
                raw=raw,
                content_type=str(item.get("content_type", "application/json")),
                delay=delay,
            )
        if "reply" in item:
            content = item["reply"]
            return cls(content=content if isinstance(content, str) else json.dumps(content), delay=delay)
        if "error" in item:
            retry_after = item.get("retry_after")
            return cls(
                status=int(item["error"]),
                body=item.get("body"),
                retry_after=None if retry_after is None else float(retry_after),
                delay=delay,
            )
        raise ValueError(f"a step needs 'reply', 'error' or 'raw': {sorted(item)!r}")


@dataclass
class RecordedRequest:
    """One request as received; header names are lower-cased."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any = None
    size: int = 0  # bytes of the request body as received

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages", [])) if isinstance(self.body, dict) else []

    @property
    def text(self) -> str:
        """Every message content of the request, joined (for ``in`` checks)."""
        return "\n".join(_content_text(m.get("content")) for m in self.messages)

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "path": self.path,
            "headers": self.headers,
            "body": self.body,
            "size": self.size,
        }


def _content_text(content: Any) -> str:
    if isinstance(content, list):  # content parts
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def count_tokens(text: str) -> int:
    """Tokens as this server counts them: whitespace-separated words."""
    return len(text.split())


@dataclass
class _Script:
    steps: list[Step] = field(default_factory=list)
    pending_delay: float = 0.0
    served: int = 0


class OpenAITestServer:
    """A real HTTP server on 127.0.0.1 (random port unless ``port`` is given), run in a thread.

    ``reject_json_schema`` makes every request asking for ``response_format`` ``json_schema`` fail with
    HTTP 400 (without using a step), like servers that only know ``json_object``.
    """

    def __init__(
        self,
        steps: list[Mapping[str, Any]] | None = None,
        *,
        port: int = 0,
        models: tuple[str, ...] = ("test-model",),
        reject_json_schema: bool = False,
        record_path: str | Path | None = None,
    ) -> None:
        self.models = models
        self.reject_json_schema = reject_json_schema
        self.requests: list[RecordedRequest] = []
        self._record_path = Path(record_path) if record_path else None
        self._script = _Script()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), _handler_for(self))
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None
        for item in steps or ():
            self.add(item)

    # --- script -------------------------------------------------------------------------------
    def add(self, item: Mapping[str, Any]) -> OpenAITestServer:
        """Append a step in the script-file format."""
        with self._lock:
            if set(item) == {"delay"}:
                self._script.pending_delay += float(item["delay"])
            else:
                self._script.steps.append(Step.from_json(item, self._script.pending_delay))
                self._script.pending_delay = 0.0
        return self

    def reply(self, content: str | Mapping[str, Any]) -> OpenAITestServer:
        return self.add({"reply": content if isinstance(content, str) else dict(content)})

    def error(self, status: int, body: Any = None, retry_after: float | None = None) -> OpenAITestServer:
        return self.add({"error": status, "body": body, "retry_after": retry_after})

    def delay(self, seconds: float) -> OpenAITestServer:
        return self.add({"delay": seconds})

    def raw(
        self, body: bytes | str | Any, *, status: int = 200, content_type: str = "application/json"
    ) -> OpenAITestServer:
        """Answer the next completion with exactly ``body`` (bytes or text as is, else JSON-encoded)."""
        return self.add({"raw": body, "status": status, "content_type": content_type})

    def reset(self) -> OpenAITestServer:
        """Forget the script (served or not) and the recorded requests."""
        with self._lock:
            self._script = _Script()
            self.requests.clear()
        return self

    @property
    def remaining_steps(self) -> int:
        with self._lock:
            return len(self._script.steps) - self._script.served

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self.requests if r.path.endswith("/chat/completions")]

    # --- lifecycle ----------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> OpenAITestServer:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._httpd.serve_forever, args=(0.05,), name="openai-test-server", daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> OpenAITestServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # --- answering ----------------------------------------------------------------------------
    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)
            if self._record_path is not None:
                with self._record_path.open("a", encoding="utf-8") as file:
                    file.write(json.dumps(request.to_json()) + "\n")

    def _next_step(self) -> Step | None:
        with self._lock:
            if self._script.served >= len(self._script.steps):
                self._script.served += 1
                return None
            step = self._script.steps[self._script.served]
            self._script.served += 1
            return step

    def answer(self, request: RecordedRequest) -> tuple[int, dict[str, str], Any]:
        """Status, extra headers and body (a JSON value, or bytes sent as they are) for one request."""
        self._record(request)
        if request.method == "GET" and request.path.rstrip("/") == "/v1/models":
            data = [{"id": m, "object": "model", "created": 0, "owned_by": "test"} for m in self.models]
            return 200, {}, {"object": "list", "data": data}
        if request.method != "POST" or request.path.rstrip("/") != "/v1/chat/completions":
            return 404, {}, _error_body(f"no route {request.method} {request.path}", "not_found")
        if not isinstance(request.body, dict):
            return 400, {}, _error_body("request body is not a JSON object", "invalid_request_error")
        response_format = request.body.get("response_format") or {}
        if self.reject_json_schema and response_format.get("type") == "json_schema":
            message = "Invalid parameter: 'response_format' of type 'json_schema' is not supported."
            return 400, {}, _error_body(message, "invalid_request_error", param="response_format")
        step = self._next_step()
        if step is None:
            with self._lock:
                count = len(self._script.steps)
            message = f"OpenAITestServer: the script is exhausted ({count} step(s) served); add more steps"
            return 500, {}, _error_body(message, "server_error")
        if step.delay:
            self._stopping.wait(step.delay)
        if step.raw is not None:
            return step.status, {"Content-Type": step.content_type}, step.raw
        if step.status != 200:
            headers = {} if step.retry_after is None else {"Retry-After": f"{step.retry_after:g}"}
            body = step.body if step.body is not None else _error_body(f"scripted HTTP {step.status}")
            return step.status, headers, body
        return 200, {}, self._completion(request.body, step.content or "")

    def _completion(self, body: Mapping[str, Any], content: str) -> dict[str, Any]:
        prompt = sum(count_tokens(_content_text(m.get("content"))) for m in body.get("messages", []))
        with self._lock:
            number = self._script.served
        return chat_completion(
            content, model=str(body.get("model", "test-model")), prompt_tokens=prompt, number=number
        )


def chat_completion(
    content: str, *, model: str = "test-model", prompt_tokens: int = 0, number: int = 0
) -> dict[str, Any]:
    """The body of a well-formed chat completion whose one choice says ``content``."""
    completion = count_tokens(content)
    return {
        "id": f"chatcmpl-test-{number}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": None},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
        },
    }


def _error_body(message: str, kind: str = "server_error", param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


def _handler_for(server: OpenAITestServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode("utf-8", "replace")
            headers = {name.lower(): value for name, value in self.headers.items()}
            request = RecordedRequest(self.command, self.path, headers, body, len(raw))
            status, extra_headers, payload = server.answer(request)
            data = payload if isinstance(payload, bytes) else _encode(payload)
            extra = {name.lower(): value for name, value in extra_headers.items()}
            try:
                self.send_response(status)
                self.send_header("Content-Type", extra.pop("content-type", "application/json"))
                self.send_header("Content-Length", str(len(data)))
                self.send_header("x-request-id", f"req-test-{len(server.requests)}")
                for name, value in extra.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (its timeout); nothing to answer

        do_GET = _serve
        do_POST = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


def _encode(payload: Any) -> bytes:
    text = payload if isinstance(payload, str) else json.dumps(payload)
    return text.encode("utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Scripted OpenAI-compatible test server")
    parser.add_argument("--script", required=True, help="JSON file holding a list of steps")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (default: a free one)")
    parser.add_argument("--record", help="append every request as a JSON line to this file")
    parser.add_argument("--reject-json-schema", action="store_true", help="answer 400 to json_schema")
    args = parser.parse_args(argv)
    steps = json.loads(Path(args.script).read_text(encoding="utf-8"))
    if not isinstance(steps, list):
        parser.error("the script must be a JSON list of steps")
    server = OpenAITestServer(
        steps, port=args.port, reject_json_schema=args.reject_json_schema, record_path=args.record
    )
    done = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: done.set())
    with server:
        print(server.base_url, flush=True)
        done.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
