"""The Airflow connection of the LLM planner: an OpenAI-compatible chat-completions endpoint.

Connection fields (conn type ``plan_llm``, default conn id ``plan_llm_default``):

* host: the base url, e.g. ``https://api.openai.com/v1``. A bare host name is completed with the
  schema field as the scheme (default ``https``), the port, and ``/v1`` when it has no path.
* password: the API key. Without one, ``OPENAI_API_KEY`` is used, else a placeholder (for local
  servers that need no key).
* extra: ``{"model": "gpt-4o-mini", "organization": "org-...", "project": "proj_..."}``.

The connection form's labels, hidden fields, placeholders and the Model / Organization / Project
fields are declared in the provider info (``ui-field-behaviour`` and ``conn-fields`` of the
``plan_llm`` connection type), where Airflow 3.2 and later read them without importing this hook;
Airflow 3.1 asks :meth:`PlanLLMHook.get_ui_field_behaviour` (no Model / Organization / Project fields
there: they are keys of the Extra JSON).

The key is registered with Airflow's secrets masker as soon as it is read (:func:`mask_key`), so task
logs hide it; every message built from what the endpoint sent goes through :func:`redact` as well,
which removes any piece of the key of 8 or more characters before the text is cut to length.

Why a conn type of our own rather than ``openai`` from apache-airflow-providers-openai: that provider
is not a dependency, and adding it would install a package (with its own pins on ``openai``) only to
borrow one connection type; registering ``openai`` ourselves would clash with that provider's
registration whenever both are installed. The field layout is the same as that provider's (host is
the base url, password the API key, ``extra.openai_client_kwargs`` is read for ``base_url``,
``organization`` and ``project``), so ``conn_id`` may also name an existing ``openai`` connection;
only the model has to be added to its extra (or given to the planner).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook

from airflow_plan_provider.compat import mask_secret

if TYPE_CHECKING:  # openai is imported when a client is made, not when a DAG file names the planner
    import openai
    from airflow.sdk import Connection

NO_KEY = "no-key"  # sent when neither the connection nor the environment holds a key
LEAK = 8  # a piece of the key this long (or longer) is a leak; a shorter key is redacted whole
REDACTED = "***"


@dataclass(frozen=True)
class LLMSettings:
    """Where and how to reach the model. ``api_key`` is never part of the repr.

    :param base_url: the endpoint's base url, ``None`` for the client's default (OpenAI).
    :param api_key: the key sent as the bearer token.
    :param model: the model to ask, ``None`` when the planner must name one.
    :param organization: the ``OpenAI-Organization`` header, if any.
    :param project: the ``OpenAI-Project`` header, if any.
    """

    base_url: str | None
    api_key: str = field(repr=False)
    model: str | None = None
    organization: str | None = None
    project: str | None = None

    def client(self, *, timeout: float = 60.0, max_retries: int = 2) -> openai.OpenAI:
        import openai

        return openai.OpenAI(
            base_url=self.base_url,
            api_key=self.api_key,
            organization=self.organization,
            project=self.project,
            timeout=timeout,
            max_retries=max_retries,
        )


def resolve_api_key(key: str | None) -> str:
    return key or os.environ.get("OPENAI_API_KEY") or NO_KEY


def mask_key(key: str | None) -> None:
    """Register ``key`` with Airflow's secrets masker (task process and supervisor), unless it is none."""
    if key and key != NO_KEY:
        mask_secret(key)


def _key_spans(text: str, key: str) -> list[tuple[int, int]]:
    """Merged ``(start, end)`` spans of ``text`` covered by some ``LEAK``-character piece of ``key``."""
    if len(key) < LEAK:
        spans, start = [], text.find(key)
        while start >= 0:
            spans.append((start, start + len(key)))
            start = text.find(key, start + len(key))
        return spans
    pieces = {key[i : i + LEAK] for i in range(len(key) - LEAK + 1)}
    merged: list[tuple[int, int]] = []
    for start in range(len(text) - LEAK + 1):
        if text[start : start + LEAK] in pieces:
            if merged and merged[-1][1] >= start:
                merged[-1] = (merged[-1][0], start + LEAK)
            else:
                merged.append((start, start + LEAK))
    return merged


def redact(text: str, key: str | None, limit: int = 300) -> str:
    """``text`` fit for an error, a log line or a warning: at most ``limit`` characters, without the key.

    Every run of ``LEAK`` (8) or more characters that also occurs in ``key`` (every occurrence of a
    shorter key) becomes ``***`` *before* the text is cut, so a cut can never leave part of the key
    behind; a cut text ends with ``...[N chars, cut]``. Only the first ``2 * limit + len(key)``
    characters are looked at, so a huge text costs no more than a short one.

    >>> redact("denied for sk-abcdefghijklmnop (ends in ...ijklmnop)", "sk-abcdefghijklmnop")
    'denied for *** (ends in ...***)'
    """
    size = len(text)
    secret = key if key and key != NO_KEY else ""
    head = text[: 2 * limit + len(secret)]
    if secret:
        parts, last = [], 0
        for start, end in _key_spans(head, secret):
            parts += [head[last:start], REDACTED]
            last = end
        head = "".join(parts) + head[last:]
    if len(head) > limit or size > 2 * limit + len(secret):
        return f"{head[:limit]}...[{size} chars, cut]"
    return head


