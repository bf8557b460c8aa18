"""A planner backed by an OpenAI-compatible chat-completions endpoint.

::

    planner = LLMPlanner()                                    # reads connection "plan_llm_default"
    planner = LLMPlanner(base_url="http://localhost:8000/v1", api_key="...", model="my-model")

Constructing a planner touches neither the network nor any secret, so it can sit in a DAG file; the
connection is read on the first :meth:`LLMPlanner.plan` call.

Each call sends the plan rules, the tool catalog and the goal (or the replan context: the current plan
with long values cut, the locked nodes' bounded summaries, the failed node's error and the affected
ids). For a repair it adds the previous reply and every problem found in it. The reply is returned as
text for the validator, so malformed JSON becomes a ``schema`` problem the model is asked to fix.

Structured output: ``response_format`` ``json_schema`` with ``strict: true`` and the wire schema of
:mod:`airflow_plan_provider.planners.llm_prompt` (params as a JSON-encoded string, since strict mode
cannot express a free-form object; that keeps the guarantee of a well-formed reply without loosening
the rest of the schema, which ``strict: false`` would). When the endpoint rejects ``json_schema``
(HTTP 400 about ``response_format``) the planner falls back to ``json_object`` for that call and every
later one, and from ``json_object`` to no ``response_format``.

Failures: the ``openai`` client retries 408/409/429/5xx, timeouts and connection errors with backoff
(``max_retries``, honouring ``Retry-After``); ``timeout`` bounds each HTTP attempt and
``planning_timeout`` the whole :meth:`~LLMPlanner.plan` call. When they are spent, the planner raises
:class:`PlanningError` with reason ``planner_unavailable``, naming the endpoint, model and status. The
API key is never logged nor put in an error.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

import openai
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam
from openai.types.chat.completion_create_params import ResponseFormat

from airflow_plan_provider.exceptions import PlanningError
from airflow_plan_provider.hooks.llm import NO_KEY, LLMSettings, PlanLLMHook, resolve_api_key
from airflow_plan_provider.planners.base import PlannerReply, PlanRequest
from airflow_plan_provider.planners.llm_prompt import build_messages, decode_reply, wire_schema

log = logging.getLogger(__name__)

DEFAULT_CONN_ID = PlanLLMHook.default_conn_name
FORMATS = ("json_schema", "json_object", "text")
_FENCE = re.compile(r"```[A-Za-z0-9_+-]*[ \t]*\n?(.*?)\n?[ \t]*```", re.DOTALL)
_RETRIED_STATUSES = (408, 409, 429)
T = TypeVar("T")


class _DeadlineExceeded(Exception):
    pass


def strip_fence(text: str) -> str:
    """The content of the first ``` fenced block when the text is not bare JSON; else the text."""
    stripped = text.strip()
    if stripped.startswith(("{", "[")):
        return stripped
    match = _FENCE.search(stripped)
    return match.group(1).strip() if match else stripped


def _run_until(deadline: float, call: Callable[[], T]) -> T:
    """Run ``call`` in a helper thread and give up on it at ``deadline`` (it ends on its own timeout)."""
    result: dict[str, Any] = {}
    done = threading.Event()

    def target() -> None:
        try:
            result["value"] = call()
        except BaseException as error:
            result["error"] = error
        finally:
            done.set()

    threading.Thread(target=target, name="plan-llm-request", daemon=True).start()
    if not done.wait(max(0.0, deadline - time.monotonic())):
        raise _DeadlineExceeded
    if "error" in result:
        raise result["error"]
    return cast(T, result["value"])


def _rejects_response_format(error: openai.BadRequestError) -> bool:
    text = f"{error.message} {error.body}".lower()
    return "response_format" in text or "json_schema" in text or "response format" in text


def _status_detail(error: openai.APIStatusError) -> str:
    body = error.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        message = inner.get("message") if isinstance(inner, dict) else inner
        if message:
            return str(message)[:300]
    return str(error.message)[:300]


class LLMPlanner:
    """Plans with an LLM through the ``openai`` client.

    Give ``base_url`` and/or ``api_key`` (and ``model``) to skip the Airflow connection; otherwise
    ``conn_id`` names a ``plan_llm`` connection (see :mod:`airflow_plan_provider.hooks.llm`), and
    ``model`` overrides the connection's ``extra.model``.
    """

    def __init__(
        self,
        *,
        model: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        conn_id: str = DEFAULT_CONN_ID,
        temperature: float = 0.0,
        max_retries: int = 2,
        timeout: float = 60.0,
        planning_timeout: float = 300.0,
        structured_output: bool = True,
    ) -> None:
        if max_retries < 0 or timeout <= 0 or planning_timeout <= 0:
            raise ValueError("max_retries must be >= 0, timeout and planning_timeout > 0")
        self.model = model
        self.base_url = base_url
        self.conn_id = conn_id
        self.temperature = temperature
        self.max_retries = max_retries
        self.timeout = timeout
        self.planning_timeout = planning_timeout
        self._api_key = api_key
        self._format = 0 if structured_output else 1
        self._settings: LLMSettings | None = None
        self._client: openai.OpenAI | None = None

    def __repr__(self) -> str:
        where = self.base_url or f"conn_id={self.conn_id!r}"
        return f"LLMPlanner({where}, model={self.model!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_settings": None, "_client": None}

    @property
    def uses_connection(self) -> bool:
        return self.base_url is None and self._api_key is None

    @property
    def response_format(self) -> str:
        """The ``response_format`` type the next call asks for."""
        return FORMATS[self._format]

    # --- connection ---------------------------------------------------------------------------
    def _connect(self) -> tuple[openai.OpenAI, LLMSettings]:
        if self._client is not None and self._settings is not None:
            return self._client, self._settings
        if self.uses_connection:
            hook = PlanLLMHook(self.conn_id, timeout=self.timeout, max_retries=self.max_retries)
            try:
                settings = hook.settings
            except Exception as error:
                raise PlanningError(
                    f"LLM planner unavailable: cannot read connection {self.conn_id!r}: {error}",
                    reason="planner_unavailable",
                ) from None
        else:
            settings = LLMSettings(self.base_url, resolve_api_key(self._api_key), self.model)
        settings = LLMSettings(
            settings.base_url,
            settings.api_key,
            self.model or settings.model,
            settings.organization,
            settings.project,
        )
        if not settings.model:
            raise PlanningError(
                f"LLM planner has no model: pass LLMPlanner(model=...) or set extra.model on connection "
                f"{self.conn_id!r}",
                reason="planner_unavailable",
            )
        self._settings = settings
        self._client = settings.client(timeout=self.timeout, max_retries=self.max_retries)
        return self._client, settings

    # --- planning -----------------------------------------------------------------------------
    def plan(self, request: PlanRequest) -> PlannerReply:
        client, settings = self._connect()
        endpoint = str(client.base_url).rstrip("/")
        messages = cast(list[ChatCompletionMessageParam], build_messages(request))
        deadline = time.monotonic() + self.planning_timeout
        kind = "repair" if request.problems else "replan" if request.is_replan else "plan"
        while True:
            log.info(
                "Asking %s (model %s, response_format %s) for a %s",
                endpoint,
                settings.model,
                self.response_format,
                kind,
            )
            try:
                completion = self._complete(client, settings, request, messages, deadline)
                break
            except openai.BadRequestError as error:
                if self._format + 1 < len(FORMATS) and _rejects_response_format(error):
                    log.warning(
                        "%s rejected response_format %s (%s); using %s from now on",
                        endpoint,
                        self.response_format,
                        _status_detail(error),
                        FORMATS[self._format + 1],
                    )
                    self._format += 1
                    continue
                raise self._unavailable(error, endpoint, settings) from None
            except (openai.OpenAIError, _DeadlineExceeded) as error:
                raise self._unavailable(error, endpoint, settings) from None
        return self._reply(completion)

    def _complete(
        self,
        client: openai.OpenAI,
        settings: LLMSettings,
        request: PlanRequest,
        messages: list[ChatCompletionMessageParam],
        deadline: float,
    ) -> ChatCompletion:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _DeadlineExceeded
        response_format: ResponseFormat | openai.Omit = openai.omit
        if self.response_format == "json_schema":
            schema = wire_schema(list(request.tools))
            response_format = {
                "type": "json_schema",
                "json_schema": {"name": "plan", "strict": True, "schema": schema},
            }
        elif self.response_format == "json_object":
            response_format = {"type": "json_object"}
        model = cast(str, settings.model)
        return _run_until(
            deadline,
            lambda: client.chat.completions.create(
                model=model,
                messages=messages,
                temperature=self.temperature,
                response_format=response_format,
                stream=False,
                timeout=min(self.timeout, remaining),
            ),
        )

    def _reply(self, completion: ChatCompletion) -> PlannerReply:
        usage: dict[str, int] = {}
        if completion.usage is not None:
            usage = {
                "prompt_tokens": completion.usage.prompt_tokens,
                "completion_tokens": completion.usage.completion_tokens,
            }
            log.info("LLM planner usage: %s", usage)
        if not completion.choices:
            return PlannerReply(plan="", usage=usage)
        message = completion.choices[0].message
        if message.refusal:
            raise PlanningError(f"the model refused to plan: {message.refusal[:500]}", reason="no_plan")
        return PlannerReply(plan=decode_reply(strip_fence(message.content or "")), usage=usage)

    def _unavailable(self, error: BaseException, endpoint: str, settings: LLMSettings) -> PlanningError:
        retries = f"retried up to {self.max_retries} time(s)"
        if isinstance(error, _DeadlineExceeded):
            what = f"no answer within the planning timeout of {self.planning_timeout:g}s"
        elif isinstance(error, openai.APITimeoutError):
            what = f"request timed out after {self.timeout:g}s ({retries})"
        elif isinstance(error, openai.APIConnectionError):
            cause = type(error.__cause__).__name__ if error.__cause__ else "connection error"
            what = f"could not connect ({cause}; {retries})"
        elif isinstance(error, openai.APIStatusError):
            status = error.status_code
            again = f" ({retries})" if status in _RETRIED_STATUSES or status >= 500 else ""
            what = f"HTTP {status}: {_status_detail(error)}{again}"
        else:
            what = f"{type(error).__name__}: {error}"
        message = f"LLM planner unavailable: {endpoint} (model {settings.model!r}): {what}"
        if len(settings.api_key) >= 4 and settings.api_key != NO_KEY:
            message = message.replace(settings.api_key, "***")
        log.warning("%s", message)
        return PlanningError(message, reason="planner_unavailable")
