"""A planner backed by an OpenAI-compatible chat-completions endpoint.

::

    planner = LLMPlanner()                                    # reads connection "plan_llm_default"
    planner = LLMPlanner(base_url="http://localhost:8000/v1", api_key="...", model="my-model")

Constructing a planner touches neither the network nor any secret, so it can sit in a DAG file; the
connection is read on the first :meth:`LLMPlanner.plan` call.

Each call sends the plan rules, the tool catalog and the goal (or the replan context: the current plan
with long values cut, the locked nodes' bounded summaries, the failed node's error and the affected
ids). For a repair it adds the previous reply (its first few KB and its size when it is longer) and the
problems found in it (the first ones and a count of the rest). The reply is returned as text for the
validator, so malformed JSON becomes a ``schema`` problem the model is asked to fix.

Structured output: ``response_format`` ``json_schema`` with ``strict: true`` and the wire schema of
:mod:`airflow_plan_provider.planners.llm_prompt` (params as a JSON-encoded string, since strict mode
cannot express a free-form object; that keeps the guarantee of a well-formed reply without loosening
the rest of the schema, which ``strict: false`` would). When the endpoint rejects ``json_schema``
(HTTP 400 about ``response_format``) the planner falls back to ``json_object`` for that call and every
later one, and from ``json_object`` to no ``response_format``.

Failures: the ``openai`` client retries 408/409/429/5xx, timeouts and connection errors with backoff
(``max_retries``, honouring ``Retry-After``); ``timeout`` bounds each HTTP attempt and
``planning_timeout`` the whole :meth:`~LLMPlanner.plan` call. When they are spent, the planner raises
:class:`PlanningError` with reason ``planner_unavailable``, naming the endpoint, model and status.

Replies are untrusted bytes. The planner reads the HTTP body itself
(:func:`~airflow_plan_provider.planners.llm_reply.read_completion`) rather than through the client's
models, so every shape ends as a :class:`PlannerReply` or a :class:`PlanningError`: a body that is not
a JSON object, or ``choices``/``message``/``content`` of the wrong type, raise ``planner_unavailable``
naming what is wrong ("reply is not JSON", "choices is not a list", ...); token counts that are not
non-negative integers are left out of the usage (unknown) and the plan is kept.

The API key is registered with Airflow's secrets masker when it is read, and every message built from
the endpoint's words (HTTP error bodies, refusals, excerpts of malformed replies) goes through
:func:`~airflow_plan_provider.hooks.llm.redact`, which removes the key, and any 8+ character piece of
it, before the text is cut to length.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from airflow_plan_provider.exceptions import PlanningError
from airflow_plan_provider.hooks.llm import LLMSettings, PlanLLMHook, mask_key, redact, resolve_api_key
from airflow_plan_provider.planners.base import PlannerReply, PlanRequest
from airflow_plan_provider.planners.llm_prompt import build_messages, wire_schema
from airflow_plan_provider.planners.llm_reply import MalformedReply, read_completion

if TYPE_CHECKING:  # the openai client (hundreds of modules) is imported when a plan is asked for, not
    # by a DAG file that names the planner (every task of the DAG parses it)
    import openai
    from openai.types.chat import ChatCompletionMessageParam
    from openai.types.chat.completion_create_params import ResponseFormat

log = logging.getLogger(__name__)

DEFAULT_CONN_ID = PlanLLMHook.default_conn_name
FORMATS = ("json_schema", "json_object", "text")
_RETRIED_STATUSES = (408, 409, 429)
T = TypeVar("T")


class _DeadlineExceeded(Exception):
    pass


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


def _endpoint_words(error: openai.APIStatusError) -> str:
    """What the endpoint said about an HTTP error: its JSON error message, else its text body.

    Not yet redacted; only strings are taken from the body, so no hostile structure is ever turned
    into text.
    """
    body: Any = error.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        body = inner.get("message") if isinstance(inner, dict) else inner
    if isinstance(body, str) and body.strip():
        return body
    return str(error.message)


def _rejects_response_format(error: openai.BadRequestError) -> bool:
    param = error.body.get("param") if isinstance(error.body, dict) else None
    text = f"{_endpoint_words(error)[:4000]} {param if isinstance(param, str) else ''}".lower()
    return "response_format" in text or "json_schema" in text or "response format" in text


class LLMPlanner:
    """Plans with an LLM through the ``openai`` client.

    Give ``base_url`` and/or ``api_key`` (and ``model``) to skip the Airflow connection; otherwise
    ``conn_id`` names a ``plan_llm`` connection (see :mod:`airflow_plan_provider.hooks.llm`), and
    ``model`` overrides the connection's ``extra.model``.

    :param model: the model to ask; overrides the connection's ``extra.model``.
    :param base_url: an OpenAI-compatible endpoint (``.../v1``); with ``api_key``, instead of a connection.
    :param api_key: the endpoint's key (registered with the secrets masker); without it and without a
        connection, ``OPENAI_API_KEY``.
    :param conn_id: the connection read when neither ``base_url`` nor ``api_key`` is given.
    :param temperature: sampling temperature of every call.
    :param max_retries: retries of one call by the ``openai`` client (timeouts, connection errors, 408,
        409, 429, 5xx), ``>= 0``.
    :param timeout: seconds one HTTP attempt may take, ``> 0``.
    :param planning_timeout: seconds one :meth:`plan` call may take with its retries, ``> 0``.
    :param structured_output: ask for ``response_format`` ``json_schema`` first (falls back when the
        endpoint rejects it); ``False`` starts at ``json_object``.
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
        mask_key(api_key)
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
            mask_key(settings.api_key)  # the key may come from OPENAI_API_KEY
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
        import openai

        client, settings = self._connect()
        endpoint = str(client.base_url).rstrip("/")
        messages = cast("list[ChatCompletionMessageParam]", build_messages(request))
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
                body, content_type = self._complete(client, settings, request, messages, deadline)
                break
            except openai.BadRequestError as error:
                if self._format + 1 < len(FORMATS) and _rejects_response_format(error):
                    log.warning(
                        "%s rejected response_format %s (%s); using %s from now on",
                        endpoint,
                        self.response_format,
                        self._redact(_endpoint_words(error)),
                        FORMATS[self._format + 1],
                    )
                    self._format += 1
                    continue
                raise self._unavailable(error, endpoint, settings) from None
            except Exception as error:  # the client's own errors, and anything a hostile reply provokes
                raise self._unavailable(error, endpoint, settings) from None
        try:
            reply = read_completion(body, content_type)
        except MalformedReply as error:
            raise self._malformed(error, endpoint, settings) from None
        if reply.usage:
            log.info("LLM planner usage: %s", reply.usage)
        return reply

    def _complete(
        self,
        client: openai.OpenAI,
        settings: LLMSettings,
        request: PlanRequest,
        messages: list[ChatCompletionMessageParam],
        deadline: float,
    ) -> tuple[bytes, str]:
        """Body and content type of one completion call's HTTP response (status 200: the client
        raises for any other, after its own retries); the body is read here, not by the client."""
        import openai

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

        def call() -> tuple[bytes, str]:
            response = client.chat.completions.with_raw_response.create(
                model=model,
                messages=messages,
                temperature=self.temperature,
                response_format=response_format,
                stream=False,
                timeout=min(self.timeout, remaining),
            )
            return response.content, response.headers.get("content-type", "")

        return _run_until(deadline, call)

    # --- errors -------------------------------------------------------------------------------
    def _redact(self, text: str, limit: int = 300) -> str:
        """Endpoint text fit for an error or a log line: the key removed first, then cut to ``limit``."""
        return redact(text, self._settings.api_key if self._settings else self._api_key, limit)

    def _malformed(self, error: MalformedReply, endpoint: str, settings: LLMSettings) -> PlanningError:
        if error.refused:
            message = f"the model refused to plan: {self._redact(error.text, 500)}"
            reason = "no_plan"
        else:
            excerpt = f": {self._redact(error.text, 120)!r}" if error.text else ""
            message = (
                f"LLM planner unavailable: {endpoint} (model {settings.model!r}) sent a malformed reply: "
                f"{error.what}{excerpt}"
            )
            reason = "planner_unavailable"
        message = self._redact(message, 2000)
        log.warning("%s", message)
        return PlanningError(message, reason=reason, usage=[error.usage] if error.usage else [])

    def _unavailable(self, error: BaseException, endpoint: str, settings: LLMSettings) -> PlanningError:
        import openai

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
            what = f"HTTP {status}: {self._redact(_endpoint_words(error))}{again}"
        else:
            what = f"{type(error).__name__}: {self._redact(_safe_str(error))}"
        message = self._redact(
            f"LLM planner unavailable: {endpoint} (model {settings.model!r}): {what}", 2000
        )
        log.warning("%s", message)
        return PlanningError(message, reason="planner_unavailable")


def _safe_str(error: BaseException) -> str:
    try:
        return str(error)
    except Exception:  # a hostile value inside the error may not even turn into text
        return "(no text)"