def base_url_from(host: str | None, scheme: str | None = None, port: int | None = None) -> str | None:
    """The base url a connection's host (and schema, port) name; ``None`` for the client default."""
    host = (host or "").strip()
    if not host:
        return None
    if "://" in host:
        return host.rstrip("/")
    name, _, path = host.partition("/")
    netloc = f"{name}:{port}" if port else name
    return f"{scheme or 'https'}://{netloc}/{path.strip('/') or 'v1'}"


def settings_from_connection(conn: Connection) -> LLMSettings:
    extra: dict[str, Any] = dict(conn.extra_dejson or {})
    client_kwargs: dict[str, Any] = dict(extra.get("openai_client_kwargs") or {})
    return LLMSettings(
        base_url=base_url_from(conn.host or client_kwargs.get("base_url"), conn.schema, conn.port),
        api_key=resolve_api_key(conn.password or client_kwargs.get("api_key")),
        model=extra.get("model") or None,
        organization=extra.get("organization") or client_kwargs.get("organization") or None,
        project=extra.get("project") or client_kwargs.get("project") or None,
    )


def missing_connection_help(conn_id: str) -> str:
    """What to do when connection ``conn_id`` is not defined: the command, the UI page and the
    environment variable that each define it."""
    extra = json.dumps({"model": "gpt-4o-mini"})
    variable = "AIRFLOW_CONN_" + re.sub(r"\W", "_", conn_id).upper()
    value = json.dumps(
        {
            "conn_type": "plan_llm",
            "host": "https://api.openai.com/v1",
            "password": "<API key>",
            "extra": {"model": "gpt-4o-mini"},
        }
    )
    return (
        f"The conn_id `{conn_id}` isn't defined. Define it in one of three ways (any OpenAI-compatible "
        f"base URL; the model is the one the planner asks for):\n"
        f"  airflow connections add {shlex.quote(conn_id)} --conn-type plan_llm "
        f"--conn-host https://api.openai.com/v1 --conn-password '<API key>' --conn-extra '{extra}'\n"
        f"  or in the UI: Admin > Connections > Add Connection, Connection Id {conn_id}, Connection Type "
        f'"{PlanLLMHook.hook_name}", Base URL, API key and Model\n'
        f"  or in the environment of every Airflow component: {variable}='{value}'"
    )


class PlanLLMHook(BaseHook):
    """Reads a ``plan_llm`` connection and hands out an ``openai.OpenAI`` client for it.

    Nothing is looked up or sent until :meth:`get_conn`, :attr:`settings` or
    :meth:`test_connection` is called.

    :param llm_conn_id: the connection to read: a ``plan_llm`` connection, or an ``openai`` one with
        ``model`` in its extra.
    :param timeout: seconds one HTTP attempt of the client may take.
    :param max_retries: how many times the client retries a timeout, a connection error, 408, 409, 429
        and 5xx (with backoff, honouring ``Retry-After``).
    """

    conn_name_attr = "llm_conn_id"
    default_conn_name = "plan_llm_default"
    conn_type = "plan_llm"
    hook_name = "Plan LLM (OpenAI-compatible)"

    def __init__(
        self, llm_conn_id: str = default_conn_name, *, timeout: float = 60.0, max_retries: int = 2
    ) -> None:
        super().__init__()
        self.llm_conn_id = llm_conn_id
        self.timeout = timeout
        self.max_retries = max_retries
        self._client: openai.OpenAI | None = None

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """The connection form's labels, hidden fields and placeholders, for an Airflow that asks the hook
        (3.1); later ones read the same from the provider info, with the Model / Organization / Project
        fields (on 3.1 those are keys of the Extra JSON). The hook's form spells the keys with
        underscores (``hidden_fields``), the provider info with dashes (``hidden-fields``)."""
        from airflow_plan_provider.provider_info import LLM_FIELD_BEHAVIOUR

        return {key.replace("-", "_"): value for key, value in LLM_FIELD_BEHAVIOUR.items()}

    @cached_property
    def settings(self) -> LLMSettings:
        """The connection's settings; reading them registers the key with the secrets masker. A connection
        that is not defined raises Airflow's error, its message saying how to define it."""
        try:
            connection = self.get_connection(self.llm_conn_id)
        except Exception as error:
            if type(error).__name__ != "AirflowNotFoundException":
                raise
            raise type(error)(missing_connection_help(self.llm_conn_id)) from None
        settings = settings_from_connection(connection)
        mask_key(settings.api_key)
        return settings

    def get_conn(self) -> openai.OpenAI:
        """The client for this connection (created once per hook)."""
        if self._client is None:
            self._client = self.settings.client(timeout=self.timeout, max_retries=self.max_retries)
        return self._client

    def test_connection(self) -> tuple[bool, str]:
        """List the endpoint's models (``GET /models`` spends no tokens) and look for the configured one."""
        try:
            settings = self.settings
            client = self.get_conn().with_options(max_retries=0, timeout=min(self.timeout, 15.0))
            models = [model.id for model in client.models.list()]
        except Exception as error:
            key = self.settings.api_key if "settings" in self.__dict__ else None
            return False, f"{type(error).__name__}: {redact(str(error), key, 500)}"
        where = settings.base_url or "the default OpenAI endpoint"
        if settings.model and models and settings.model not in models:
            return False, f"{where} does not list model {settings.model!r} (it lists {len(models)} model(s))"
        if not settings.model:
            return True, f"reached {where}; no model set in the connection extra (the planner must name one)"
        return True, f"reached {where}; model {settings.model!r} is available"
